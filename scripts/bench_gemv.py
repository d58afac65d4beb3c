"""Time the quantized GEMV kernels on the GPU: bytes/s and % of the H100's 2.97 TB/s copy rate.

For each type, enough distinct copies of a (rows, cols) weight to exceed 4x the 50 MB L2 are
rotated; launches are queued behind a sleeping kernel so host launch cost stays off the clock,
each timed by its own pair of CUDA events; the median of --reps is reported.
    python scripts/bench_gemv.py [--shape 4096x14336[,14336x4096...]] [--tokens 1,8] [--types Q4_K,Q8_0]
                                 [--dequant] [--variant s32u1r8,s64u1r4] [--stream 2:8,4:4] [--dp4a [V,...]]
                                 [--jobs N] [--json PATH]
--read U:B:W also times a plain streaming read of the same bytes (U 16-byte loads in flight a
thread, B blocks an SM of W threads) and a device-to-device copy of them: the ceiling at the shape.
--dp4a [V,...] also times gemv_dp4a (choose_capped's variant, or these, each with an optional
register cap, s64u2r4c80; an empty name is that one)
and quantize_x, which it needs first, on the same x (rows "dp4a ..." and "quant_x"; their sum is
what a decode step pays); with --glu also as gate|up with SiLU (rows "dp4a-glu ...").
--jobs N compiles the GEMV and dp4a kernels the run launches first, in N processes, into the disk
cache (impnb.launch.cache), so the timed part compiles nothing.
--sweep times every T = 1 kernel variant (gemv_variants.sweep) on the shapes of SWEEP_CASES instead,
after compiling them all in parallel processes, and marks the fastest per shape and type (b2b):
    python scripts/bench_gemv.py --sweep [--reps 60] [--json PATH]
"""

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402
from numba import cuda, uint32  # noqa: E402

from impnb.kernels.common import ptx, quant_intrinsics as qi  # noqa: E402
from impnb.kernels.gemm.dequant import dequant  # noqa: E402
from impnb.kernels.gemv.gemv import DECODERS, Variant, choose, gemv, kernel_args, variant_kernel  # noqa: E402
from impnb.kernels.gemv import gemv_dp4a as dp  # noqa: E402
from impnb.kernels.gemv.gemv_dp4a import NO_GLU, SILU, gemv_dp4a  # noqa: E402
from impnb.kernels.gemv.gemv_dp4a_units import DOTS  # noqa: E402
from impnb.kernels.gemv.gemv_dp4a_variants import choose_capped  # noqa: E402
from impnb.kernels.gemv.gemv_stream import gemv_stream, sm_count  # noqa: E402
from impnb.kernels.gemv.quant_x import quant_x_buffers, quantize_x  # noqa: E402
from impnb.kernels.common.repack import repack  # noqa: E402
from impnb.synthetic_full import BLOCK_FIELDS  # noqa: E402

PEAK = 2.97e12  # bytes/s, a device-to-device copy on the H100 (bytes read + written)
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
    if t in (T.MXFP4, T.NVFP4):  # E8M0 / UE4M3 scales around 0.02, as the synthetic writer draws them
        BLOCK_FIELDS[t](blocks, 0.02)
        return blocks.reshape(rows, -1)
    for off in SCALES[t]:
        d = (rng.standard_normal(len(blocks)) * 0.02).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


@cuda.jit
def _sleep(ms):
    for _ in range(ms):
        cuda.nanosleep(1000000)  # at most ~1 ms each


def read_kernel(U):
    """out[thread] = the xor of the 16-byte chunks of a it reads: every chunk once, in rounds of
    U loads in flight a thread (chunks r + tid + u * threads), then the tail one at a time."""
    W = 4 * U  # words a thread holds

    @cuda.jit
    def read(a, n16, out):
        tid = cuda.grid(1)
        step = cuda.gridsize(1)
        full = n16 // (U * step) * (U * step)  # chunks the whole rounds cover
        acc = uint32(0)
        for r in range(0, full, U * step):
            v = cuda.local.array(W, uint32)
            for u in range(U):
                v[4 * u], v[4 * u + 1], v[4 * u + 2], v[4 * u + 3] = \
                    ptx.ld_global_v4_u32(a, 4 * (r + tid + u * step))
            for k in range(W):
                acc ^= v[k]
        for i in range(full + tid, n16, step):
            v0, v1, v2, v3 = ptx.ld_global_v4_u32(a, 4 * i)
            acc ^= v0 ^ v1 ^ v2 ^ v3
        out[tid] = acc
    return read


def bench_read(weights, U, bps, threads, reps, stream):
    """(median, b2b) us of read_kernel(U) over each copy's bytes, and of a copy of them."""
    grid = sm_count() * bps
    bufs = [w.buffer[:w.nbytes // 16 * 16].view(np.uint32) for w in weights]
    out = cuda.device_array(grid * threads, np.uint32)
    kern = read_kernel(U)
    read = time_launches(lambda i, s: kern[grid, threads, s](bufs[i % len(bufs)], bufs[0].size // 4, out),
                         len(bufs), reps, stream)
    dst = cuda.device_array_like(bufs[0])
    copy = time_launches(lambda i, s: dst.copy_to_device(bufs[i % len(bufs)], stream=s), len(bufs), reps, stream)
    return read, copy


def device_copies(t, rows, cols, rng, copies=None):
    """Enough distinct device copies of a random (rows, cols) weight of type t to exceed 4x L2."""
    one = repack(random_weight(t, rows, cols, rng), t)
    copies = copies or max(2, int(np.ceil(4 * L2_BYTES / one.nbytes)))
    return [one.to_device()] + [repack(random_weight(t, rows, cols, rng), t).to_device()
                                for _ in range(copies - 1)]


def time_launches(launch, n_copies, reps, stream):
    """Microseconds of launch(i, stream), i = 0..reps-1: the median with each launch between its
    own events, and the mean of the same launches back to back."""
    for i in range(2 * n_copies):  # warm up: compile, load module, touch every copy
        launch(i, stream)
    stream.synchronize()
    starts = [cuda.event() for _ in range(reps)]
    ends = [cuda.event() for _ in range(reps)]
    if not qi.SIM:  # (the simulator has no nanosleep)
        _sleep[1, 1, stream](max(20, reps))  # the queue fills while the GPU sleeps
    for i in range(reps):
        starts[i].record(stream)
        launch(i, stream)
        ends[i].record(stream)
    stream.synchronize()
    us = np.array([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])  # ms -> us
    if not qi.SIM:  # back to back, as in a decode graph: one pair of events around them all
        _sleep[1, 1, stream](max(20, reps))
        starts[0].record(stream)
        for i in range(reps):
            launch(i, stream)
        ends[0].record(stream)
        stream.synchronize()
        return float(np.median(us)), float(starts[0].elapsed_time(ends[0]) * 1e3 / reps)
    return float(np.median(us)), float(us.min())


def result(op, t, weights, n_tok, nbytes, med_us, b2b_us):
    w = weights[0]
    return {"op": op, "type": t.name, "rows": w.rows, "cols": w.cols, "tokens": n_tok,
            "copies": len(weights), "bytes": nbytes, "median_us": med_us, "b2b_us": b2b_us,
            "bytes_per_s": nbytes / (med_us * 1e-6), "pct_peak": 100 * nbytes / (med_us * 1e-6) / PEAK,
            "pct_peak_b2b": 100 * nbytes / (b2b_us * 1e-6) / PEAK}


def bench_dp4a(t, weights, n_tok, variants, reps, rng, stream, glus=(NO_GLU,)):
    """quantize_x, then gemv_dp4a in each variant ((Variant, register cap or None), or None:
    choose_capped's) and epilogue of glus (SILU: the rows as gate|up, half as many outputs; rows
    "dp4a-glu"), on one Gaussian x."""
    rows, cols = weights[0].rows, weights[0].cols
    x = cuda.to_device(rng.standard_normal((n_tok, cols)).astype(np.float32), stream=stream)
    xq = quant_x_buffers(n_tok, cols)
    med, b2b = time_launches(lambda i, s: quantize_x(x, xq, s), 1, reps, stream)
    out = [result("quant_x", t, weights, n_tok, x.nbytes + sum(a.nbytes for a in xq), med, b2b)]
    for glu in glus:
        n_out = rows // 2 if glu else rows
        for vc in variants:
            v, vcap = vc or (None, None)
            y = cuda.to_device(np.full((n_tok, n_out), np.nan, np.float32), stream=stream)
            med, b2b = time_launches(
                lambda i, s: gemv_dp4a(weights[i % len(weights)], xq, y, s, variant=v, glu=glu, cap=vcap),
                len(weights), reps, stream)
            assert np.isfinite(y.copy_to_host()).all()
            chosen, cap = (v, vcap) if v else choose_capped(t, n_tok, cols, glu, n_out)
            name = chosen.name + (f"c{cap}" if cap else "")  # c: its register cap
            op = f"dp4a{'-glu' if glu else ''} {name}"
            out.append(result(op, t, weights, n_tok, weights[0].nbytes, med, b2b))
    return out


def bench_type(t, rows, cols, tokens, reps, rng, copies=None, with_dequant=False, variants=(None,), streams=(),
               reads=(), dp4a=(), glus=(NO_GLU,)):
    weights = device_copies(t, rows, cols, rng, copies)
    stream = cuda.stream()
    out = []
    for u, bps, threads in reads:
        (med, b2b), (cmed, cb2b) = bench_read(weights, u, bps, threads, reps, stream)
        out.append(result(f"rd{u}:{bps}:{threads}", t, weights, 0, weights[0].nbytes // 16 * 16, med, b2b))
        out.append(result("copy", t, weights, 0, 2 * (weights[0].nbytes // 16 * 16), cmed, cb2b))
    for r, bps in streams:  # gemv_stream at T = 1: r rows a group, bps blocks an SM
        x = cuda.to_device(rng.standard_normal((1, cols)).astype(np.float32), stream=stream)
        y = cuda.to_device(np.full((1, rows), np.nan, np.float32), stream=stream)
        med, b2b = time_launches(lambda i, s: gemv_stream(weights[i % len(weights)], x, y, s, r, bps),
                                 len(weights), reps, stream)
        assert np.isfinite(y.copy_to_host()).all()
        out.append(result(f"st{r}b{bps}", t, weights, 1, weights[0].nbytes, med, b2b))
    for n_tok in tokens:
        for v in variants:
            x = cuda.to_device(rng.standard_normal((n_tok, cols)).astype(np.float32), stream=stream)
            y = cuda.to_device(np.full((n_tok, rows), np.nan, np.float32), stream=stream)
            med, b2b = time_launches(lambda i, s: gemv(weights[i % len(weights)], x, y, s, variant=v),
                                     len(weights), reps, stream)
            assert np.isfinite(y.copy_to_host()).all()
            out.append(result(v.name if v else "gemv", t, weights, n_tok, weights[0].nbytes, med, b2b))
        if dp4a and t in DOTS:
            out += bench_dp4a(t, weights, n_tok, dp4a, reps, rng, stream, glus)
    if with_dequant:
        w16 = cuda.device_array((rows, cols), np.float16, stream=stream)
        med, b2b = time_launches(lambda i, s: dequant(weights[i % len(weights)], w16, s),
                                 len(weights), reps, stream)
        out.append(result("dequant", t, weights, 0, weights[0].nbytes + w16.nbytes, med, b2b))
    return out


def _compile(job):
    """Compile one kernel of the run into the disk cache: ("gemv", t, n_tok, K, rows, variant) or
    ("dp4a", t, n_tok, K, rows, (variant, cap) or None for choose_capped's)."""
    from impnb.launch import cache
    from impnb.launch.cubin import arch_cc

    kind, t, n_tok, K, rows, v, glu, cc = job
    if kind == "gemv":
        kernel, sig = variant_kernel(t, n_tok, v or choose(t, n_tok, K, rows), NO_GLU, cols=K), kernel_args(t)
    else:
        v, cap = v or choose_capped(t, n_tok, K, glu, rows // 2 if glu else rows)
        kernel, sig = dp.gemv_dp4a_kernel(t, K, n_tok, v.span, v.rows, glu, False, v.unroll, cap), dp.kernel_args(t)
    cache.get_cubin(kernel, sig, arch_cc(cc))


def precompile(type_names, shapes, tokens, variants, dp4a, glus, n_jobs):
    """Every plain GEMV and dp4a kernel the timed run launches, compiled in n_jobs processes."""
    cc = cuda.get_current_device().compute_capability
    jobs = {("gemv", T[n], k, K, rows, v, NO_GLU, cc) for n in type_names for rows, K in shapes for k in tokens
            for v in variants}
    jobs |= {("dp4a", T[n], k, K, rows, v, glu, cc) for n in type_names if T[n] in DOTS for rows, K in shapes
             for k in tokens for v in dp4a for glu in glus}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(min(len(jobs), n_jobs, os.cpu_count() or 1), mp_context=get_context("spawn")) as pool:
        list(pool.map(_compile, sorted(jobs, key=str)))
    print(f"{len(jobs)} kernels compiled or found in {time.perf_counter() - t0:.0f} s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x14336", help="rows x cols of W, or several separated by commas")
    ap.add_argument("--tokens", default="1,8", help="comma-separated T values")
    ap.add_argument("--types", default=",".join(t.name for t in DECODERS))
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--copies", type=int, help="weight copies to rotate (default: > 4x L2)")
    ap.add_argument("--dequant", action="store_true", help="also time dequant to fp16 (bytes read + written)")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--sweep", action="store_true", help="time every T = 1 variant on the sweep shapes")
    ap.add_argument("--variant", help="gemv_variants.Variants instead of choose()'s, e.g. s32u1r8,s64u1r4")
    ap.add_argument("--read", help="also time plain reads U:B:W and a copy of the same bytes, e.g. 4:4:256")
    ap.add_argument("--dp4a", nargs="?", const="", help="also time quantize_x + gemv_dp4a (variants, e.g. s64u1r4)")
    ap.add_argument("--stream", help="also time gemv_stream (T = 1), rows:blocks an SM each, e.g. 2:8,4:4")
    ap.add_argument("--jobs", type=int, default=0, help="compile the kernels first in this many processes")
    ap.add_argument("--glu", action="store_true", help="--dp4a also as gate|up with SiLU (the rows halves of W)")
    args = ap.parse_args()
    if args.sweep:
        from gemv_sweep import sweep_main

        return sweep_main(args.reps, args.json)
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shape.lower().split(",")]
    tokens = [int(v) for v in args.tokens.split(",")]
    rng = np.random.default_rng(0)
    def parse_variants(text, flag, caps=False):
        out = []
        for name in text.split(","):
            if not name:  # the rule's choice
                out.append(None)
                continue
            m = re.fullmatch(r"s(\d+)u(\d+)r(\d+)" + (r"(?:c(\d+))?" if caps else ""), name)
            if not m:
                ap.error(f"{flag} {name!r}: expected s<span>u<unroll>r<rows>{'[c<registers>]' if caps else ''}, "
                         f"e.g. s32u1r8")
            v = Variant(*map(int, m.groups()[:3]))
            out.append((v, int(m[4]) if m[4] else None) if caps else v)
        return out

    variants = parse_variants(args.variant, "--variant") if args.variant else [None]
    dp4a = () if args.dp4a is None else parse_variants(args.dp4a, "--dp4a", caps=True) if args.dp4a else [None]
    streams = [tuple(int(v) for v in rb.split(":")) for rb in args.stream.split(",")] if args.stream else ()
    reads = [tuple(int(v) for v in r.split(":")) for r in args.read.split(",")] if args.read else ()
    glus = (NO_GLU, SILU) if args.glu else (NO_GLU,)
    if args.jobs:
        precompile(args.types.split(","), shapes, tokens, variants, dp4a, glus, args.jobs)
    results = []
    print(f"{'shape':>11} {'op':14} {'type':6} {'T':>2} {'MB':>7} {'median us':>10} {'b2b us':>8} {'GB/s':>7} "
          f"{'% 2.97TB/s':>10} {'b2b %':>6}")
    for (rows, cols), name in ((shape, name) for shape in shapes for name in args.types.split(",")):
        for r in bench_type(T[name], rows, cols, tokens, args.reps, rng, args.copies, args.dequant, variants,
                            streams, reads, dp4a, glus):
            results.append(r)
            print(f"{f'{rows}x{cols}':>11} {r['op']:14} {r['type']:6} {r['tokens']:>2} {r['bytes'] / 1e6:7.1f} "
                  f"{r['median_us']:10.2f} {r['b2b_us']:8.2f} {r['bytes_per_s'] / 1e9:7.0f} "
                  f"{r['pct_peak']:9.1f}% {r['pct_peak_b2b']:5.1f}%", flush=True)
        if args.json:  # after every type: a run cut short keeps what it timed
            Path(args.json).write_text(json.dumps({"shape": list(shapes[0]), "shapes": [list(s) for s in shapes],
                                                   "peak_bytes_per_s": PEAK, "results": results}, indent=1))


if __name__ == "__main__":
    main()
