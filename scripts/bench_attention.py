"""Prefill attention (kernels/attention/attention_fa2.py, attention_wgmma.py) against torch SDPA's flash and
cuDNN backends: TFLOP/s.

Z sequences of N_CTX tokens, H heads (no GQA), head dim D, fp16 operands (--bf16: bf16). impnb
runs one sequence per call over its paged cache (page 32, contiguous tables), Z calls back to
back on one stream; torch runs (Z, H, N, D) tensors. Causal: query t at position t; not causal:
every query at position N - 1, so each sees all N keys (impnb has no separate non-causal mode). FLOPs
4 Z H N² D, halved when causal. Timed with CUDA events: one warm-up, the median of --reps, each
rep queued behind a ~1 ms sleeping kernel so host launch cost stays off the clock (as a graph
replays them; at N 1024 impnb's four calls otherwise wait on the host).
    python scripts/bench_attention.py [--ctx 1024,2048,4096,8192,16384] [--dims 64,128] [--reps 5] [--json PATH]
        [--tilings m32,m16] [--no-torch] [--bf16]
--tilings: attention_fa2's TILINGS to time side by side (one impnb column each); "wg" is
attention_wgmma (head dims 64 and 128).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb.kernels.attention.attention_fa2 import DEFAULT_TILING, attention_fa2  # noqa: E402
from impnb.kernels.attention.attention_wgmma import HEAD_DIMS as WG_DIMS, attention_wgmma  # noqa: E402
from impnb.kernels.attention.kv_cache import bf16_bits, contiguous_block_table, pages_needed  # noqa: E402

Z, H, PAGE = 4, 32, 32


@cuda.jit
def _sleep(ms):
    for _ in range(ms):
        cuda.nanosleep(1000000)  # at most ~1 ms each


def median_ms(fn, reps: int, stream, sleep) -> float:
    fn()
    times = []
    for _ in range(reps):
        start, end = cuda.event(), cuda.event()
        sleep()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end))
    return statistics.median(times)


def impnb_ms(N: int, D: int, causal: bool, reps: int, tiling: str = DEFAULT_TILING, bf16: bool = False) -> float | None:
    if tiling == "wg" and D not in WG_DIMS:
        return None
    rng = np.random.default_rng(0)
    stream = cuda.stream()
    n_pages = pages_needed(N, PAGE)
    table = cuda.to_device(contiguous_block_table(Z, n_pages), stream=stream)
    pool = (Z * n_pages, PAGE, H, D)
    kv = bf16_bits if bf16 else (lambda a: a.astype(np.float16))
    k_pool = cuda.to_device(kv(rng.standard_normal(pool, np.float32)), stream=stream)
    v_pool = cuda.to_device(kv(rng.standard_normal(pool, np.float32)), stream=stream)
    q = [cuda.to_device(rng.standard_normal((N, H, D), np.float32), stream=stream) for _ in range(Z)]
    out = [cuda.device_array((N, H, D), np.float32, stream=stream) for _ in range(Z)]
    pos = cuda.to_device(np.arange(N, dtype=np.int32) if causal else np.full(N, N - 1, np.int32), stream=stream)

    def run():
        for z in range(Z):
            if tiling == "wg":
                attention_wgmma(q[z], k_pool, v_pool, table[z], pos, out[z], D ** -0.5, None, None, stream)
            else:
                attention_fa2(q[z], k_pool, v_pool, table[z], pos, out[z], D ** -0.5, None, None, stream, tiling)

    ms = median_ms(run, reps, stream, lambda: _sleep[1, 1, stream](1))
    assert np.isfinite(out[Z - 1].copy_to_host(stream=stream)).all()
    return ms


def torch_ms(N: int, D: int, causal: bool, reps: int, backend: str, bf16: bool = False) -> float | None:
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa
    except ImportError:
        return None
    dtype = torch.bfloat16 if bf16 else torch.float16
    q, k, v = (torch.randn(Z, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
    stream = torch.cuda.current_stream()
    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            def run():
                sdpa(q, k, v, is_causal=causal)
            run()
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(2_000_000)  # ~1 ms of clock cycles
                start.record(stream)
                run()
                end.record(stream)
                end.synchronize()
                times.append(start.elapsed_time(end))
            return statistics.median(times)
    except RuntimeError as e:
        print(f"torch {backend} N={N} D={D}: {e}", file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", default="1024,2048,4096,8192,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--tilings", default=DEFAULT_TILING,
                    help="comma-separated TILINGS keys of attention_fa2, or wg (attention_wgmma)")
    ap.add_argument("--no-torch", action="store_true", help="time impnb only")
    ap.add_argument("--bf16", action="store_true", help="bf16 K/V (and torch's tensors), not fp16")
    args = ap.parse_args()
    tilings = args.tilings.split(",")
    impnb_cols = ["impnb"] if tilings == [DEFAULT_TILING] else [f"impnb:{t}" for t in tilings]
    rows = []
    for D in (int(x) for x in args.dims.split(",")):
        for causal in (False, True):
            for N in (int(x) for x in args.ctx.split(",")):
                flops = 4 * Z * H * N * N * D / (2 if causal else 1)
                row = {"D": D, "causal": causal, "N": N}
                timed = [(col, impnb_ms(N, D, causal, args.reps, t, args.bf16)) for col, t in zip(impnb_cols, tilings)]
                if not args.no_torch:
                    timed += [("flash", torch_ms(N, D, causal, args.reps, "FLASH_ATTENTION", args.bf16)),
                              ("cudnn", torch_ms(N, D, causal, args.reps, "CUDNN_ATTENTION", args.bf16))]
                for name, ms in timed:
                    row[name] = None if ms is None else flops / (ms * 1e-3) / 1e12
                rows.append(row)
                print(row, file=sys.stderr, flush=True)
    fmt = lambda v: "    -" if v is None else f"{v:5.0f}"  # noqa: E731
    cols = impnb_cols + ["flash", "cudnn"]
    dtype = "bf16" if args.bf16 else "fp16"
    print(f"TFLOP/s, Z={Z} H={H} {dtype}\n    D causal     N  " + "  ".join(f"{c:>8}" for c in cols)
          + "  impnb/flash")
    for r in rows:
        best = max(r[c] or 0 for c in impnb_cols)
        ratio = f"{best / r['flash']:.2f}" if r.get("flash") else "-"
        print(f"{r['D']:5d} {str(r['causal']):>6} {r['N']:5d}  "
              + "  ".join(f"{fmt(r.get(c)):>8}" for c in cols) + f"  {ratio:>11}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
