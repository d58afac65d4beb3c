"""Time the tensor-core GEMM tiles against cuBLAS on the GPU: TFLOP/s and ratios, same run.

  fp16   M=N=K=4096: gemm_f16 (each --f16-tiles variant) and gemm_wgmma (each --wgmma tile) vs
         Cublas.gemm_f16 (target >= 0.8x).
  quant  M=512, N=4096, K=14336 per --types: gemm_quant (dequantize in shared memory, each --bm) and
         gemm_wgmma_quant (unless --wgmma "")
         vs the fallback that gpu/linear.py's MatMul.linear runs for T > 8 -- dequant to fp16, then
         cuBLAS -- timed as the pair (target >= 250 TFLOP/s); cuBLAS alone on the fp16 weight too.
Inputs are Gaussian (std 1), weights random blocks with finite scales, rotated over enough copies
to exceed 2x the 50 MB L2. Each call sits between its own pair of CUDA events on one stream,
queued behind a sleeping kernel so host launch cost stays off the clock; after a warm-up (compile,
module load, cuBLAS heuristics) the median of --reps is reported. Outputs are checked against the
baseline's (max |diff| / max |ref| < 1e-2) so nothing fast-but-wrong is reported.
    python scripts/bench_gemm.py [--reps 50] [--types Q8_0,Q4_K] [--f16-tiles 128x128x4,64x128x4]
                                 [--wgmma n256s4] [--bm 128,64] [--no-f16] [--f16-shape MxNxK] [--quant-shape MxNxK]
                                 [--json PATH]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402
from numba import cuda  # noqa: E402

from impnb.gpu.context import GpuContext  # noqa: E402
from impnb.gpu.cublas_gemm import Cublas  # noqa: E402
from impnb.kernels.gemm.dequant import dequant  # noqa: E402
from impnb.kernels.gemm.gemm_tc import gemm_f16  # noqa: E402
from impnb.kernels.gemm.gemm_wgmma import TILES as WG_TILES, gemm_wgmma  # noqa: E402
from impnb.kernels.gemm.gemm_wgmma_quant import gemm_wgmma_quant  # noqa: E402
from impnb.kernels.gemm.gemm_tc_quant import gemm_quant  # noqa: E402
from impnb.kernels.common.ptx import SIM  # noqa: E402
from impnb.kernels.common.repack import repack  # noqa: E402

L2_BYTES = 50e6
CUBLAS_MEASURED = 752.0  # TFLOP/s, cuBLAS fp16 4096^3 as measured on the H100
F16_TARGET_RATIO = 0.8
QUANT_TARGET = 250.0  # TFLOP/s
SCALES = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,),
          T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}  # fp16 scale fields


@cuda.jit
def _sleep(ms):
    for _ in range(ms):
        cuda.nanosleep(1000000)  # at most ~1 ms each


def random_weight(t, rows, cols, rng):
    block, size = GGML_QUANT_SIZES[t]
    blocks = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for off in SCALES[t]:
        d = (rng.standard_normal(len(blocks)) * 0.02).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def n_copies(nbytes):
    return max(2, int(np.ceil(2 * L2_BYTES / nbytes)))


def time_calls(call, copies, reps, stream):
    """Median microseconds of call(i) (i = 0..reps-1), each between its own events."""
    for i in range(2 * copies + 2):  # warm up
        call(i)
    stream.synchronize()
    starts = [cuda.event() for _ in range(reps)]
    ends = [cuda.event() for _ in range(reps)]
    if not SIM:  # (the simulator has no nanosleep)
        _sleep[1, 1, stream](max(20, reps * 2))  # the queue fills while the GPU sleeps
    for i in range(reps):
        starts[i].record(stream)
        call(i)
        ends[i].record(stream)
    stream.synchronize()
    return float(np.median([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]))


def agree(got, ref, what):
    got, ref = got.copy_to_host(), ref.copy_to_host()
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    rel = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    assert rel < 1e-2, f"{what}: max |diff| / max |ref| = {rel:.2e} against the baseline"
    return rel


def row(case, impl, M, N, K, us, base_us=None, target=None, rel=None):
    tflops = 2 * M * N * K / (us * 1e-6) / 1e12
    return {"case": case, "impl": impl, "M": M, "N": N, "K": K, "median_us": us, "tflops": tflops,
            "ratio_to_baseline": None if base_us is None else base_us / us, "target": target,
            "max_rel_diff": rel}


def bench_f16(ctx, cublas, tiles, wg_tiles, reps, rng, shape=(4096, 4096, 4096)):
    M, N, K = shape
    s = ctx.nb_stream
    pairs = [(ctx.upload(rng.standard_normal((M, K), dtype=np.float32).astype(np.float16)),
              ctx.upload(rng.standard_normal((N, K), dtype=np.float32).astype(np.float16)))
             for _ in range(n_copies(2 * M * K * 2))]
    c_ref = ctx.upload(np.full((M, N), np.nan, np.float32))
    c = ctx.upload(np.full((M, N), np.nan, np.float32))
    base = time_calls(lambda i: cublas.gemm_f16(*pairs[i % len(pairs)], c_ref), len(pairs), reps, s)
    case = f"fp16 {M}x{N}x{K}"
    out = [row(case, "cuBLAS", M, N, K, base, base)]
    for tile in tiles:
        us = time_calls(lambda i: gemm_f16(*pairs[i % len(pairs)], c, s, tile=tile), len(pairs), reps, s)
        cublas.gemm_f16(*pairs[0], c_ref)
        gemm_f16(*pairs[0], c, s, tile=tile)
        rel = agree(c, c_ref, f"gemm_f16 {tile}")
        out.append(row(case, f"tiles {tile[0]}x{tile[1]} {tile[4]}-stage", M, N, K, us, base,
                       f">= {F16_TARGET_RATIO}x cuBLAS", rel))
    for name in wg_tiles:
        us = time_calls(lambda i: gemm_wgmma(*pairs[i % len(pairs)], c, s, tile=name), len(pairs), reps, s)
        cublas.gemm_f16(*pairs[0], c_ref)
        gemm_wgmma(*pairs[0], c, s, tile=name)
        rel = agree(c, c_ref, f"gemm_wgmma {name}")
        out.append(row(case, f"wgmma {name}", M, N, K, us, base, f">= {F16_TARGET_RATIO}x cuBLAS", rel))
    return out


def bench_quant(ctx, cublas, t, bms, wgmma, reps, rng, shape=(512, 4096, 14336)):
    M, N, K = shape
    s = ctx.nb_stream
    case = f"{t.name} {M}x{N}x{K}"
    one = repack(random_weight(t, N, K, rng), t)
    weights = [one.to_device(s)] + [repack(random_weight(t, N, K, rng), t).to_device(s)
                                    for _ in range(n_copies(one.nbytes) - 1)]
    a = ctx.upload(rng.standard_normal((M, K), dtype=np.float32).astype(np.float16))
    w16 = ctx.empty((N, K), np.float16)
    c_ref = ctx.upload(np.full((M, N), np.nan, np.float32))
    c = ctx.upload(np.full((M, N), np.nan, np.float32))

    def fallback(i):
        dequant(weights[i % len(weights)], w16, s)
        cublas.gemm_f16(a, w16, c_ref)

    base = time_calls(fallback, len(weights), reps, s)
    out = [row(case, "dequant + cuBLAS", M, N, K, base, base)]
    dequant(weights[0], w16, s)
    only = time_calls(lambda i: cublas.gemm_f16(a, w16, c_ref), 1, reps, s)
    out.append(row(case, "cuBLAS on fp16 W (no dequant)", M, N, K, only, base))
    for bm in bms:
        us = time_calls(lambda i: gemm_quant(a, weights[i % len(weights)], c, s, bm=bm), len(weights), reps, s)
        fallback(0)
        gemm_quant(a, weights[0], c, s, bm=bm)
        rel = agree(c, c_ref, f"gemm_quant {t.name} bm={bm}")
        out.append(row(case, f"tiles {bm}x128 dequant in smem", M, N, K, us, base, f">= {QUANT_TARGET} TFLOP/s", rel))
    if wgmma:
        us = time_calls(lambda i: gemm_wgmma_quant(a, weights[i % len(weights)], c, s), len(weights), reps, s)
        fallback(0)
        gemm_wgmma_quant(a, weights[0], c, s)
        rel = agree(c, c_ref, f"gemm_wgmma_quant {t.name}")
        out.append(row(case, "wgmma 128x128 dequant in smem", M, N, K, us, base, f">= {QUANT_TARGET} TFLOP/s", rel))
    return out


def dims(spec):
    return tuple(int(v) for v in spec.lower().split("x"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--types", default="Q8_0,Q4_K")
    ap.add_argument("--f16-tiles", default="128x128x4,128x128x3,64x128x4",
                    help="bm x bn x stages of gemm_f16 variants (8 warps, 2 x 4)")
    ap.add_argument("--wgmma", default=",".join(WG_TILES), help="gemm_wgmma TILES to time (empty: none)")
    ap.add_argument("--bm", default="128,64", help="M tile of gemm_quant")
    ap.add_argument("--no-f16", action="store_true")
    ap.add_argument("--f16-shape", default="4096x4096x4096", help="M x N x K")
    ap.add_argument("--quant-shape", default="512x4096x14336", help="M x N x K")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    tiles = [(bm, bn, 2, 4, st) for bm, bn, st in
             (tuple(int(v) for v in spec.split("x")) for spec in args.f16_tiles.split(","))]
    bms = [int(v) for v in args.bm.split(",")]
    rng = np.random.default_rng(0)
    ctx = GpuContext()
    cublas = Cublas(ctx)
    results = []
    if not args.no_f16:
        results += bench_f16(ctx, cublas, tiles, [t for t in args.wgmma.split(",") if t], args.reps, rng,
                             dims(args.f16_shape))
    for name in args.types.split(","):
        if name:
            results += bench_quant(ctx, cublas, T[name], bms, bool(args.wgmma), args.reps, rng,
                                   dims(args.quant_shape))
    cublas.close()
    print(f"\n{'case':24} {'impl':34} {'median us':>10} {'TFLOP/s':>8} {'x base':>7}  target")
    for r in results:
        ratio = "" if r["ratio_to_baseline"] is None else f"{r['ratio_to_baseline']:.3f}"
        print(f"{r['case']:24} {r['impl']:34} {r['median_us']:10.1f} {r['tflops']:8.1f} {ratio:>7}  "
              f"{r['target'] or ''}")
    if args.json:
        name = getattr(cuda.get_current_device(), "name", "numba simulator")
        Path(args.json).write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "device": name.decode() if isinstance(name, bytes) else name,
            "cublas_measured_tflops": CUBLAS_MEASURED, "results": results}, indent=1))


if __name__ == "__main__":
    main()
