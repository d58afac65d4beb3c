"""The end of a gemma4 layer with experts, one kernel (numpy twin moe_layer_end_ref): the dense MLP's
and the experts' outputs post-normed and summed, that sum post-normed into the residual, the
residual times the layer output scale, and the next layer's norm of it:
  z = RMSNorm(o) * w1 + RMSNorm(y) * w2;  x = (x + RMSNorm(z) * wf) * s;  h = RMSNorm(x) * wn
(four launches of norm.py and scale_norm.py otherwise)."""

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import block_sum, warp_sum
from impnb.kernels.elementwise.norm import block_threads, inv_rms
from impnb.kernels.elementwise.reference import rms_norm_ref
from impnb.launch import launch


def moe_layer_end_ref(x, o, y, w1, w2, wf, scale, wn, eps: float) -> tuple:
    """(new x, h); x, o, y (R, D) float32; scale (1,)."""
    z = rms_norm_ref(o, w1, eps) + rms_norm_ref(y, w2, eps)
    x = ((x + rms_norm_ref(z, wf, eps)) * scale.reshape(())).astype(np.float32)
    return x, rms_norm_ref(x, wn, eps)


COLS = 8  # columns a thread holds in registers: block_threads gives at most 8 a thread to D = 8192


@cuda.jit(device=True, inline=True)
def _block_sum2(a, b, red):
    """block_sum of two values at once (one pair of barriers): red shared f32[64]."""
    tid = cuda.threadIdx.x
    a = warp_sum(a)
    b = warp_sum(b)
    if tid % 32 == 0:
        red[tid // 32] = a
        red[32 + tid // 32] = b
    cuda.syncthreads()
    lane = tid % 32
    live = lane < cuda.blockDim.x // 32
    a = warp_sum(red[lane] if live else np.float32(0))
    b = warp_sum(red[32 + lane] if live else np.float32(0))
    cuda.syncthreads()  # red may be reused
    return a, b


# grid (R,), block NT (128..1024): one block per row of D; thread i owns columns i + c NT, c < COLS,
# their values in registers: the four norm weights loaded before griddepcontrol.wait (no kernel
# writes them), then o, y and x in one go; the squares of o and y summed together, then z's, then
# the new x's (three block sums, one round trip to memory), the stores after the last load (x and h
# may alias). shared: red f32[64].
@cuda.jit
def _moe_layer_end_kernel(x, o, y, w1, w2, wf, scale, wn, h, eps):
    row = cuda.blockIdx.x
    D = x.shape[1]
    nt = cuda.blockDim.x
    t = cuda.threadIdx.x
    red = cuda.shared.array(64, types.float32)
    a1 = cuda.local.array(COLS, types.float32)
    a2 = cuda.local.array(COLS, types.float32)
    af = cuda.local.array(COLS, types.float32)
    an = cuda.local.array(COLS, types.float32)
    ov = cuda.local.array(COLS, types.float32)
    yv = cuda.local.array(COLS, types.float32)
    xv = cuda.local.array(COLS, types.float32)
    for c in range(COLS):
        i = t + c * nt
        if i < D:
            a1[c] = w1[i]
            a2[c] = w2[i]
            af[c] = wf[i]
            an[c] = wn[i]
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    so = np.float32(0)
    sy = np.float32(0)
    for c in range(COLS):
        i = t + c * nt
        if i < D:
            ov[c] = o[row, i]
            yv[c] = y[row, i]
            xv[c] = x[row, i]
            so += ov[c] * ov[c]
            sy += yv[c] * yv[c]
    so, sy = _block_sum2(so, sy, red)
    io = inv_rms(so, D, eps)
    iy = inv_rms(sy, D, eps)
    sz = np.float32(0)
    for c in range(COLS):
        if t + c * nt < D:
            z = ov[c] * io * a1[c] + yv[c] * iy * a2[c]
            ov[c] = z
            sz += z * z
    iz = inv_rms(block_sum(sz, red), D, eps)
    s = scale[0]
    sx = np.float32(0)
    for c in range(COLS):
        i = t + c * nt
        if i < D:
            v = (xv[c] + ov[c] * iz * af[c]) * s
            yv[c] = v
            sx += v * v
    ix = inv_rms(block_sum(sx, red), D, eps)
    for c in range(COLS):
        i = t + c * nt
        if i < D:
            x[row, i] = yv[c]
            h[row, i] = yv[c] * ix * an[c]


def moe_layer_end(x, o, y, w1, w2, wf, scale, wn, h, eps: float, stream) -> None:
    """x (R, D) updated in place and h (R, D) written as moe_layer_end_ref; o, y (R, D), the norm
    weights (D,), scale (1,); float32."""
    R, D = x.shape
    for a in (x, o, y, h):
        assert a.shape == (R, D) and a.dtype == np.float32 and a.is_c_contiguous(), a.shape
    for w in (w1, w2, wf, wn):
        assert w.shape == (D,) and w.dtype == np.float32
    assert scale.shape == (1,) and scale.dtype == np.float32
    assert D <= COLS * block_threads(D), f"moe_layer_end takes rows of up to {COLS * 1024} values, not {D}"
    if R:
        launch(_moe_layer_end_kernel, R, block_threads(D), stream, x, o, y, w1, w2, wf, scale, wn, h,
               np.float32(eps))


_ROWS = types.float32[:, ::1]
_W = types.float32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    return [
        (_moe_layer_end_kernel, (_ROWS, _ROWS, _ROWS, _W, _W, _W, _W, _W, _ROWS, types.float32), {"max_registers": 96}),
    ]
