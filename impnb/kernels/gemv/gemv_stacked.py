"""Decode GEMVs on stacked weights: gemv_split's rows of several matrices (fused Q|K|V) into up to
three outputs, gemv_pair's two weights of two types in one launch, gemv_glu's gate|up through its
activation; the kernels are gemv.py's."""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, types

from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemv.gemv import (F32_2D, MAX_T, aligned16, launch_rows, out_per_block, parts_type,
                                     variant_kernel)
from impnb.kernels.gemv.gemv_units import GELU, NO_GLU, SILU
from impnb.kernels.gemv.gemv_variants import BLOCK, Variant, choose
from impnb.launch import launch

_I32 = types.int32


def gemv_split(w: PackedWeight, x, ys, stream, variant: Variant | None = None, norm: tuple | None = None):
    """Rows of W stacked from several matrices (fused Q|K|V): ys[i] (T, N_i) = W[rows of i] x;
    one to three outputs whose N_i sum to W's rows; norm as in gemv."""
    assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows
    y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
    n0, n1 = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0
    launch_rows(w, x, y0, y1, y2, n0, n1, w.rows, NO_GLU, stream, False, variant, norm)


@lru_cache(maxsize=None)
def pair_kernel(type_a: T, va: Variant, type_b: T, vb: Variant, n_tok: int, cols: int):
    """gemv_pair's kernel: the normed GEMVs of a type_a and a type_b weight (variants va, vb) over
    one x of cols columns."""
    block_a = variant_kernel(type_a, n_tok, va, normed=True, cols=cols, block_fn=True)
    block_b = variant_kernel(type_b, n_tok, vb, normed=True, cols=cols, block_fn=True)

    # grid (blocks_a + blocks_b,), block BLOCK: blocks below blocks_a are A's GEMV into y0 | y1
    # (its rows split at n0), the rest B's into yb
    @cuda.jit
    def _gemv_pair_kernel(parts_a, parts_b, x, wn, eps, y0, y1, n0, rows_a, yb, rows_b, blocks_a):
        if cuda.blockIdx.x < blocks_a:
            block_a(parts_a, x, wn, eps, y0, y1, y1, n0, rows_a - n0, rows_a, 0, cuda.blockIdx.x)
        else:
            block_b(parts_b, x, wn, eps, yb, yb, yb, rows_b, 0, rows_b, 0, cuda.blockIdx.x - blocks_a)

    return _gemv_pair_kernel


def gemv_pair(wa: PackedWeight, ys_a, wb: PackedWeight, yb, x, norm: tuple, stream):
    """gemv_split(wa, x, ys_a) and gemv(wb, x, yb), both with norm (wn, eps), as one launch for
    weights of two types (a layer's Q|K and a V of another type): ys_a = (y0, y1) (T, N_i) of
    wa's stacked rows, yb (T, N_b); x (T, K) float32."""
    n_tok, K = x.shape
    y0, y1 = ys_a
    assert wa.cols == wb.cols == K and y0.shape[1] + y1.shape[1] == wa.rows and yb.shape == (n_tok, wb.rows)
    assert x.dtype == np.float32 and x.is_c_contiguous() and aligned16(x)
    for y in (y0, y1, yb):
        assert y.dtype == np.float32 and y.is_c_contiguous() and y.shape[0] == n_tok
    wn, eps = norm
    assert wn.dtype == np.float32 and wn.shape == (K,) and aligned16(wn)
    va, vb = choose(wa.ggml_type, n_tok, K, wa.rows), choose(wb.ggml_type, n_tok, K, wb.rows)
    blocks_a = -(-wa.rows // out_per_block(va, NO_GLU))
    blocks_b = -(-wb.rows // out_per_block(vb, NO_GLU))
    launch(pair_kernel(wa.ggml_type, va, wb.ggml_type, vb, n_tok, K), blocks_a + blocks_b, BLOCK, stream,
           wa.parts, wb.parts, x, wn, np.float32(eps), y0, y1, np.int32(y0.shape[1]), np.int32(wa.rows), yb,
           np.int32(wb.rows), np.int32(blocks_a))


def glu_fits(w: PackedWeight, n_tok: int) -> bool:
    """Whether gemv_glu runs for this weight and token count (an even number of rows per group)."""
    return n_tok <= MAX_T and choose(w.ggml_type, n_tok, w.cols, w.rows).rows % 2 == 0


def gemv_glu(w: PackedWeight, x, y, act: int, stream, variant: Variant | None = None,
             norm: tuple | None = None):
    """Gate|up stacked (2F, K): y (T, F) = act(W[:F] x) * W[F:] x, act SILU or GELU (tanh);
    norm as in gemv."""
    assert act in (SILU, GELU) and w.rows % 2 == 0 and y.shape == (x.shape[0], w.rows // 2)
    assert (variant.rows % 2 == 0) if variant else glu_fits(w, x.shape[0]), "gemv_glu: odd rows per group"
    launch_rows(w, x, y, y, y, w.rows // 2, 0, w.rows // 2, act, stream, False, variant, norm)


def pair_args(type_a: T, type_b: T) -> tuple:
    """Argument types of pair_kernel's kernel: parts_a, parts_b, x, wn, eps, y0, y1, n0, rows_a,
    yb, rows_b, blocks_a."""
    return (parts_type(type_a), parts_type(type_b), F32_2D, types.Array(types.float32, 1, "C"), types.float32,
            F32_2D, F32_2D, _I32, _I32, F32_2D, _I32, _I32)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [  # Q|K and V of two types (Qwen3-30B-A3B Q4_K_M: Q4_K and Q6_K at K 2048), T 1 and 2
        (pair_kernel(a, choose(a, n, 2048, 1), b, choose(b, n, 2048, 1), n, 2048), types.void(*pair_args(a, b)),
         {"max_registers": 136})
        for a, b in ((T.Q4_K, T.Q6_K),) for n in (1, 2)
    ]
