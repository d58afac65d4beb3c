"""GEMV for tall, narrow weights at T = 1 (K <= 1024, many rows: the logits of small models):
persistent warps that load their next row group while decoding the current one.

gemv.py's one-shot blocks hold each row group's loads in flight only between a block's start and
its decode; here a warp keeps one group's chunks in flight all the time, and holds its slice of x
in registers for its whole life. Same y = W x as gemv (numpy reference: gemv.gemv_ref).
On Gemma3's 262144x640 Q8_0 logits it runs at 92% of the copy rate, 1.4x gemv (2 rows a group,
6 blocks an SM). Long rows stay on gemv, which a long-row form of this kernel lost to
(docs/EXPERIMENTS.md, 'GEMV').
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, types

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.warp import warp_sums_lanes
from impnb.kernels.gemv.gemv import parts_type, tuple_of
from impnb.kernels.gemv.gemv_units import DECODERS
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch

WARPS = 4
BLOCK = 32 * WARPS
MAX_K = 1024  # one 32-weight chunk a lane
ROWS = 2  # rows a warp group; with BLOCKS_PER_SM the measured best (docstring above)
BLOCKS_PER_SM = 6


@lru_cache(maxsize=None)
def gemv_stream_kernel(ggml_type: T, rows: int):
    """The kernel for one type and `rows` weight rows per warp group (1, 2 or 4)."""
    load, unit, col = DECODERS[T(ggml_type)]

    @cuda.jit(device=True, inline=True)
    def row_chunk(a, c, r):
        # -- chunk c of group g's row r, clamped to the last row; a = (parts, g, n_rows, cpr) --
        parts, g, n_rows, cpr = a
        return load(parts, min(g * rows + r, n_rows - 1) * cpr + c)

    group_chunks = tuple_of(row_chunk, rows)

    @cuda.jit(device=True, inline=True)
    def x_halves(x, c, xv, sx):
        # -- xv = x[32c .. 32c + 32], sx[h] = the sum of its half h --
        for h in range(2):
            s = float32(0.0)
            for v in range(4):
                x0, x1, x2, x3 = qi.ldg_f32x4(x, col(c, h) + 4 * v)
                xv[16 * h + 4 * v] = x0
                xv[16 * h + 4 * v + 1] = x1
                xv[16 * h + 4 * v + 2] = x2
                xv[16 * h + 4 * v + 3] = x3
                s += (x0 + x1) + (x2 + x3)
            sx[h] = s

    @cuda.jit(device=True, inline=True)
    def dot_chunk(raws, c, xv, sx, w, acc, live):
        # -- acc[r] += live * (chunk c of row r) . xv, 16 weights a half (w = a * u + b) --
        for r in range(rows):
            t = float32(0.0)
            for h in range(2):
                a, b = unit(raws[r], c, h, w)
                p = float32(0.0)
                for i in range(16):
                    p += w[i] * xv[16 * h + i]
                t += a * p + b * sx[h]
            acc[r] += t * live

    shift = 5 - (rows.bit_length() - 1)  # warp_sums_lanes leaves row r's sum in lanes r << shift ..

    if rows == 1:  # warp_sum's chain: the butterfly's form built the Q6_K kernel at 72 registers, not 64
        @cuda.jit(device=True, inline=True)
        def store_rows(acc, g, y, n_rows, lane, scratch):
            # -- sum acc over the warp, lane 0 writes row g; acc zeroed --
            for r in range(rows):
                tot = qi.warp_sum(acc[r], scratch)
                acc[r] = float32(0.0)
                row = g * rows + r
                if r == lane and row < n_rows:
                    y[0, row] = tot
    else:
        @cuda.jit(device=True, inline=True)
        def store_rows(acc, g, y, n_rows, lane, scratch):
            # -- sum acc over the warp (the rows at once), lane r << shift writes row r of group g;
            # acc zeroed --
            tot = warp_sums_lanes(acc, rows)
            for r in range(rows):
                acc[r] = float32(0.0)
            row = g * rows + (lane >> shift)
            if lane & ((1 << shift) - 1) == 0 and row < n_rows:
                y[0, row] = tot

    # grid (blocks,), block 128 = 4 warps. Warp w = 4 * blockIdx + warp owns row groups w,
    # w + 4 * gridDim, ... (turns taken by the whole block; past the last group, loads clamped
    # and nothing stored); a group is `rows` weight rows. Lane c owns chunk c (32 weights) of
    # every row (lanes past K / 32 load the last chunk again and add nothing): x[32c .. 32c + 32]
    # and its half sums stay in registers; each turn loads the next group's chunks, then decodes
    # the current one's and sums every row over the warp.
    @cuda.jit
    def _gemv_stream_kernel(parts, x, y, n_rows):
        cpr = x.shape[1] // 32
        lane = cuda.threadIdx.x & 31
        c = min(lane, cpr - 1)
        n_groups = (n_rows + rows - 1) // rows
        stride = cuda.gridDim.x * WARPS
        warp = cuda.threadIdx.x >> 5
        g0 = cuda.blockIdx.x * WARPS  # the block's first group: the loop is block-uniform
        # W is no kernel's output: the first group's loads go out before the wait
        raws = group_chunks((parts, min(g0 + warp, n_groups - 1), n_rows, cpr), c)
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        xv = cuda.local.array(32, float32)
        sx = cuda.local.array(2, float32)
        x_halves(x, c, xv, sx)
        live = float32(1.0) if lane < cpr else float32(0.0)
        w = cuda.local.array(16, float32)
        acc = cuda.local.array(rows, float32)
        for r in range(rows):
            acc[r] = float32(0.0)
        scratch = cuda.shared.array(BLOCK, float32)  # the simulator's warp_sum
        while g0 < n_groups:
            nxt = group_chunks((parts, min(g0 + stride + warp, n_groups - 1), n_rows, cpr), c)
            dot_chunk(raws, c, xv, sx, w, acc, live)  # while the next group loads
            store_rows(acc, g0 + warp, y, n_rows, lane, scratch)
            raws = nxt
            g0 += stride

    return _gemv_stream_kernel


def kernel_args(ggml_type: T) -> tuple:
    """Argument types: parts, x (1, K), y (1, N), n_rows."""
    f32_2d = types.Array(types.float32, 2, "C")
    return (parts_type(ggml_type), f32_2d, f32_2d, types.int32)


@lru_cache(maxsize=1)
def sm_count() -> int:
    return getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)


def fits(w: PackedWeight, n_tok: int) -> bool:
    """Whether gemv_stream serves this weight and token count."""
    return n_tok == 1 and w.cols <= MAX_K and w.ggml_type in DECODERS


def gemv_stream(w: PackedWeight, x, y, stream, rows: int = ROWS, blocks_per_sm: int = BLOCKS_PER_SM):
    """y (1, N) float32 = W x, x (1, K) float32, K <= MAX_K; `rows` per warp group (1, 2, 4)."""
    assert fits(w, x.shape[0]) and x.shape[1] == w.cols and y.shape == (1, w.rows), (w.cols, x.shape, y.shape)
    assert x.dtype == np.float32 and y.dtype == np.float32 and x.is_c_contiguous() and y.is_c_contiguous()
    groups = (w.rows + rows - 1) // rows
    grid = min((groups + WARPS - 1) // WARPS, blocks_per_sm * sm_count())
    launch(gemv_stream_kernel(w.ggml_type, rows), grid, BLOCK, stream, w.parts, x, y, np.int32(w.rows))


# Registers (sm_90a): 56-64 at 1 row a group, 64-80 at 2, 126-212 at 4; 0 spills.
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemv_stream_kernel(t, rows), types.void(*kernel_args(t)), {})
        for t in (T.Q8_0, T.Q5_0, T.Q4_1, T.Q4_K, T.Q6_K) for rows in (1, 2)
    ] + [(gemv_stream_kernel(T.Q8_0, 4), types.void(*kernel_args(T.Q8_0)), {"stack_bytes": 16})]  # (bench only)
