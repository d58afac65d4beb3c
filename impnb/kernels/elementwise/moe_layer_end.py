"""The end of a gemma4 layer with experts, one kernel (numpy twin moe_layer_end_ref): the dense MLP's
and the experts' outputs post-normed and summed, that sum post-normed into the residual, the
residual times the layer output scale, and the next layer's norm of it:
  z = RMSNorm(o) * w1 + RMSNorm(y) * w2;  x = (x + RMSNorm(z) * wf) * s;  h = RMSNorm(x) * wn
(four launches of norm.py and scale_norm.py otherwise)."""

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import block_sum
from impnb.kernels.elementwise.norm import block_threads, inv_rms
from impnb.kernels.elementwise.reference import rms_norm_ref
from impnb.launch import launch


def moe_layer_end_ref(x, o, y, w1, w2, wf, scale, wn, eps: float) -> tuple:
    """(new x, h); x, o, y (R, D) float32; scale (1,)."""
    z = rms_norm_ref(o, w1, eps) + rms_norm_ref(y, w2, eps)
    x = ((x + rms_norm_ref(z, wf, eps)) * scale.reshape(())).astype(np.float32)
    return x, rms_norm_ref(x, wn, eps)


# grid (R,), block NT (128..1024): one block per row of D; thread i owns columns i, i + NT, ...
# Pass 1 sums o² and y², pass 2 forms z (recomputed in pass 3 rather than stored) and sums z²,
# pass 3 writes the new x and sums its squares, pass 4 writes h; the same thread reads back the
# columns it wrote. shared: red f32[32] (block_sum).
@cuda.jit
def _moe_layer_end_kernel(x, o, y, w1, w2, wf, scale, wn, h, eps):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row = cuda.blockIdx.x
    D = x.shape[1]
    red = cuda.shared.array(32, types.float32)
    so = np.float32(0)
    sy = np.float32(0)
    for i in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        so += o[row, i] * o[row, i]
        sy += y[row, i] * y[row, i]
    io = inv_rms(block_sum(so, red), D, eps)
    iy = inv_rms(block_sum(sy, red), D, eps)
    sz = np.float32(0)
    for i in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        z = o[row, i] * io * w1[i] + y[row, i] * iy * w2[i]
        sz += z * z
    iz = inv_rms(block_sum(sz, red), D, eps)
    s = scale[0]
    sx = np.float32(0)
    for i in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        z = o[row, i] * io * w1[i] + y[row, i] * iy * w2[i]
        v = (x[row, i] + z * iz * wf[i]) * s
        x[row, i] = v
        sx += v * v
    ix = inv_rms(block_sum(sx, red), D, eps)
    for i in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        h[row, i] = x[row, i] * ix * wn[i]


def moe_layer_end(x, o, y, w1, w2, wf, scale, wn, h, eps: float, stream) -> None:
    """x (R, D) updated in place and h (R, D) written as moe_layer_end_ref; o, y (R, D), the norm
    weights (D,), scale (1,); float32."""
    R, D = x.shape
    for a in (x, o, y, h):
        assert a.shape == (R, D) and a.dtype == np.float32 and a.is_c_contiguous(), a.shape
    for w in (w1, w2, wf, wn):
        assert w.shape == (D,) and w.dtype == np.float32
    assert scale.shape == (1,) and scale.dtype == np.float32
    if R:
        launch(_moe_layer_end_kernel, R, block_threads(D), stream, x, o, y, w1, w2, wf, scale, wn, h,
               np.float32(eps))


_ROWS = types.float32[:, ::1]
_W = types.float32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    return [
        (_moe_layer_end_kernel, (_ROWS, _ROWS, _ROWS, _W, _W, _W, _W, _W, _ROWS, types.float32), {"max_registers": 48}),
    ]
