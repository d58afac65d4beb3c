"""Split-K tensor-core GEMM over quantized weights for few rows (a batched decode step's 9..256):
C (M, N) float32 [+]= A (M, K) fp16 · dequant(W)ᵀ, W read as stored (no fp16 copy).

At small M, gemm_tc_quant's grid is one block per 128 rows of W (32 blocks for a 4096-row
weight): too few to stream W at the copy rate. Here each bm x 128 tile is split along K into S
parts, block (tile, s) running gemm_tc_quant's pipeline (quant_mainloop_range) over chunks
s cpr / S .. (s + 1) cpr / S - 1 and storing its partial tile in part[s]; a second kernel adds
the S partials in split order (deterministic, unlike atomics: a replay equals its eager run bit
for bit) into C. Numpy reference: gemm_tc.gemm_ref with the raw bytes and type.
"""

from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemm.gemm_tc import BK, F16_2D, F32_2D, THREADS, block_tile, check_shapes, tile_ops
from impnb.kernels.gemm.gemm_tc_quant import BN, QUANT_TYPES, SMEM_ALIGN, quant_mainloop_range, quant_smem_words
from impnb.kernels.gemv.gemv import parts_type
from impnb.launch import launch

REDUCE_THREADS = 256


@lru_cache(maxsize=None)
def gemm_splitk_kernel(ggml_type, bm=64, warps_m=2, warps_n=4):
    ops = tile_ops(bm, BN, warps_m, warps_n)
    mainloop = quant_mainloop_range(ggml_type, bm, warps_m, warps_n, ops.load_a_split)
    store_c, n_acc = ops.store_c, ops.n_acc
    smem_words = quant_smem_words(bm)

    # grid (ceil(M/bm) * ceil(N/128), S), block 256: block (tile, s = blockIdx.y) owns split s of
    # the bm x 128 tile of C given by block_tile, warps and shared as in gemm_tc_quant; it stores
    # its partial sums in part[s] (S, M, N).
    @cuda.jit
    def _gemm_splitk_kernel(a, parts, part):
        N = part.shape[2]
        S = cuda.gridDim.y
        s = cuda.blockIdx.y
        tm, tn = block_tile((a.shape[0] + bm - 1) // bm, (N + BN - 1) // BN)
        m0 = tm * bm
        n0 = tn * BN
        cpr = a.shape[1] // BK
        smem = cuda.shared.array(smem_words, uint32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(n_acc, float32)
        for i in range(n_acc):
            acc[i] = float32(0.0)
        mainloop(a, m0, parts, n0, N, ptx.smem_addr(smem, 0), acc, s * cpr // S, (s + 1) * cpr // S)
        # -- epilogue: this split's partial tile --
        store_c(part[s], acc, m0, n0, False)

    return _gemm_splitk_kernel


# grid (ceil(M N / (4 x 256)),), block 256: a thread owns 4 consecutive outputs of C (M N a multiple
# of 8) and adds part[0..S-1] there in order (plus y0's own with accumulate); C's column j goes to
# y0[:, j] below n0, y1[:, j - n0] below n0 + n1, else y2[:, j - n0 - n1] (stacked Q|K|V)
@cuda.jit
def _splitk_reduce_kernel(part, y0, y1, y2, n0, n1, accumulate):
    S, M, N = part.shape
    i = 4 * (cuda.blockIdx.x * REDUCE_THREADS + cuda.threadIdx.x)
    if i >= M * N:
        return
    row = i // N
    col = i - row * N
    v0 = part[0, row, col]
    v1 = part[0, row, col + 1]
    v2 = part[0, row, col + 2]
    v3 = part[0, row, col + 3]
    for s in range(1, S):
        v0 += part[s, row, col]
        v1 += part[s, row, col + 1]
        v2 += part[s, row, col + 2]
        v3 += part[s, row, col + 3]
    y = y0
    j = col
    if col >= n0 + n1:
        y = y2
        j = col - n0 - n1
    elif col >= n0:
        y = y1
        j = col - n0
    elif accumulate:
        v0 += y0[row, j]
        v1 += y0[row, j + 1]
        v2 += y0[row, j + 2]
        v3 += y0[row, j + 3]
    y[row, j] = v0
    y[row, j + 1] = v1
    y[row, j + 2] = v2
    y[row, j + 3] = v3


def _launch(a, w: PackedWeight, ys, n0: int, n1: int, part, stream, splits: int, accumulate: bool, bm: int,
            reduce: bool = True):
    N, K = w.rows, w.cols
    M = a.shape[0]
    assert a.dtype == np.float16 and a.shape == (M, K) and a.is_c_contiguous() and K % BK == 0 and N % 8 == 0
    for y in ys:
        assert y.dtype == np.float32 and y.is_c_contiguous() and y.shape[0] == M
    t = T(w.ggml_type)
    assert t in QUANT_TYPES and K % GGML_QUANT_SIZES[t][0] == 0, f"no split-K tile GEMM for {t.name}"
    assert 1 <= splits <= K // BK, f"{splits} splits of {K // BK} chunks"
    assert part.dtype == np.float32 and part.shape == (splits, M, N) and part.is_c_contiguous()
    tiles = -(-M // bm) * -(-N // BN)
    launch(gemm_splitk_kernel(t, bm), (tiles, splits), THREADS, stream, a, w.parts, part)
    if reduce:
        reduce_parts(part, ys, n0, n1, accumulate, stream)


def reduce_parts(part, ys, n0: int, n1: int, accumulate: bool, stream) -> None:
    """The S partial tiles part (S, M, N) added in split order into ys = (y0, y1, y2): C's column j
    to y0 below n0, y1 below n0 + n1, else y2 (one output: (c, c, c) with n0 = N); accumulate adds
    y0's own values."""
    M, N = part.shape[1], part.shape[2]
    launch(_splitk_reduce_kernel, -(-(M * N) // (4 * REDUCE_THREADS)), REDUCE_THREADS, stream, part, *ys,
           np.int32(n0), np.int32(n1), np.int32(accumulate))


def gemm_splitk(a, w: PackedWeight, c, part, stream, splits: int, accumulate: bool = False, bm: int = 64,
                reduce: bool = True):
    """c (M, N) float32 = a (M, K) fp16 · dequant(w)ᵀ (c += with accumulate) in `splits` K
    parts; part: a float32 scratch (splits, M, N); reduce=False leaves the partial products there."""
    check_shapes(a, c, w.rows, w.cols)
    _launch(a, w, (c, c, c), w.rows, 0, part, stream, splits, accumulate, bm, reduce)


def gemm_splitk_split(a, w: PackedWeight, ys, part, stream, splits: int, bm: int = 64, reduce: bool = True):
    """Rows of W stacked from up to three matrices (Q|K|V): ys[i] (M, N_i) = a · dequant(W rows of i)ᵀ,
    each N_i a multiple of 4; part and reduce as in gemm_splitk."""
    assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows and all(y.shape[1] % 4 == 0 for y in ys)
    y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
    n0, n1 = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0
    _launch(a, w, (y0, y1, y2), n0, n1, part, stream, splits, False, bm, reduce)


def splits_for(M: int, N: int, K: int, bm: int = 64, sms: int = 132) -> int:
    """Splits that bring the grid to about two blocks an SM, each at least 8 chunks of K deep."""
    tiles = -(-M // bm) * -(-N // BN)
    return max(1, min(-(-2 * sms // tiles), K // BK // 8))


F32_3D = types.Array(types.float32, 3, "C")


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemm_splitk_kernel(t, 64), types.void(F16_2D, parts_type(t), F32_3D), {"max_registers": 168})
        for t in (T.Q4_K, T.Q6_K, T.Q8_0)
    ] + [(_splitk_reduce_kernel, types.void(F32_3D, F32_2D, F32_2D, F32_2D, types.int32, types.int32, types.int32),
           {"max_registers": 64})]
