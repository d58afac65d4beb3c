"""How fast a few blocks read from HBM: µs a launch for `blocks` blocks of `threads` threads, each
block streaming its own contiguous `kb` KB (float4 loads, UNROLL in flight a thread), from places
rotated through 1 GiB so that no read hits L2; launches chained in one CUDA graph as in a decode
step (programmatic, each waiting for the one before). Whether a kernel that puts its data in few
blocks (one thread-block cluster, a block a head) can read it fast: compare a row's µs with the
smallest slab's (near the launch floor; a slab is at least 16 KB a 256-thread block, 4 float4 a
thread) and its GB/s a block with the copy rate / 132 SMs (22.5 GB/s).
    python scripts/bench_block_bandwidth.py [--calls 32]
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from numba import cuda, float32

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb.gpu.context import GpuContext  # noqa: E402
from impnb.graphs.timing import graph_us  # noqa: E402
from impnb.kernels.common import ptx  # noqa: E402
from impnb.kernels.common import quant_intrinsics as qi  # noqa: E402
from impnb.launch import launch  # noqa: E402

UNROLL = 4
BUF_WORDS = 1 << 28  # 1 GiB of float32


# grid (blocks,), block threads: block b sums floats base + b * n .. + n - 1 (n a multiple of
# 4 * threads * UNROLL), thread i float4 i, i + threads, ... UNROLL loads at a time
@cuda.jit
def _read_kernel(buf, out, n, base):
    ptx.grid_dep_wait()
    ptx.grid_dep_launch()
    nt = cuda.blockDim.x
    start = base + cuda.blockIdx.x * n
    acc = float32(0.0)
    for i in range(4 * cuda.threadIdx.x, n, 4 * nt * UNROLL):
        for u in range(UNROLL):
            v0, v1, v2, v3 = qi.ldg_f32x4(buf, start + i + 4 * nt * u)
            acc += (v0 + v1) + (v2 + v3)
    out[cuda.blockIdx.x * nt + cuda.threadIdx.x] = acc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=32)
    args = ap.parse_args()
    ctx = GpuContext()
    s = ctx.nb_stream
    buf = ctx.upload(np.random.default_rng(0).standard_normal(BUF_WORDS, np.float32))
    out = ctx.empty(1024 * 1024, np.float32)
    print(f"{'blocks':>6} {'threads':>7} {'KB a block':>10} {'µs':>7} {'GB/s a block':>12} {'GB/s':>7}")
    for threads in (256, 512, 1024):
        for blocks in (8, 16, 36, 64, 132):
            for kb in (1, 16, 64, 128, 256):
                n = max(kb * 256 // (4 * threads * UNROLL), 1) * 4 * threads * UNROLL  # floats a block
                span = blocks * n
                bases = [(i * span) % (BUF_WORDS - span) for i in range(args.calls)]
                body = lambda: [launch(_read_kernel, blocks, threads, s, buf, out, np.int32(n), np.int64(b))
                                for b in bases]
                body()
                ctx.sync()
                us = graph_us(ctx, body, args.calls)
                per = 4 * n / (us * 1e-6) / 1e9
                print(f"{blocks:>6} {threads:>7} {4 * n / 1024:>10.0f} {us:>7.2f} {per:>12.1f} {per * blocks:>7.0f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
