"""Gemma 4's per-layer embedding inputs (PLE), made once a step from the token's own per-layer
embedding and a projection of its main one (numpy twin per_layer_inputs_ref, as
models/gemma4_ops.Gemma4Ops.embed):
  out[l, t] = (rms_norm(proj[t, l] * proj_scale) * w + own[t, l]) * 2^-1/2
Legend: T tokens, L layers, P the per-layer width; proj and own (T, L * P), out (L, T, P): layer l's
inputs are one contiguous (T, P) block, what each layer's gate multiplies."""

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import WARP, warp_sum
from impnb.kernels.elementwise.norm import inv_rms
from impnb.kernels.elementwise.reference import rms_norm_ref
from impnb.launch import launch

ROWS = 4  # warps (rows) a block
HALF_SQRT2 = np.float32(2.0 ** -0.5)


def per_layer_inputs_ref(proj: np.ndarray, own: np.ndarray, w: np.ndarray, proj_scale: float, eps: float) -> np.ndarray:
    """proj, own (T, L * P), w (P,) -> (L, T, P) float32."""
    T, P = proj.shape[0], w.shape[0]
    p = rms_norm_ref(proj.reshape(T, -1, P) * np.float32(proj_scale), w, eps)
    return ((p + own.reshape(T, -1, P)) * HALF_SQRT2).astype(np.float32).transpose(1, 0, 2).copy()


# grid (ceil(T * L / ROWS),), block (32, ROWS): warp y owns row r = (t, l) = divmod(r, L); lane owns
# columns lane, lane + 32, ... of it. No shared memory.
@cuda.jit
def _per_layer_inputs_kernel(proj, own, w, out, proj_scale, eps):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    L, T, P = out.shape
    r = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    if r >= T * L:  # the whole warp leaves together
        return
    t = r // L
    l0 = (r - t * L) * P
    acc = np.float32(0)
    for i in range(cuda.threadIdx.x, P, WARP):
        v = proj[t, l0 + i] * proj_scale
        acc += v * v
    inv = inv_rms(warp_sum(acc), P, eps)
    for i in range(cuda.threadIdx.x, P, WARP):
        v = proj[t, l0 + i] * proj_scale
        out[r - t * L, t, i] = (v * inv * w[i] + own[t, l0 + i]) * HALF_SQRT2


def per_layer_inputs(proj, own, w, out, proj_scale: float, eps: float, stream) -> None:
    """out (L, T, P) from proj, own (T, L * P) and the norm weight w (P,); float32."""
    L, T, P = out.shape
    assert proj.shape == own.shape == (T, L * P) and w.shape == (P,), (proj.shape, own.shape, out.shape, w.shape)
    for a in (proj, own, out, w):
        assert a.dtype == np.float32 and a.is_c_contiguous()
    if T:
        launch(_per_layer_inputs_kernel, (T * L + ROWS - 1) // ROWS, (WARP, ROWS), stream, proj, own, w, out,
               np.float32(proj_scale), np.float32(eps))


_F2 = types.float32[:, ::1]
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    return [
        (_per_layer_inputs_kernel, (_F2, _F2, types.float32[::1], types.float32[:, :, ::1], types.float32,
                                    types.float32), {"max_registers": 40}),
    ]
