"""Gemma 4's layer output scale: the residual times a per-layer scalar, then the next layer's
RMSNorm of it, in one kernel (numpy twin scale_rms_norm_ref)."""

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import block_sum
from impnb.kernels.elementwise.norm import block_threads, inv_rms, write_normed
from impnb.kernels.elementwise.reference import rms_norm_ref
from impnb.launch import launch


def scale_rms_norm_ref(x: np.ndarray, scale: np.ndarray, w: np.ndarray, eps: float) -> tuple:
    """(x * scale[0], rms_norm_ref(x * scale[0], w, eps)); x (R, D) float32."""
    xs = (x * scale.reshape(())).astype(np.float32)
    return xs, rms_norm_ref(xs, w, eps)


# grid (R,), block NT (128..1024): one block per row of D; thread i owns columns i, i + NT, ...
# Pass 1 writes x *= s and sums the squares, pass 2 re-reads the same thread's columns of x and
# writes out = x / rms(x) * w. shared: red f32[32] (block_sum).
@cuda.jit
def _scale_rms_norm_kernel(x, scale, w, out, eps):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row = cuda.blockIdx.x
    D = x.shape[1]
    red = cuda.shared.array(32, types.float32)
    s = scale[0]
    acc = np.float32(0)
    for i in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        v = x[row, i] * s
        x[row, i] = v
        acc += v * v
    write_normed(x, row, inv_rms(block_sum(acc, red), D, eps), w, out)


def scale_rms_norm(x, scale, w, out, eps: float, stream) -> None:
    """x (R, D) *= scale (1,) in place, then out (R, D) = rms_norm(x) * w (D,); float32."""
    R, D = x.shape
    assert x.dtype == out.dtype == scale.dtype == w.dtype == np.float32, "float32"
    assert out.shape == (R, D) and w.shape == (D,) and scale.shape == (1,), (x.shape, out.shape, w.shape)
    assert x.is_c_contiguous() and out.is_c_contiguous()
    if R:
        launch(_scale_rms_norm_kernel, R, block_threads(D), stream, x, scale, w, out, np.float32(eps))


_ROWS = types.float32[:, ::1]
_W = types.float32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    return [
        (_scale_rms_norm_kernel, (_ROWS, _W, _W, _ROWS, types.float32), {"max_registers": 40}),
    ]
