"""Measure the MoE prefill expert GEMMs on this GPU and write impnb/tuning/moe_table.json.

A synthetic model's experts (impnb/synthetic_full.py, synthetic_full_gemma4.py; by default
Qwen3-30B-A3B: E = 128, k = 8, D = 2048, F = 768; Q4_K_M: gate|up Q4_K stacked per expert as
DeviceModel stacks them, down Q6_K or Q4_K by layer), uniform random routing, and for each T
bucket (16..512 tokens) and each distinct expert matrix: the grouped tiles (gemm_grouped, as the
grouped layout runs it), the same tiles on wgmma (gemm_grouped_wgmma, where it takes the weight)
and the cuBLAS fallback (gpu/moe_prefill.expert_gemm: all E experts dequantized to fp16, the
pointer arrays, one batched GEMM; gate|up's time includes the gather into the padded layout)
and the int8 paths (moe_dispatch.INT8_PATHS: the grouped dp4a GEMV's variants and the grouped
int8 GEMM; gate|up with its SwiGLU, the time including its input's int8 quantization; checked as
SwiGLU of the tiles' gate|up).
--reps calls captured in a CUDA graph, warm-up first, median of 5 replays. A path other than the
tiles counts only if its output matches the tiles' (max |diff| / max |ref| < 1e-2) and beats the
best so far by more than 3%; the table records every measured bucket's choice, and runs on
several models or quants merge into it (--merge). Not charged to cuBLAS: the padded layout's
SwiGLU over max_tiles * BM rows instead of T * k (at T = 512: 12288 rows for 4096, ~110 MB more
traffic).
    python scripts/tune_moe.py [--model qwen3-30b-a3b] [--quant Q4_K_M] [--reps 10] [--buckets 512]
                               [--merge] [--out PATH] [--json PATH]
"""

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb import synthetic_full as sf, synthetic_full_gemma4 as sfg  # noqa: E402
from impnb.gpu import gemv_dispatch, moe_dispatch as md  # noqa: E402
from impnb.gpu.buffers import Arena  # noqa: E402
from impnb.gpu.context import GpuContext  # noqa: E402
from impnb.gpu.cublas_gemm import Cublas  # noqa: E402
from impnb.gpu.moe_prefill import expert_gemm  # noqa: E402
from impnb.kernels.elementwise.activations import swiglu_ref  # noqa: E402
from impnb.kernels.gemv.gemv import SILU  # noqa: E402
from impnb.kernels.gemm.quant_x32 import quant_x32_buffers, quantize_x32  # noqa: E402
from impnb.kernels.gemv.gemv_dp4a_multi import gemv_dp4a_grouped  # noqa: E402
from impnb.kernels.moe.gemm_mmq_grouped import gemm_mmq_grouped, supports as mmq_supports  # noqa: E402
from impnb.kernels.gemv.quant_x import quant_x_buffers, quantize_x  # noqa: E402
from impnb.graphs.timing import graph_us  # noqa: E402
from impnb.kernels.common import repack  # noqa: E402
from impnb.kernels.moe.gemm_grouped import BM, gemm_grouped  # noqa: E402
from impnb.kernels.moe.gemm_grouped_wgmma import gemm_grouped_wgmma, supports  # noqa: E402
from impnb.kernels.moe.moe import max_tiles, moe_group  # noqa: E402
from impnb.kernels.moe.moe_batched import moe_gather  # noqa: E402

MODEL = "qwen3-30b-a3b"
SHAPES = {name: (module, shape) for module in (sf, sfg) for name, shape in module.SHAPES.items()
          if shape.num_experts}  # model -> (its synthetic writer, shape)
MARGIN = 1.03


def top_k(shape) -> int:
    """Experts a token (the qwen shapes' num_experts_per_tok, gemma4's top_k_experts)."""
    return shape.top_k_experts if hasattr(shape, "top_k_experts") else shape.num_experts_per_tok


def expert_matrices(dev, quant: str, seed: int = 0, model: str = MODEL) -> dict:
    """{(name, type, N, K): PackedWeight (E * N, K)} for each distinct expert matrix of the model's
    layers: ffn_gate_up_exps (gate and up stacked per expert, as gemma4's file holds them) and
    ffn_down_exps."""
    module, shape = SHAPES[model]
    specs = {s.name: (i, s) for i, s in enumerate(module.tensor_specs(shape, quant))}
    E = shape.num_experts
    out = {}
    for il in range(shape.num_hidden_layers):
        p = f"blk.{il}."
        stacked = p + "ffn_gate_up_exps.weight" in specs
        gate_up = ("ffn_gate_up_exps",) if stacked else ("ffn_gate_exps", "ffn_up_exps")
        for name, parts in (("ffn_gate_up_exps", gate_up), ("ffn_down_exps", ("ffn_down_exps",))):
            indexed = [specs[p + n + ".weight"] for n in parts]
            spec = indexed[0][1]
            key = (name, spec.ggml_type, spec.shape[1] * len(parts), spec.shape[2])  # per expert N, K
            if key not in out:
                data = np.concatenate([sf.tensor_data(sp, seed, i) for i, sp in indexed], axis=-2)
                out[key] = repack.repack(data.reshape(E * key[2], -1), spec.ggml_type).to_device(dev.ctx.nb_stream)
    return out


def time_calls(dev, fn, reps: int) -> float:
    """GPU µs per call of fn: `reps` calls captured into one CUDA graph, replayed 6 times, the
    median of the last 5 / reps."""
    fn()  # warm-up: compile, module load, scratch buffers
    dev.ctx.sync()
    return graph_us(dev.ctx, lambda: [fn() for _ in range(reps)], reps)


def measure(dev, rng, mats: dict, T: int, reps: int, model: str = MODEL) -> list[dict]:
    """Per matrix at T tokens: µs of each path, the outputs' disagreement with the tiles', the choice."""
    shape = SHAPES[model][1]
    E, k, D = shape.num_experts, top_k(shape), shape.hidden_size
    S, n_max = T * k, max_tiles(T * k, E, BM)
    ctx, a, s = dev.ctx, dev.arena, dev.ctx.nb_stream
    slots = ctx.upload(np.argsort(rng.random((T, E)), axis=1)[:, :k].astype(np.int32).reshape(-1))
    order, slot_row = ctx.empty(S, np.int32), ctx.empty(S, np.int32)
    tiles, n_tiles = ctx.empty((n_max, 3), np.int32), ctx.empty(1, np.int32)
    moe_group(slots, E, BM, order, slot_row, tiles, n_tiles, s)
    x16 = ctx.upload((rng.standard_normal((T, D))).astype(np.float16))
    xg, tiles_pad = ctx.empty((n_max * BM, D), np.float16), ctx.empty((n_max, 3), np.int32)
    rows_pad = ctx.empty(S, np.int32)
    moe_gather(x16, order, tiles, n_tiles, k, xg, tiles_pad, rows_pad, s)
    ctx.sync()
    order_h, slot_row_h, rows_pad_h = order.copy_to_host(), slot_row.copy_to_host(), rows_pad.copy_to_host()
    h32 = ctx.upload(x16.copy_to_host().astype(np.float32))
    gemv_tiles = {}  # tokens a tile -> the GEMV paths' (tiles, n_tiles); the grouped order is the same
    for tm in md.GEMV_TOKENS:
        gemv_tiles[tm] = (ctx.empty((max_tiles(S, E, tm), 3), np.int32), ctx.empty(1, np.int32))
        moe_group(slots, E, tm, ctx.empty(S, np.int32), ctx.empty(S, np.int32), *gemv_tiles[tm], s)
    w16 = a.get("moe_w16", (max(w.rows * w.cols for w in mats.values()),), np.float16)
    out = []
    for (name, t, N, K), w in mats.items():
        if name == "ffn_gate_up_exps":  # the grouped layout's A: the tokens' rows, gathered by the tile
            a_grouped, a_padded, x_div, a32 = x16, xg, k, h32
            gather = [lambda: moe_gather(x16, order, tiles, n_tiles, k, xg, tiles_pad, rows_pad, s)]
        else:  # act (F wide) in expert order, and the same rows in the padded layout
            act = (rng.standard_normal((S, K)) * 0.1).astype(np.float16)
            pad = np.zeros((n_max * BM, K), np.float16)
            pad[rows_pad_h] = act
            a_grouped, a_padded, x_div, gather = ctx.upload(act[order_h]), ctx.upload(pad), 0, []
            a32 = ctx.upload(act[order_h].astype(np.float32))
        glu = name == "ffn_gate_up_exps"
        xq = quant_x_buffers(a32.shape[0], K)
        xq32 = quant_x32_buffers(a32.shape[0], K)
        c_gemv = {p: ctx.upload(np.full((S, N // 2 if glu else N), np.nan, np.float32)) for p in md.INT8_PATHS}
        c_tiles = ctx.upload(np.full((S, N), np.nan, np.float32))
        c_wgmma = ctx.upload(np.full((S, N), np.nan, np.float32))
        c_cublas = ctx.upload(np.full((n_max * BM, N), np.nan, np.float32))

        def tiles_path():
            gemm_grouped(a_grouped, w, N, c_tiles, tiles, n_tiles, order, x_div, s)

        def wgmma_path():
            gemm_grouped_wgmma(a_grouped, w, N, c_wgmma, tiles, n_tiles, order, x_div, s)

        def cublas_path():
            for g in gather:
                g()
            expert_gemm(dev, "cublas", a_padded, w, c_cublas, (tiles_pad, n_tiles, order), 0, w16)

        def gemv_path(p):
            tm, variant = md.GEMV_PATHS[p]

            def run():
                quantize_x(a32, xq, s)
                gemv_dp4a_grouped(w, N, xq, c_gemv[p], *gemv_tiles[tm], order, x_div, s, variant, tm,
                                  SILU if glu else 0)
            return run

        def mmq_path():
            quantize_x32(a32, xq32, s)
            gemm_mmq_grouped(xq32, w, N, c_gemv[md.MMQ], *gemv_tiles[md.tile_tokens(md.MMQ)], order, x_div, s,
                             SILU if glu else 0)

        paths = {"tiles": tiles_path, "cublas": cublas_path}
        if supports(t, K):
            paths["wgmma"] = wgmma_path
        if gemv_dispatch.takes(t, K):
            paths.update({p: gemv_path(p) for p in md.GEMV_PATHS})
        if mmq_supports(t, K):
            paths[md.MMQ] = mmq_path
        us = {p: time_calls(dev, fn, reps) for p, fn in paths.items()}
        ctx.sync()
        ref = c_tiles.copy_to_host()[slot_row_h]
        outs = {"cublas": c_cublas.copy_to_host()[rows_pad_h], "wgmma": c_wgmma.copy_to_host()[slot_row_h]}
        outs.update({p: c.copy_to_host()[slot_row_h] for p, c in c_gemv.items()})
        if glu:  # the GEMV paths write SwiGLU(gate, up): their reference is the tiles' through it
            outs.update({p: swiglu_ref(outs[p][:, :N // 2], outs[p][:, N // 2:]) for p in ("cublas", "wgmma")})
            glu_ref = swiglu_ref(ref[:, :N // 2], ref[:, N // 2:])
        rel = {}
        for p in us:
            if p != "tiles":
                want = glu_ref if glu else ref
                rel[p] = float(np.abs(outs[p] - want).max() / np.abs(want).max()) if np.isfinite(outs[p]).all() \
                    else float("inf")
        chosen = "tiles"
        for p in sorted(rel, key=lambda p: us[p]):
            if np.isfinite(ref).all() and rel[p] < 1e-2 and us[p] * MARGIN < us[chosen]:
                chosen = p
        out.append(dict(key=md.shape_key(t, N, K), T=T, us=us, rel=rel, chosen=chosen))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=MODEL, choices=list(SHAPES))
    ap.add_argument("--quant", default="Q4_K_M", choices=list(sf.FILE_TYPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--buckets", help="token counts T to measure, comma-separated (default: the table's "
                    "buckets; any other T is measured, not written)")
    ap.add_argument("--merge", action="store_true", help="keep the table's other shapes and buckets")
    ap.add_argument("--out", default=str(md.TABLE_PATH))
    ap.add_argument("--json", help="every measurement")
    args = ap.parse_args()
    try:
        buckets = [int(b) for b in args.buckets.split(",")] if args.buckets is not None else md.BUCKETS
    except ValueError:
        ap.error(f"--buckets: comma-separated token counts, not {args.buckets!r}")
    if min(buckets) < 1:
        ap.error("--buckets: token counts of at least 1")
    start = time.perf_counter()
    ctx = GpuContext()
    dev = SimpleNamespace(ctx=ctx, arena=Arena(ctx), cublas=Cublas(ctx))
    mats = expert_matrices(dev, args.quant, model=args.model)
    print(f"{len(mats)} expert matrices of {args.model} {args.quant} in {time.perf_counter() - start:.0f} s")
    print(f"{'shape':<24} {'T':>4} {'tiles µs':>9} {'wgmma µs':>9} {'cublas µs':>10} {'int8 µs':>16} "
          f"{'chosen':<8} {'speed-up':>8}")
    rng, rows = np.random.default_rng(0), []
    old = json.loads(Path(args.out).read_text()) if args.merge and Path(args.out).exists() else {}
    choices, shapes = old.get("choices", {}), old.get("shapes", "").split("; ") if old else []
    off = [T for T in buckets if T not in md.BUCKETS]
    if off:  # a chunk of T tokens takes the table's bucket above T (moe_dispatch.choose)
        print(f"T = {', '.join(map(str, off))}: measured (--json), not written: the table's buckets are {md.BUCKETS}")
    for T in buckets:
        for r in measure(dev, rng, mats, T, args.reps, args.model):
            rows.append(r)
            if T in md.BUCKETS:
                choices.setdefault(r["key"], {})[str(T)] = r["chosen"]
            us = r["us"]
            gv = min((p for p in us if p in md.INT8_PATHS), key=us.get, default=None)
            gemv_col = f"{us[gv]:.1f} {gv}" if gv else "-"
            print(f"{r['key']:<24} {T:>4} {us['tiles']:>9.1f} {us.get('wgmma', float('nan')):>9.1f} "
                  f"{us['cublas']:>10.1f} {gemv_col:>16} {r['chosen']:<8} {us['tiles'] / us[r['chosen']]:>8.2f}"
                  f" {' '.join(f'{p}={x:.3g}' for p, x in r['rel'].items() if x >= 1e-2)}")
    ctx.sync()
    shapes = [x for x in shapes if x] + [f"{args.model} {args.quant}"]
    choices = {key: dict(sorted(by_t.items(), key=lambda kv: int(kv[0]))) for key, by_t in choices.items()}
    Path(args.out).write_text(json.dumps({"note": "written by scripts/tune_moe.py on the GPU named",
                                          "gpu": _gpu_name(), "shapes": "; ".join(dict.fromkeys(shapes)),
                                          "choices": choices}, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    n_cublas = sum(c == "cublas" for by_t in choices.values() for c in by_t.values())
    print(f"wrote {args.out}: {n_cublas} cuBLAS choices; {time.perf_counter() - start:.0f} s in all")
    return 0


def _gpu_name() -> str:
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


if __name__ == "__main__":
    sys.exit(main())
