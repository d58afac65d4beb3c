"""Two weights of one input width in one int8 tensor-core GEMM launch on one x̂ (a layer's Q|K and
its V of another type, as Q4_K_M stores some layers'): gemm_mmq's block body (body_of) for each,
the kernel's blocks below nb1 taking the first weight's rows into part's columns 0 .. n1, the
others the second's from n1; one split-K reduce into Q | K | V (MatMul.pair, at
tuning.GEMM_PAIR_MMQ_ROWS).

Numpy reference: gemm_mmq.gemm_mmq_ref of each weight.
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemm.gemm_mmq import (GROUP, THREADS, XSTAGES, block_rows, body_of, mt_for, ni_for, slab_rows,
                                         splits_for, stage_bytes, supports)
from impnb.kernels.gemm.gemm_quant_splitk import F32_3D, reduce_parts
from impnb.kernels.gemm.quant_x32 import U32_2D, QuantX32, quantize_x32
from impnb.kernels.gemv.gemv import parts_type
from impnb.launch import launch


@lru_cache(maxsize=None)
def gemm_mmq_pair_kernel(type1, type2, ni: int, mt1: int = 1, mt2: int = 1):
    """The kernel of a type1 weight and a type2 weight, ni n8 token tiles a block, mt1 / mt2 m16
    tiles of W a warp."""
    body1, body2 = body_of(type1, ni, mt1), body_of(type2, ni, mt2)
    ring_words, align = XSTAGES * stage_bytes(8 * ni) // 4, ptx.SMEM_ALIGN

    # grid (nb1 + ceil(N2 / bn2), S, ceil(M / bm)); part (S, M, n1 + N2)
    def _gemm_mmq_pair_kernel(xq, xds, parts1, parts2, part, nb1, n1):
        smem = cuda.shared.array(ring_words, uint32, alignment=align)
        bx = cuda.blockIdx.x
        if bx < nb1:
            body1(xq, xds, parts1, part, bx, 0, n1, ptx.smem_addr(smem, 0))
        else:
            body2(xq, xds, parts2, part, bx - nb1, n1, part.shape[2] - n1, ptx.smem_addr(smem, 0))

    return cuda.jit(_gemm_mmq_pair_kernel)


def gemm_mmq_pair(x, xq: QuantX32, w1: PackedWeight, w2: PackedWeight, ys, part, stream, splits: int,
                  norm: tuple | None = None, reduce: bool = True, quantized: bool = False):
    """A layer's Q|K (w1: ys[0], ys[1] its rows in turn) and its V of another type (w2: ys[2]) of
    one input width on one x̂ in one launch, then one split-K reduce:
    ys[i] (M, N_i) = x̂ · dequant(rows of i)ᵀ, x̂ quantized from x (or RMSNorm(x) * wn with norm)
    into xq first (quantized: xq holds it already, written by another kernel, x read for its shape
    alone); part a float32 scratch (splits, M, w1.rows + w2.rows), where reduce=False leaves the
    partial products (ys untouched)."""
    M, K = x.shape
    y0, y1, y2 = ys
    n0, n1 = y0.shape[1], y1.shape[1]
    assert pair_supports(w1.ggml_type, w2.ggml_type, K) and w1.cols == K and w2.cols == K
    assert n0 + n1 == w1.rows and y2.shape[1] == w2.rows and all(y.shape[1] % 4 == 0 for y in ys)
    assert all(y.dtype == np.float32 and y.is_c_contiguous() and y.shape[0] == M for y in ys)
    assert 1 <= splits <= K // GROUP and part.shape == (splits, M, w1.rows + w2.rows) and part.is_c_contiguous()
    ni = ni_for(M)
    mt1, mt2 = mt_for(M, w1.rows), mt_for(M, w2.rows)
    assert xq.q.shape[1] == K // 4 and xq.q.shape[0] >= slab_rows(M)
    assert not (quantized and norm is not None)
    if not quantized:
        quantize_x32(x, xq, stream, norm)
    nb1 = -(-w1.rows // block_rows(mt1))
    launch(gemm_mmq_pair_kernel(T(w1.ggml_type), T(w2.ggml_type), ni, mt1, mt2),
           (nb1 + -(-w2.rows // block_rows(mt2)), splits, -(-M // (8 * ni))), THREADS, stream,
           xq.q, xq.ds, w1.parts, w2.parts, part, np.int32(nb1), np.int32(w1.rows))
    if reduce:
        reduce_parts(part, (y0, y1, y2), n0, n1, False, stream)


def pair_supports(type1, type2, K: int) -> bool:
    """Whether gemm_mmq_pair takes a Q|K of type1 and a V of type2 of input width K: two types it
    takes, told apart (one type stacks into one Linear)."""
    return T(type1) != T(type2) and supports(type1, K) and supports(type2, K)


def pair_splits(M: int, N1: int, N2: int, K: int, sms: int = 132) -> int:
    """splits_for the pair's blocks (both weights' row blocks at one W tile a warp, mt_for's
    choice for such rows)."""
    return splits_for(M, N1 + N2, K, sms, mt=min(mt_for(M, N1), mt_for(M, N2)))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py): a Q4_K
    Q|K with its Q6_K V (Q4_K_M's use_more_bits layers) at 8 and 16 tokens."""
    return [(gemm_mmq_pair_kernel(T.Q4_K, T.Q6_K, ni),
             types.void(U32_2D, F32_3D, parts_type(T.Q4_K), parts_type(T.Q6_K), F32_3D, types.int32, types.int32),
             {"max_registers": 255}) for ni in (1, 2)]
