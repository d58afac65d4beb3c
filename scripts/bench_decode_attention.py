"""Decode attention (kernels/attention/attention_decode.py) alone on the GPU: µs per call and KV bandwidth.

One query token per step at context L (positions 0..L-1 cached), the split count the engine
would use for a given n_ctx (or --splits), 50 calls captured into one CUDA graph and replayed
(as the decode graph runs them); the median of 20 replays / 50. KV GB/s = K and V bytes of the
L live keys / time. --torch times torch SDPA on contiguous fp16 K/V of the same shape the same
way (ratio = torch µs / impnb µs). --short also times attention_decode_short (its µs, and
split µs / short µs), with --short-warps block sizes (default its own) and --short-clusters
blocks a query row (thread-block clusters; default 1).
Shapes: SmolLM2-135M (H 9, Hkv 3, D 64), Gemma3-270M (H 4, Hkv 1, D 256), Qwen3-30B-A3B
(H 32, Hkv 4, D 128), Gemma-4-26B-A4B's sliding layers (gemma4: H 16, Hkv 8, D 256; their
1024-key window is --ctx 1024) and its global layers (gemma4-global: H 16, Hkv 2, D 512), which
take attention_wide (its split count attention_wide.num_splits' or --splits; --wide times it at
the other shapes too, --wide-tiled its tiled kernel beside); --row-tiles compares query rows per block of the split kernel;
--fa2-decode times attention_fa2_decode (FA2's tensor-core tiles, a block's rows a KV head's query heads) first.
    python scripts/bench_decode_attention.py [--ctx 131,4096,16384,32768] [--n-ctx N] [--models gemma3]
                                             [--row-tiles 4,8] [--split-keys 32,64] [--splits N,..]
                                             [--torch] [--short] [--short-warps 4,8]
                                             [--short-clusters 1,2,4,8] [--wide] [--wide-tiled]
                                             [--fa2-decode] [--json PATH]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from cuda.bindings import driver  # noqa: E402

from impnb.gpu.context import GpuContext  # noqa: E402
from impnb.graphs.capture import Graph  # noqa: E402
from impnb.kernels.attention import attention_decode as ad  # noqa: E402
from impnb.kernels.attention import attention_decode_short as ads  # noqa: E402
from impnb.kernels.attention import attention_fa2_decode as fa2m  # noqa: E402
from impnb.kernels.attention import attention_wide as aw  # noqa: E402
from impnb.kernels.attention.kv_cache import contiguous_block_table, pages_needed  # noqa: E402

SHAPES = {"smollm2": (9, 3, 64), "gemma3": (4, 1, 256), "qwen3-30b-a3b": (32, 4, 128), "gemma4": (16, 8, 256),
          "gemma4-global": (16, 2, 512)}
PAGE = 32
CALLS = 50


def time_case(ctx: GpuContext, H, Hkv, D, L, n_ctx, splits, rm=None, split_keys=None, warps=0,
              short=False, cluster=1, wide=False, tiled=False, fa2=False):
    """(µs a call, split count, KV GB/s) of the split kernel (attention_wide at its head dims or
    with wide, on its tiled kernel with tiled), or (short) of attention_decode_short with blocks of `warps` warps (0: its
    default), `cluster` blocks a row, or (fa2) of attention_fa2_decode (its split count
    decode_splits' for the bucket n_ctx, or splits)."""
    wide = (wide or D in aw.HEAD_DIMS) and not fa2
    rng = np.random.default_rng(0)
    n_pages = pages_needed(n_ctx, PAGE)
    k_pool = ctx.upload(rng.standard_normal((n_pages, PAGE, Hkv, D)).astype(np.float16))
    v_pool = ctx.upload(rng.standard_normal((n_pages, PAGE, Hkv, D)).astype(np.float16))
    table = ctx.upload(contiguous_block_table(1, n_pages)[0])
    q = ctx.upload(rng.standard_normal((1, H, D)).astype(np.float32))
    pos = ctx.upload(np.array([L - 1], np.int32))
    out = ctx.empty((1, H, D), np.float32)
    if fa2:
        n_splits = splits or fa2m.decode_splits(n_ctx, Hkv, D)
    else:
        n_splits = splits or (aw.num_splits(n_ctx, Hkv, 1) if wide else ad.num_splits(n_ctx, H, Hkv, head_dim=D))
    partials = ctx.empty(aw.partials_shape(n_splits, 1, H, D) if wide or fa2
                         else ad.partials_shape(1, n_splits, 1, H, D), np.float32)
    counters = ctx.upload(np.zeros(ad.counters_shape(1, 1, H), np.int32))

    def call():
        if fa2:
            fa2m.attention_fa2_decode(q, k_pool, v_pool, table, pos, out, partials, n_splits, D ** -0.5, None, None,
                                      ctx.nb_stream)
        elif wide:
            aw.attention_wide(q, k_pool, v_pool, table, pos, out, partials, n_splits, D ** -0.5, None,
                              ctx.nb_stream, tiled)
        elif short:
            ads.attention_decode_short(q, k_pool, v_pool, table, pos, out, D ** -0.5, None, None,
                                       ctx.nb_stream, warps or None, splits=cluster)
        else:
            ad.attention_decode(q, k_pool, v_pool, table, pos, out, partials, counters, n_splits,
                                D ** -0.5, None, None, ctx.nb_stream, rows_per_block=rm,
                                split_keys=split_keys)

    call()
    ctx.sync()
    graph = Graph(ctx.handle, lambda: [call() for _ in range(CALLS)])
    start, end = driver.cuEventCreate(0)[1], driver.cuEventCreate(0)[1]
    times = []
    for _ in range(23):
        driver.cuEventRecord(start, graph.stream)
        graph.replay()
        driver.cuEventRecord(end, graph.stream)
        driver.cuEventSynchronize(end)
        times.append(driver.cuEventElapsedTime(start, end)[1] * 1e3 / CALLS)
    graph.close()
    us = statistics.median(times[3:])
    return us, n_splits, 2 * L * Hkv * D * 2 / (us * 1e-6) / 1e9


def time_torch(H, Hkv, D, L):
    """torch SDPA (fp16, contiguous K/V, GQA) on the same shape: µs per call, graph-replayed."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, H, 1, D, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(1, Hkv, L, D, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(1, Hkv, L, D, device="cuda", dtype=torch.float16, generator=g)

    def call():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(23):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times[3:])


def wide_rows(ctx: GpuContext, args, model: str, rows: list) -> None:
    """attention_wide's rows: each context and split count, its own kernel and (--wide-tiled) the
    tiled one."""
    H, Hkv, D = SHAPES[model]
    for L in (int(v) for v in args.ctx.split(",")):
        for s in ([int(v) for v in args.splits.split(",")] if args.splits else [0]):
            for tiled in (False, True) if args.wide_tiled else (False,):
                us, n, gbs = time_case(ctx, H, Hkv, D, L, max(args.n_ctx, L), s, wide=True, tiled=tiled)
                rows.append(dict(model=model, ctx=L, splits=n, wide=True, tiled=tiled, us=us, kv_gbs=gbs))
                print(f"{model:<13} {L:>6} {n:>6} {'tile' if tiled else 'wide':>4} {'-':>5} {us:>8.2f} {gbs:>8.1f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="64,131,512,4096,16384,32768")
    ap.add_argument("--n-ctx", type=int, default=32768, help="context the split count is sized for")
    ap.add_argument("--splits", default="", help="comma-separated split counts to try (default: num_splits)")
    ap.add_argument("--models", default="smollm2,gemma3", help=f"of {','.join(SHAPES)}")
    ap.add_argument("--row-tiles", default="", help="query rows per block to try (default: row_tile's choice)")
    ap.add_argument("--split-keys", default="", help="keys a split takes at least, to try (default: min_chunk)")
    ap.add_argument("--torch", action="store_true", help="also time torch SDPA on contiguous fp16 K/V")
    ap.add_argument("--short", action="store_true", help="also time attention_decode_short")
    ap.add_argument("--short-warps", default="", help="its block sizes to try (default: its own)")
    ap.add_argument("--short-clusters", default="1", help="blocks a row of the short kernel to try")
    ap.add_argument("--wide", action="store_true", help="time attention_wide at every shape")
    ap.add_argument("--wide-tiled", action="store_true", help="attention_wide's tiled kernel too")
    ap.add_argument("--fa2-decode", action="store_true",
                    help="attention_fa2_decode at every shape, its split count for the context (--n-ctx ignored)")
    ap.add_argument("--json")
    args = ap.parse_args()
    ctx = GpuContext()
    rows = []
    print(f"{'model':<13} {'ctx':>6} {'splits':>6} {'rows':>4} {'keys':>5} {'µs':>8} {'KV GB/s':>8}"
          + (f" {'torch µs':>9} {'ratio':>6}" if args.torch else "")
          + (f" {'warps':>5} {'clus':>4} {'short µs':>9} {'split/short':>11}" if args.short else ""))
    for model in args.models.split(",") if args.fa2_decode else ():
        H, Hkv, D = SHAPES[model]
        for L in (int(v) for v in args.ctx.split(",")):
            for s in ([int(v) for v in args.splits.split(",")] if args.splits else [0]):
                us, n, gbs = time_case(ctx, H, Hkv, D, L, L, s, fa2=True)
                rows.append(dict(model=model, ctx=L, splits=n, fa2_decode=True, us=us, kv_gbs=gbs))
                print(f"{model:<13} {L:>6} {n:>6} {'fa2d':>4} {'-':>5} {us:>8.2f} {gbs:>8.1f}")
    for model in args.models.split(","):
        H, Hkv, D = SHAPES[model]
        if D in aw.HEAD_DIMS or args.wide:
            wide_rows(ctx, args, model, rows)
            continue
        for L in (int(v) for v in args.ctx.split(",")):
            n_ctx = max(args.n_ctx, L)
            for s in ([int(v) for v in args.splits.split(",")] if args.splits else [0]):
                for rm in [int(v) for v in args.row_tiles.split(",") if v] or [ad.row_tile(H, Hkv, 1, D)]:
                    for sk in [int(v) for v in args.split_keys.split(",") if v] or [ad.min_chunk(D)]:
                        us, n, gbs = time_case(ctx, H, Hkv, D, L, n_ctx, s, rm, sk)
                        t_us = time_torch(H, Hkv, D, L) if args.torch else None
                        line = (f"{model:<13} {L:>6} {n:>6} {rm:>4} {sk:>5} {us:>8.2f} {gbs:>8.1f}"
                                + (f" {t_us:>9.2f} {t_us / us:>6.2f}" if t_us else ""))
                        short_warps = ([int(v) for v in args.short_warps.split(",")
                                        if v and int(v) * 32 >= D]
                                       or [0]) if args.short else [None]
                        for nw in short_warps:
                            for cl in [int(v) for v in args.short_clusters.split(",")]:
                                s_us = (time_case(ctx, H, Hkv, D, L, n_ctx, 0, warps=nw, short=True,
                                                  cluster=cl)[0]
                                        if nw is not None and L <= ads.MAX_KEYS else None)
                                rows.append(dict(model=model, ctx=L, splits=n, rows=rm, split_keys=sk, us=us,
                                                 kv_gbs=gbs, torch_us=t_us, short_warps=nw, short_clusters=cl,
                                                 short_us=s_us))
                                print(line + (f" {nw or '-':>5} {cl:>4} {s_us:>9.2f} {us / s_us:>11.2f}"
                                              if s_us else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
