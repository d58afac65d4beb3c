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
# of 8) and adds part[0..S-1] there in order (plus C's own with accumulate)
@cuda.jit
def _splitk_reduce_kernel(part, c, accumulate):
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
    if accumulate:
        v0 += c[row, col]
        v1 += c[row, col + 1]
        v2 += c[row, col + 2]
        v3 += c[row, col + 3]
    c[row, col] = v0
    c[row, col + 1] = v1
    c[row, col + 2] = v2
    c[row, col + 3] = v3


def gemm_splitk(a, w: PackedWeight, c, part, stream, splits: int, accumulate: bool = False, bm: int = 64):
    """c (M, N) float32 = a (M, K) fp16 · dequant(w)ᵀ (c += with accumulate) in `splits` K
    parts; part: a float32 scratch of at least (splits, M, N)."""
    N, K = w.rows, w.cols
    check_shapes(a, c, N, K)
    t = T(w.ggml_type)
    assert t in QUANT_TYPES and K % GGML_QUANT_SIZES[t][0] == 0, f"no split-K tile GEMM for {t.name}"
    assert 1 <= splits <= K // BK, f"{splits} splits of {K // BK} chunks"
    M = a.shape[0]
    assert part.dtype == np.float32 and part.shape == (splits, M, N) and part.is_c_contiguous()
    tiles = -(-M // bm) * -(-N // BN)
    launch(gemm_splitk_kernel(t, bm), (tiles, splits), THREADS, stream, a, w.parts, part)
    launch(_splitk_reduce_kernel, -(-(M * N) // (4 * REDUCE_THREADS)), REDUCE_THREADS, stream, part, c,
           np.int32(accumulate))


def splits_for(M: int, N: int, K: int, bm: int = 64, sms: int = 132) -> int:
    """Splits that bring the grid to about two blocks an SM, each at least 8 chunks of K deep."""
    tiles = -(-M // bm) * -(-N // BN)
    return max(1, min(-(-2 * sms // tiles), K // BK // 8))


F32_3D = types.Array(types.float32, 3, "C")
BUILD_SIGNATURES = [
    (gemm_splitk_kernel(t, 64), types.void(F16_2D, parts_type(t), F32_3D), {"max_registers": 168})
    for t in (T.Q4_K, T.Q6_K, T.Q8_0)
] + [(_splitk_reduce_kernel, types.void(F32_3D, F32_2D, types.int32), {"max_registers": 64})]
