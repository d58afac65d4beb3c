"""Decode GEMV with the residual norm in its prologue: one kernel instead of norm + GEMV.

For one token (T = 1): every block forms x' = x + o (Gemma: x + rms_norm(o) * w_post), writes
x' to x_out (block 0 only; x_out is not x, so no block reads what another writes), normalizes
h = rms_norm(x') * w in shared memory and runs the GEMV of gemv.py on h. The norm arithmetic is
norm.py's (same reduction order at 128 threads), so h equals what rms_norm_add would produce.
Numpy reference: `gemv_norm_ref`.
"""

import math
from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, types

from impnb.kernels import ptx
from impnb.kernels.gemv import (BLOCK, DECODERS, GELU, NO_GLU, SILU, _aligned16, _parts_type, gemv_body,
                                gemv_ref, glu_fits, rows_per_block, span_for)
from impnb.kernels.norm import block_sum, rms_norm_ref
from impnb.launch import launch

ADD, POST_ADD = 1, 2  # x' = x + o; x' = x + rms_norm(o) * w_post
MAX_K = 8192          # h lives in shared memory: 32 KB at most


def gemv_norm_ref(w: np.ndarray, ggml_type: T, x, o, w_post, w_norm, eps: float):
    """Raw GGUF weight bytes (N, row_bytes), x and o (1, K) float32 -> (x' (1, K) float32,
    W · (rms_norm(x') * w_norm) (1, N) float64)."""
    x_new = x + (rms_norm_ref(o, w_post, eps) if w_post is not None else o)
    return x_new, gemv_ref(w, ggml_type, rms_norm_ref(x_new, w_norm, eps))


@cuda.jit(device=True, inline=True)
def _lds_f32x4(a, i):
    return a[i], a[i + 1], a[i + 2], a[i + 3]


def _make_gemv_norm(load, unit, col, span, rows, glu, mode):
    body = gemv_body(load, unit, col, 1, span, rows, glu, _lds_f32x4)
    post = mode == POST_ADD

    # grid and block as gemv.py's kernel; shared (dynamic): h f32[K], plus red f32[32] for the
    # block sums. Thread i owns columns i, i + 128, ... of the prologue.
    @cuda.jit
    def _gemv_norm_kernel(parts, x, o, w_post, w_norm, x_out, eps, y0, y1, y2, n0, n1, n_rows,
                          accumulate):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        K = x.shape[1]
        tid = cuda.threadIdx.x
        h = cuda.shared.array(0, float32)
        red = cuda.shared.array(32, float32)
        inv_o = float32(1)
        if post:
            acc = float32(0)
            for i in range(tid, K, BLOCK):
                v = o[0, i]
                acc += v * v
            inv_o = float32(1) / float32(math.sqrt(block_sum(acc, red) / float32(K) + eps))
        acc = float32(0)
        for i in range(tid, K, BLOCK):
            v = x[0, i] + (o[0, i] * inv_o * w_post[i] if post else o[0, i])
            h[i] = v
            if cuda.blockIdx.x == 0:
                x_out[0, i] = v
            acc += v * v
        inv = float32(1) / float32(math.sqrt(block_sum(acc, red) / float32(K) + eps))
        for i in range(tid, K, BLOCK):
            h[i] = h[i] * inv * w_norm[i]
        cuda.syncthreads()
        body(parts, h, K, y0, y1, y2, n0, n1, n_rows, accumulate)

    return _gemv_norm_kernel


@lru_cache(maxsize=None)
def gemv_norm_kernel(ggml_type: T, span: int, glu: int, mode: int):
    ggml_type = T(ggml_type)
    rows = rows_per_block(ggml_type, 1)
    assert glu == NO_GLU or rows % 2 == 0, "GLU needs an even number of rows per group"
    return _make_gemv_norm(*DECODERS[ggml_type], span, rows, glu, mode)


def fits(w, n_tok: int, glu: bool = False) -> bool:
    """Whether the fused kernel takes this weight and token count."""
    return n_tok == 1 and w.cols <= MAX_K and (not glu or glu_fits(w, 1))


def gemv_norm(w, x, o, w_post, w_norm, x_out, eps: float, ys, stream, glu: int = NO_GLU):
    """x_out (1, K) = x + o (or + rms_norm(o) * w_post), then ys = W · (rms_norm(x_out) * w_norm):
    ys one to three outputs for rows stacked Q|K|V, or with glu (SILU/GELU) y (1, F) =
    act(W[:F] h) * W[F:] h. All float32; x_out must not be x."""
    K = w.cols
    assert fits(w, 1, glu != NO_GLU) and x.shape == o.shape == x_out.shape == (1, K)
    assert x_out is not x, "x_out must be another buffer than x"
    for a in (x, o, x_out, *ys):
        assert a.dtype == np.float32 and a.is_c_contiguous() and _aligned16(a)
    if glu != NO_GLU:
        (y,) = ys
        assert glu in (SILU, GELU) and y.shape == (1, w.rows // 2)
        y0 = y1 = y2 = y
        n0, n1, out_rows = w.rows // 2, 0, w.rows // 2
    else:
        assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows
        y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
        n0, n1, out_rows = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0, w.rows
    span = span_for(K)
    per_block = rows_per_block(w.ggml_type, 1) // (2 if glu else 1) * BLOCK // span
    mode = POST_ADD if w_post is not None else ADD
    launch(gemv_norm_kernel(w.ggml_type, span, glu, mode), -(-out_rows // per_block), BLOCK, stream,
           w.parts, x, o, w_post if w_post is not None else w_norm, w_norm, x_out, np.float32(eps),
           y0, y1, y2, np.int32(n0), np.int32(n1), np.int32(w.rows), np.int32(0),
           shared_bytes=4 * K)


_F32_2D = types.Array(types.float32, 2, "C")
_F32_1D = types.Array(types.float32, 1, "C")
_I32 = types.int32
BUILD_SIGNATURES = [
    (gemv_norm_kernel(t, span, glu, mode),
     types.void(_parts_type(t), _F32_2D, _F32_2D, _F32_1D, _F32_1D, _F32_2D, types.float32,
                _F32_2D, _F32_2D, _F32_2D, _I32, _I32, _I32, _I32),
     {"max_registers": 112})
    for t in DECODERS
    for span, glu, mode in ((32, NO_GLU, ADD), (32, SILU, ADD), (BLOCK, GELU, POST_ADD),
                            (32, NO_GLU, POST_ADD))
    if glu == NO_GLU or rows_per_block(t, 1) % 2 == 0
]
