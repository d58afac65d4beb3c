"""Time the quantized GEMV kernels on the GPU: bytes/s and % of the H100's 2.97 TB/s copy rate.

For each type, enough distinct copies of a (rows, cols) weight to exceed 4x the 50 MB L2 are
rotated; launches are queued behind a sleeping kernel so host launch cost stays off the clock,
each timed by its own pair of CUDA events; the median of --reps is reported.
    python scripts/bench_gemv.py [--shape 4096x14336] [--tokens 1,8] [--types Q4_K,Q8_0] [--json PATH]
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402
from numba import cuda  # noqa: E402

from impnb.kernels import quant_blocks as qb  # noqa: E402
from impnb.kernels.gemv import DECODERS, gemv  # noqa: E402
from impnb.kernels.repack import repack  # noqa: E402

PEAK = 2.97e12  # bytes/s, device-to-device copy on the H100 (shared/GPU.md)
L2_BYTES = 50e6
SCALES = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,),
          T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}  # fp16 scale fields


def random_weight(t, rows, cols, rng):
    """Random quant bytes with finite Gaussian fp16 scales (Gaussian values for F16/F32)."""
    if t in (T.F16, T.F32):
        dt = np.float16 if t == T.F16 else np.float32
        return rng.standard_normal((rows, cols), dtype=np.float32).astype(dt).view(np.uint8)
    block, size = GGML_QUANT_SIZES[t]
    blocks = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for off in SCALES[t]:
        d = (rng.standard_normal(len(blocks)) * 0.02).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


@cuda.jit
def _sleep(ms):
    for _ in range(ms):
        cuda.nanosleep(1000000)  # at most ~1 ms each


def bench(t, rows, cols, n_tok, reps, rng, copies=None):
    one = repack(random_weight(t, rows, cols, rng), t)
    copies = copies or max(2, int(np.ceil(4 * L2_BYTES / one.nbytes)))
    weights = [one.to_device()] + [repack(random_weight(t, rows, cols, rng), t).to_device()
                                   for _ in range(copies - 1)]
    stream = cuda.stream()
    x = cuda.to_device(rng.standard_normal((n_tok, cols)).astype(np.float32), stream=stream)
    y = cuda.to_device(np.full((n_tok, rows), np.nan, np.float32), stream=stream)
    for i in range(2 * copies):  # warm up: compile, load module, touch every copy
        gemv(weights[i % copies], x, y, stream)
    stream.synchronize()
    starts = [cuda.event() for _ in range(reps)]
    ends = [cuda.event() for _ in range(reps)]
    if not qb.SIM:  # (the simulator has no nanosleep)
        _sleep[1, 1, stream](max(20, reps))  # the queue fills while the GPU sleeps
    for i in range(reps):
        starts[i].record(stream)
        gemv(weights[i % copies], x, y, stream)
        ends[i].record(stream)
    stream.synchronize()
    us = np.array([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])  # ms -> us
    assert np.isfinite(y.copy_to_host()).all()
    sec = float(np.median(us)) * 1e-6
    return {"type": t.name, "rows": rows, "cols": cols, "tokens": n_tok, "copies": copies,
            "bytes": one.nbytes, "median_us": sec * 1e6, "min_us": float(us.min()),
            "bytes_per_s": one.nbytes / sec, "pct_peak": 100 * one.nbytes / sec / PEAK}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x14336", help="rows x cols of W")
    ap.add_argument("--tokens", default="1,8", help="comma-separated T values")
    ap.add_argument("--types", default=",".join(t.name for t in DECODERS))
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--copies", type=int, help="weight copies to rotate (default: > 4x L2)")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    rows, cols = (int(v) for v in args.shape.lower().split("x"))
    rng = np.random.default_rng(0)
    results = []
    print(f"{'type':6} {'T':>2} {'MB':>7} {'median us':>10} {'min us':>8} {'GB/s':>7} {'% 2.97TB/s':>10}")
    for name in args.types.split(","):
        for n_tok in (int(v) for v in args.tokens.split(",")):
            r = bench(T[name], rows, cols, n_tok, args.reps, rng, args.copies)
            results.append(r)
            print(f"{r['type']:6} {n_tok:>2} {r['bytes'] / 1e6:7.1f} {r['median_us']:10.2f} "
                  f"{r['min_us']:8.2f} {r['bytes_per_s'] / 1e9:7.0f} {r['pct_peak']:9.1f}%", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": [rows, cols], "peak_bytes_per_s": PEAK,
                                               "results": results}, indent=1))


if __name__ == "__main__":
    main()
