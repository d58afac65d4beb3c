"""RMSNorm: numpy reference and the CUDA kernels (plain, per-head, fused residual add)."""

import math

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import SIMULATOR, WARP, block_sum, warp_sum
from impnb.kernels.elementwise.reference import rms_norm_ref  # noqa: F401
from impnb.kernels.gemv.quant_x import GROUP, store_group_lanes
from impnb.launch import launch

WARP_ROWS_MAX_D = 256  # rows this short (per-head QK-norm) get a warp each, longer ones a block


# ---------------------------------------------------------------- kernels

@cuda.jit(device=True, inline=True)
def inv_rms(sum_sq, n, eps):
    """RMSNorm's scale 1 / sqrt(mean + eps) of a row of n values whose squares sum to sum_sq."""
    return np.float32(1) / np.float32(math.sqrt(sum_sq / np.float32(n) + eps))


@cuda.jit(device=True, inline=True)
def write_normed(x, row, inv, w, out):
    """Every thread of a block: out[row] = x[row] * inv * w, thread i on columns i, i + NT, ..."""
    for i in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        out[row, i] = x[row, i] * inv * w[i]


# grid (R,), block NT (128..1024): one block per row of D; thread i owns columns i, i + NT, ...
# shared: red f32[32] (one partial sum per warp). Pass 2 re-reads the row (L1) to scale it.
@cuda.jit
def _rms_norm_kernel(x, w, out, eps):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row = cuda.blockIdx.x
    D = x.shape[1]
    red = cuda.shared.array(32, types.float32)
    acc = np.float32(0)
    for i in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        v = x[row, i]
        acc += v * v
    write_normed(x, row, inv_rms(block_sum(acc, red), D, eps), w, out)


# grid (ceil(R / 4),), block (32, 4): warp y owns row 4 * block + y; lane owns columns lane, lane + 32, ...
# No shared memory. For per-head QK-norm (rows of head_dim) and other short rows.
@cuda.jit
def _rms_norm_warp_kernel(x, w, out, eps):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    if row >= x.shape[0]:  # the whole warp leaves together
        return
    D = x.shape[1]
    acc = np.float32(0)
    for i in range(cuda.threadIdx.x, D, WARP):
        v = x[row, i]
        acc += v * v
    inv = inv_rms(warp_sum(acc), D, eps)
    for i in range(cuda.threadIdx.x, D, WARP):
        out[row, i] = x[row, i] * inv * w[i]


# grid (R,), block NT: as _rms_norm_kernel; pass 1 writes x += h and sums its squares, pass 2
# re-reads the new x (same thread, same columns) and writes out = rms_norm(x) * w.
@cuda.jit
def _rms_norm_add_kernel(x, h, w, out, eps):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row = cuda.blockIdx.x
    D = x.shape[1]
    red = cuda.shared.array(32, types.float32)
    acc = np.float32(0)
    for i in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        v = x[row, i] + h[row, i]
        x[row, i] = v
        acc += v * v
    write_normed(x, row, inv_rms(block_sum(acc, red), D, eps), w, out)


@cuda.jit(device=True, inline=True)
def post_add_row(x, h, w_post, eps, row):
    """Every thread of a block: x[row] += rms_norm(h[row]) * w_post (pass 1 sums h², pass 2 writes
    x and sums its new squares); -> 1 / rms of the new x[row]."""
    D = x.shape[1]
    red = cuda.shared.array(32, types.float32)
    acc = np.float32(0)
    for i in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        v = h[row, i]
        acc += v * v
    inv_h = inv_rms(block_sum(acc, red), D, eps)
    acc = np.float32(0)
    for i in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        v = x[row, i] + h[row, i] * inv_h * w_post[i]
        x[row, i] = v
        acc += v * v
    return inv_rms(block_sum(acc, red), D, eps)


# grid (R,), block NT: Gemma's post-norm residual (post_add_row), then out = rms_norm(x) * w.
@cuda.jit
def _rms_norm_post_add_kernel(x, h, w_post, w, out, eps):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row = cuda.blockIdx.x
    write_normed(x, row, post_add_row(x, h, w_post, eps, row), w, out)


# As _rms_norm_post_add_kernel, out written in quant_x's int8 form too (q, d, s: its groups of
# GROUP columns, a half-warp a group, store_group_lanes: quantize_x's of out bit for bit) for the
# dp4a GEMV that reads it next; D a multiple of GROUP, the block a whole number of warps.
@cuda.jit
def _rms_norm_post_add_q_kernel(x, h, w_post, w, out, eps, q, d, s):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row = cuda.blockIdx.x
    D = x.shape[1]
    inv = post_add_row(x, h, w_post, eps, row)
    warp0 = cuda.threadIdx.x & ~31
    for c0 in range(0, D, cuda.blockDim.x):  # every lane, the shuffles' too
        i = c0 + cuda.threadIdx.x
        live = i < D
        v = np.float32(0)
        if live:
            v = x[row, i] * inv * w[i]
            out[row, i] = v
        store_group_lanes(v, live, q, d, s, row, (c0 + warp0) // GROUP)


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
        launch(_rms_norm_kernel, R, block_threads(D), stream, x2, _weight(w), out2, np.float32(eps))


def rms_norm_add(x, h, w, out, eps: float, stream) -> None:
    """x += h in place, then out = rms_norm(x) * w; x, h, out (T, D) float32, w (D,)."""
    D = w.shape[0]
    x2, h2, out2 = _rows(x, D, "x"), _rows(h, D, "h"), _rows(out, D, "out")
    assert x2.shape == h2.shape == out2.shape, "x, h, out differ in shape"
    if x2.shape[0]:
        launch(_rms_norm_add_kernel, x2.shape[0], block_threads(D), stream, x2, h2, _weight(w), out2,
               np.float32(eps))


def rms_norm_post_add(x, h, w_post, w, out, eps: float, stream, out_q=None) -> None:
    """Gemma's x += rms_norm(h) * w_post in place, then out = rms_norm(x) * w; (T, D) float32.
    out_q (quant_x.QuantX, D a multiple of its GROUP): out's int8 form there too, quantize_x's."""
    D = w.shape[0]
    x2, h2, out2 = _rows(x, D, "x"), _rows(h, D, "h"), _rows(out, D, "out")
    assert x2.shape == h2.shape == out2.shape and w_post.shape == (D,), "shapes differ"
    if not x2.shape[0]:
        return
    if out_q is None:
        launch(_rms_norm_post_add_kernel, x2.shape[0], block_threads(D), stream,
               x2, h2, _weight(w_post), _weight(w), out2, np.float32(eps))
        return
    T = x2.shape[0]
    assert D % GROUP == 0 and out_q.q.shape[0] >= T and out_q.q.shape[1] == D // 4 and out_q.d.shape[1] == D // GROUP
    launch(_rms_norm_post_add_q_kernel, T, block_threads(D), stream, x2, h2, _weight(w_post), _weight(w), out2,
           np.float32(eps), out_q.q[:T], out_q.d[:T], out_q.s[:T])


_ROWS = types.float32[:, ::1]
_W = types.float32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_rms_norm_kernel, (_ROWS, _W, _ROWS, types.float32), {"max_registers": 40}),
        (_rms_norm_warp_kernel, (_ROWS, _W, _ROWS, types.float32), {"max_registers": 40}),
        (_rms_norm_add_kernel, (_ROWS, _ROWS, _W, _ROWS, types.float32), {"max_registers": 48}),
        (_rms_norm_post_add_kernel, (_ROWS, _ROWS, _W, _W, _ROWS, types.float32), {"max_registers": 48}),
        (_rms_norm_post_add_q_kernel, (_ROWS, _ROWS, _W, _W, _ROWS, types.float32, types.uint32[:, ::1], _ROWS,
                                       _ROWS), {"max_registers": 48}),
    ]
