"""RMSNorm: numpy reference and the CUDA kernels (plain, per-head, fused residual add)."""

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import WARP, block_sum, warp_sum
from impnb.kernels.elementwise.reference import rms_norm_ref  # noqa: F401
from impnb.kernels.gemv.quant_x import GROUP, store_group_lanes
from impnb.launch import launch

WARP_ROWS_MAX_D = 256  # rows this short (per-head QK-norm) get a warp each, longer ones a block


# ---------------------------------------------------------------- kernels

@cuda.jit(device=True, inline=True)
def inv_rms(sum_sq, n, eps):
    """RMSNorm's scale 1 / sqrt(mean + eps) of a row of n values whose squares sum to sum_sq."""
    return np.float32(1) / np.float32(math.sqrt(sum_sq / np.float32(n) + eps))


WARP_COLS = WARP_ROWS_MAX_D // WARP  # a lane's columns of a row in _rms_norm_warp_kernel


# grid (ceil(R / 4),), block (32, 4): warp y owns row 4 * block + y; lane owns columns lane, lane + 32, ...
# (up to WARP_COLS), in registers: w loaded before griddepcontrol.wait, the row then at once, out
# stored after (out may be x). No shared memory. For per-head QK-norm (rows of head_dim) and
# other short rows.
@cuda.jit
def _rms_norm_warp_kernel(x, w, out, eps):
    D = x.shape[1]
    lane = cuda.threadIdx.x
    wv = cuda.local.array(WARP_COLS, types.float32)
    for c in range(WARP_COLS):
        wv[c] = w[lane + WARP * c] if lane + WARP * c < D else np.float32(0)
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    if row >= x.shape[0]:  # the whole warp leaves together
        return
    xv = cuda.local.array(WARP_COLS, types.float32)
    acc = np.float32(0)
    for c in range(WARP_COLS):
        xv[c] = x[row, lane + WARP * c] if lane + WARP * c < D else np.float32(0)
        acc += xv[c] * xv[c]
    inv = inv_rms(warp_sum(acc), D, eps)
    for c in range(WARP_COLS):
        if lane + WARP * c < D:
            out[row, lane + WARP * c] = xv[c] * inv * wv[c]


class RowKernels(NamedTuple):
    norm: object  # out = rms_norm(x) * w
    add: object  # x += h, then out = rms_norm(x) * w
    post_add: object  # x += rms_norm(h) * w_post, then out = rms_norm(x) * w
    post_add_q: object  # the same, out's int8 form written too


@lru_cache(maxsize=None)
def row_kernels(cols: int) -> RowKernels:
    """The block-per-row kernels for rows of at most `cols` columns a thread (block_threads' NT)."""

    @cuda.jit(device=True, inline=True)
    def load_cols(a, row, v):
        # -- v[c] = a[row, i + c NT], the thread's columns (0 past the row's end) --
        D = a.shape[1]
        for c in range(cols):
            i = cuda.threadIdx.x + c * cuda.blockDim.x
            v[c] = a[row, i] if i < D else np.float32(0)

    @cuda.jit(device=True, inline=True)
    def load_weight(w, v):
        D = w.shape[0]
        for c in range(cols):
            i = cuda.threadIdx.x + c * cuda.blockDim.x
            v[c] = w[i] if i < D else np.float32(0)

    @cuda.jit(device=True, inline=True)
    def inv_rms_of(v, D, eps, red):
        # -- 1 / rms of the block's row: the thread's squares in column order, then block_sum --
        acc = np.float32(0)
        for c in range(cols):
            if cuda.threadIdx.x + c * cuda.blockDim.x < D:
                acc += v[c] * v[c]
        return inv_rms(block_sum(acc, red), D, eps)

    @cuda.jit(device=True, inline=True)
    def store_cols(v, a, row):
        D = a.shape[1]
        for c in range(cols):
            i = cuda.threadIdx.x + c * cuda.blockDim.x
            if i < D:
                a[row, i] = v[c]

    @cuda.jit(device=True, inline=True)
    def store_normed(v, inv, wv, out, row):
        D = out.shape[1]
        for c in range(cols):
            i = cuda.threadIdx.x + c * cuda.blockDim.x
            if i < D:
                out[row, i] = v[c] * inv * wv[c]

    @cuda.jit(device=True, inline=True)
    def weight_then_wait(w, wv):
        # -- the thread's columns of a norm weight (no kernel writes it), then the wait --
        load_weight(w, wv)
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()

    @cuda.jit(device=True, inline=True)
    def post_add_row(x, h, w_post, w, eps, row, xv, wv, red):
        # -- the weights' columns (wv: w's), the wait, then xv = x[row] + rms_norm(h[row]) *
        # w_post, written back to x; -> 1 / rms of the new row --
        D = x.shape[1]
        wp = cuda.local.array(cols, types.float32)
        load_weight(w_post, wp)
        weight_then_wait(w, wv)
        hv = cuda.local.array(cols, types.float32)
        load_cols(h, row, hv)
        load_cols(x, row, xv)
        inv_h = inv_rms_of(hv, D, eps, red)
        for c in range(cols):
            xv[c] = xv[c] + hv[c] * inv_h * wp[c]
        inv = inv_rms_of(xv, D, eps, red)
        store_cols(xv, x, row)
        return inv

    # grid (R,), block NT (128..1024): one block per row of D; thread i owns columns i + c NT,
    # c < cols, their values in registers: the norm weights loaded before griddepcontrol.wait (no
    # kernel writes them), the row's inputs then all at once, the outputs stored after the last
    # load (a store before a load would hold the load for its round trip: x, h and out may
    # alias). Shared: red f32[32] (one partial sum a warp).
    @cuda.jit
    def _rms_norm_kernel(x, w, out, eps):
        wv = cuda.local.array(cols, types.float32)
        weight_then_wait(w, wv)
        row = cuda.blockIdx.x
        xv = cuda.local.array(cols, types.float32)
        load_cols(x, row, xv)
        store_normed(xv, inv_rms_of(xv, x.shape[1], eps, cuda.shared.array(32, types.float32)), wv, out, row)

    # as _rms_norm_kernel after x += h (x written back)
    @cuda.jit
    def _rms_norm_add_kernel(x, h, w, out, eps):
        wv = cuda.local.array(cols, types.float32)
        weight_then_wait(w, wv)
        xv = cuda.local.array(cols, types.float32)
        hv = cuda.local.array(cols, types.float32)
        load_cols(x, cuda.blockIdx.x, xv)
        load_cols(h, cuda.blockIdx.x, hv)
        for c in range(cols):
            xv[c] = xv[c] + hv[c]
        inv = inv_rms_of(xv, x.shape[1], eps, cuda.shared.array(32, types.float32))
        store_cols(xv, x, cuda.blockIdx.x)
        store_normed(xv, inv, wv, out, cuda.blockIdx.x)

    # as _rms_norm_kernel: Gemma's post-norm residual (post_add_row), then out = rms_norm(x) * w
    @cuda.jit
    def _rms_norm_post_add_kernel(x, h, w_post, w, out, eps):
        wv = cuda.local.array(cols, types.float32)
        xv = cuda.local.array(cols, types.float32)
        inv = post_add_row(x, h, w_post, w, eps, cuda.blockIdx.x, xv, wv, cuda.shared.array(32, types.float32))
        store_normed(xv, inv, wv, out, cuda.blockIdx.x)

    # as _rms_norm_post_add_kernel, out written in quant_x's int8 form too (q, d, s: its groups of
    # GROUP columns, a half-warp a group, store_group_lanes: quantize_x's of out bit for bit) for
    # the dp4a GEMV that reads it next; D a multiple of GROUP, the block a whole number of warps
    @cuda.jit
    def _rms_norm_post_add_q_kernel(x, h, w_post, w, out, eps, q, d, s):
        row = cuda.blockIdx.x
        nt = cuda.blockDim.x
        wv = cuda.local.array(cols, types.float32)
        xv = cuda.local.array(cols, types.float32)
        inv = post_add_row(x, h, w_post, w, eps, row, xv, wv, cuda.shared.array(32, types.float32))
        warp0 = cuda.threadIdx.x & ~31
        for c in range(cols):  # every lane of a column block, the shuffles' too
            if c * nt < x.shape[1]:
                i = c * nt + cuda.threadIdx.x
                live = i < x.shape[1]
                v = np.float32(0)
                if live:
                    v = xv[c] * inv * wv[c]
                    out[row, i] = v
                store_group_lanes(v, live, q, d, s, row, (c * nt + warp0) // GROUP)

    return RowKernels(_rms_norm_kernel, _rms_norm_add_kernel, _rms_norm_post_add_kernel, _rms_norm_post_add_q_kernel)


# ---------------------------------------------------------------- launchers

def _rows(a, D: int, name: str):
    """A C-contiguous float32 (..., D) device array viewed as (R, D)."""
    assert a.dtype == np.float32, f"{name}: float32 expected, got {a.dtype}"
    assert a.shape[a.ndim - 1] == D, f"{name}: last dim of {a.shape} != {D}"
    assert a.is_c_contiguous(), f"{name}: must be C-contiguous"
    return a.reshape(a.size // D, D) if a.ndim != 2 else a


def _weight(w):
    assert w.dtype == np.float32 and w.ndim == 1 and w.is_c_contiguous(), "weight: float32 (D,)"
    return w


def block_threads(D: int) -> int:
    """Threads per row for the block-per-row kernels: about 8 columns each, 128..1024."""
    nt = 128
    while nt < 1024 and nt * 8 < D:
        nt *= 2
    return nt


def _block_kernels(D: int) -> tuple[RowKernels, int]:
    """(row_kernels for rows of D, threads a block)."""
    nt = block_threads(D)
    return row_kernels((D + nt - 1) // nt), nt


def rms_norm(x, w, out, eps: float, stream) -> None:
    """out (..., D) = rms_norm(x (..., D)) * w (D,); float32. out may be x.

    Rows of D <= 256 (per-head QK-norm on (T, H, Dh)) take a warp each, longer rows a block.
    """
    D = w.shape[0]
    x2, out2 = _rows(x, D, "x"), _rows(out, D, "out")
    assert x2.shape == out2.shape, "x and out differ in shape"
    R = x2.shape[0]
    if R == 0:
        return
    if D <= WARP_ROWS_MAX_D:
        launch(_rms_norm_warp_kernel, (R + 3) // 4, (WARP, 4), stream, x2, _weight(w), out2,
               np.float32(eps))
    else:
        kernels, nt = _block_kernels(D)
        launch(kernels.norm, R, nt, stream, x2, _weight(w), out2, np.float32(eps))


def rms_norm_add(x, h, w, out, eps: float, stream) -> None:
    """x += h in place, then out = rms_norm(x) * w; x, h, out (T, D) float32, w (D,)."""
    D = w.shape[0]
    x2, h2, out2 = _rows(x, D, "x"), _rows(h, D, "h"), _rows(out, D, "out")
    assert x2.shape == h2.shape == out2.shape, "x, h, out differ in shape"
    if x2.shape[0]:
        kernels, nt = _block_kernels(D)
        launch(kernels.add, x2.shape[0], nt, stream, x2, h2, _weight(w), out2, np.float32(eps))


def rms_norm_post_add(x, h, w_post, w, out, eps: float, stream, out_q=None) -> None:
    """Gemma's x += rms_norm(h) * w_post in place, then out = rms_norm(x) * w; (T, D) float32.
    out_q (quant_x.QuantX, D a multiple of its GROUP): out's int8 form there too, quantize_x's."""
    D = w.shape[0]
    x2, h2, out2 = _rows(x, D, "x"), _rows(h, D, "h"), _rows(out, D, "out")
    assert x2.shape == h2.shape == out2.shape and w_post.shape == (D,), "shapes differ"
    if not x2.shape[0]:
        return
    kernels, nt = _block_kernels(D)
    if out_q is None:
        launch(kernels.post_add, x2.shape[0], nt, stream, x2, h2, _weight(w_post), _weight(w), out2, np.float32(eps))
        return
    T = x2.shape[0]
    assert D % GROUP == 0 and out_q.q.shape[0] >= T and out_q.q.shape[1] == D // 4 and out_q.d.shape[1] == D // GROUP
    launch(kernels.post_add_q, T, nt, stream, x2, h2, _weight(w_post), _weight(w), out2,
           np.float32(eps), out_q.q[:T], out_q.d[:T], out_q.s[:T])


_ROWS = types.float32[:, ::1]
_W = types.float32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    f32 = types.float32
    sigs = RowKernels((_ROWS, _W, _ROWS, f32), (_ROWS, _ROWS, _W, _ROWS, f32), (_ROWS, _ROWS, _W, _W, _ROWS, f32),
                      (_ROWS, _ROWS, _W, _W, _ROWS, f32, types.uint32[:, ::1], _ROWS, _ROWS))
    # columns a thread: Gemma3-270M's 640 (5), the most (8: 87 registers in the post-norms)
    return [(_rms_norm_warp_kernel, (_ROWS, _W, _ROWS, f32), {"max_registers": 64})] + [
        (kernel, sig, {"max_registers": 96}) for cols in (5, 8) for kernel, sig in zip(row_kernels(cols), sigs)]
