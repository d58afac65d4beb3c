"""Gemma 4's layer output scale: the residual times a per-layer scalar, then the next layer's
RMSNorm of it, in one kernel (numpy twin scale_rms_norm_ref)."""

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import block_sum
from impnb.kernels.elementwise.norm import block_threads, inv_rms
from impnb.kernels.elementwise.reference import rms_norm_ref
from impnb.launch import launch


def scale_rms_norm_ref(x: np.ndarray, scale: np.ndarray, w: np.ndarray, eps: float) -> tuple:
    """(x * scale[0], rms_norm_ref(x * scale[0], w, eps)); x (R, D) float32."""
    xs = (x * scale.reshape(())).astype(np.float32)
    return xs, rms_norm_ref(xs, w, eps)


COLS = 8  # columns a thread holds in registers: block_threads gives at most 8 a thread to D = 8192


# grid (R,), block NT (128..1024): one block per row of D; thread i owns columns i + c NT, c < COLS,
# in registers: w loaded before griddepcontrol.wait, the row then at once, x *= s and out = x /
# rms(x) * w stored after the last load (x and out may alias). shared: red f32[32] (block_sum).
@cuda.jit
def _scale_rms_norm_kernel(x, scale, w, out, eps):
    D = x.shape[1]
    nt = cuda.blockDim.x
    t = cuda.threadIdx.x
    wv = cuda.local.array(COLS, types.float32)
    for c in range(COLS):
        wv[c] = w[t + c * nt] if t + c * nt < D else np.float32(0)
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row = cuda.blockIdx.x
    red = cuda.shared.array(32, types.float32)
    s = scale[0]
    xv = cuda.local.array(COLS, types.float32)
    acc = np.float32(0)
    for c in range(COLS):
        if t + c * nt < D:
            xv[c] = x[row, t + c * nt] * s
            acc += xv[c] * xv[c]
    inv = inv_rms(block_sum(acc, red), D, eps)
    for c in range(COLS):
        if t + c * nt < D:
            x[row, t + c * nt] = xv[c]
            out[row, t + c * nt] = xv[c] * inv * wv[c]


def scale_rms_norm(x, scale, w, out, eps: float, stream) -> None:
    """x (R, D) *= scale (1,) in place, then out (R, D) = rms_norm(x) * w (D,); float32."""
    R, D = x.shape
    assert x.dtype == out.dtype == scale.dtype == w.dtype == np.float32, "float32"
    assert out.shape == (R, D) and w.shape == (D,) and scale.shape == (1,), (x.shape, out.shape, w.shape)
    assert x.is_c_contiguous() and out.is_c_contiguous()
    assert D <= COLS * block_threads(D), f"scale_rms_norm takes rows of up to {COLS * 1024} values, not {D}"
    if R:
        launch(_scale_rms_norm_kernel, R, block_threads(D), stream, x, scale, w, out, np.float32(eps))


_ROWS = types.float32[:, ::1]
_W = types.float32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    return [
        (_scale_rms_norm_kernel, (_ROWS, _W, _W, _ROWS, types.float32), {"max_registers": 64}),
    ]
