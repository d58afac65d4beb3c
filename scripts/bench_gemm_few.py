"""The few-row GEMMs (kernels/gemm/gemm_few.py, "few"; kernels/gemm/gemm_mmq.py, "mmq", its x
quantization included; kernels/gemm/gemm_wgmma_few.py, "wgf", at each --ahead; kernels/gemm/gemm_wgmma_rs.py,
"wrs" staged 6 deep, "wrs3" / "wrs4" 3 / 4 deep (Q4_K; Q6_K 3 deep in all), A permuted to its order;
"mmqr": mmq with its W through the cp.async ring, Q4_K, at each --mmqr-variants) at a model's
shapes over split counts (splits_for's times each scale): µs per call (the split reduce included)
rotating over all layers' copies in one CUDA graph (tune_gemm's timing), and the weight's GB/s at the best; a variant whose output differs from the
shape's first variant's is flagged.
    python scripts/bench_gemm_few.py -m MODEL [--rows 8,16,32,64,128] [--split-scale 0.5,1,2] [--kernels few,mmq,wgf] [--ahead 1,4] [--f16x2 0,1]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb.gguf_file import open_model_file  # noqa: E402
from impnb.gpu.model import DeviceModel  # noqa: E402
from impnb.graphs.timing import graph_us  # noqa: E402
from impnb.kernels.gemm import (gemm_few, gemm_mmq, gemm_wgmma_few, gemm_wgmma_rs, gemm_wgmma_rs_block,  # noqa: E402
                                quant_x32)
from impnb.kernels.gemv import gemv_stream  # noqa: E402
from impnb.model_registry import resolve_model  # noqa: E402
from scripts.tune_gemm import weights_by_shape  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--rows", default="16,32,64,128")
    ap.add_argument("--split-scale", default="0.5,1,2")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--kernels", default="few,mmq,wgf")
    ap.add_argument("--ahead", default="0", help="wgf: raw W steps in flight to time (1, 4; 0 the kernel's rule)")
    ap.add_argument("--f16x2", default=str(int(gemm_wgmma_few.F16X2)), help="wgf: W decoded on f16x2 (1) or exactly (0)")
    ap.add_argument("--mmq-variants", default="0,1,2,4,2:0,4:168,0:-1:1,0:-1:2",
                    help="the int8 GEMM's token tiles a block (0 ni_for's)[:register cap, 0 none, -1 REGS's"
                         "[:W m16 tiles a warp, 0 mt_for's]] to time")
    ap.add_argument("--mmqr-variants", default="0,2:128:2,0:-1:1",
                    help="mmqr (the int8 GEMM with its W ring): as --mmq-variants")
    ap.add_argument("--shapes", help="only these shapes (TYPE NxK, comma-separated)")
    args = ap.parse_args()
    m = DeviceModel(open_model_file(resolve_model(args.model)), 1024)
    sms = gemv_stream.sm_count()
    groups, _ = weights_by_shape(m)
    for (t, N, K), ws in groups.items():
        if args.shapes and f"{t.name} {N}x{K}" not in args.shapes.split(","):
            continue
        for name in args.kernels.split(","):
            mod = {"few": gemm_few, "mmq": gemm_mmq, "mmqr": gemm_mmq, "wgf": gemm_wgmma_few, "wrs": gemm_wgmma_rs, "wrs3": gemm_wgmma_rs, "wrs4": gemm_wgmma_rs}[name]
            if not mod.supports(t, K):
                continue
            for M in map(int, args.rows.split(",")):
                bench_shape(m, name, mod, t, N, K, M, ws, sms, args)
    return 0


_FIRST = {}  # (type, N, K, M, family) -> the first variant's output


def bench_shape(m, name, mod, t, N, K, M, ws, sms, args) -> None:
    # the same x for every kernel and variant of a shape: each output is checked against the first's
    x = m.ctx.upload(np.random.default_rng([M, K]).standard_normal((M, K)).astype(np.float32))
    h16 = np.random.default_rng(1).standard_normal((M, K)).astype(np.float16)
    x16 = m.ctx.upload(h16)
    x16p = m.ctx.upload(gemm_wgmma_rs_block.permute_a(h16))
    xq = quant_x32.quant_x32_buffers(-(-M // 8) * 8 * 8, K)
    y = m.ctx.upload(np.full((M, N), np.nan, np.float32))
    variants = [(None, 0, 2)] if name in ("few", "wrs", "wrs3", "wrs4") else [(None, int(d), int(f)) for d in args.ahead.split(",")
                                                      for f in args.f16x2.split(",")] \
        if name == "wgf" else [
        tuple(int(f) for f in (v.split(":") + ["-1", "0"][v.count(":"):])[:3])
        for v in (args.mmqr_variants if name == "mmqr" else args.mmq_variants).split(",")]
    # the first variant's output: every other must match it (mmq's and mmqr's variants, one product)
    key = (t, N, K, M, "mmq" if name.startswith("mmq") else name)
    first = _FIRST.get(key)
    for ni, regs, mt in variants:
        if ni is not None and ni > -(-M // 8):
            continue
        S0 = gemm_mmq.splits_for(M, N, K, sms, mt or None, ggml_type=t, ring=name == "mmqr") if name.startswith("mmq") else mod.splits_for(M, N, K, sms=sms)
        unit = gemm_wgmma_few.BK if name == "wgf" else mod.GROUP
        row = []
        for S in sorted({max(1, min(K // unit, round(S0 * float(f))))
                         for f in args.split_scale.split(",")} | {S0}):
            part = m.ctx.upload(np.zeros((S, M, N), np.float32))

            def call(i, S=S, part=part):
                if name == "few":
                    gemm_few.gemm_few(x16, ws[i % len(ws)], y, part, m.ctx.nb_stream, S)
                elif name.startswith("wrs"):
                    gemm_wgmma_rs.gemm_wgmma_rs(x16p, ws[i % len(ws)], y, part, m.ctx.nb_stream, S,
                                                stages={"wrs": 6, "wrs3": 3, "wrs4": 4}[name])
                elif name == "wgf":
                    gemm_wgmma_few.gemm_wgmma_few(x16, ws[i % len(ws)], y, part, m.ctx.nb_stream, S, w_ahead=regs,
                                                  f16x2=bool(mt))
                else:
                    gemm_mmq.gemm_mmq(x, xq, ws[i % len(ws)], y, part, m.ctx.nb_stream, S, ni=ni,
                                      regs=None if regs < 0 else regs, mt=mt or None, ring=name == "mmqr")
            for i in range(len(ws)):
                call(i)
            m.ctx.sync()
            row.append((graph_us(m.ctx, lambda: [call(i) for i in range(args.reps)], args.reps), S))
        best = min(row)
        default = next(us for us, S in row if S == S0)
        y.copy_to_device(np.full((M, N), np.nan, np.float32))
        call(0)
        out = y.copy_to_host()
        first = _FIRST.setdefault(key, out)
        bad = not np.isfinite(out).all() or np.abs(out - first).max() > 1e-3 * max(np.abs(first).max(), 1e-30)
        tag = f"{name} a{regs} f16x2={mt}" if name == "wgf" else name if ni is None else f"{name} ni={ni}" + (f" r{regs}" if regs >= 0 else "") + (
            f" mt={mt}" if mt else "")
        print(f"{tag:<14} {t.name} {N}x{K} M={M:<4} default S={S0}: {default:7.1f} µs | best S={best[1]}: "
              f"{best[0]:7.1f} µs {ws[0].nbytes / best[0] / 1e3:6.0f} GB/s | "
              + " ".join(f"S{S}={us:.1f}" for us, S in row) + ("  MISMATCH with the first variant" if bad else ""),
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
