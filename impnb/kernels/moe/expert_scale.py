"""Gemma 4's per-expert output scale on the routing weights: weights[t, j] *= scale[experts[t, j]]
(numpy twin expert_scale_ref), after moe_route; the combine then weighs each expert's output by it."""

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.launch import launch

THREADS = 128


def expert_scale_ref(experts: np.ndarray, weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (weights * scale[experts]).astype(np.float32)


# grid (ceil(T * k / THREADS),), block THREADS: thread owns slot s = t * k + j. No shared memory.
@cuda.jit
def _expert_scale_kernel(experts, weights, scale):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    s = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    k = weights.shape[1]
    if s < weights.shape[0] * k:
        t = s // k
        j = s - t * k
        weights[t, j] = weights[t, j] * scale[experts[t, j]]


def expert_scale(experts, weights, scale, stream) -> None:
    """weights (T, k) float32 *= scale (E,) float32 at experts (T, k) int32, in place."""
    T, k = weights.shape
    assert experts.shape == (T, k) and experts.dtype == np.int32 and weights.dtype == scale.dtype == np.float32
    assert weights.is_c_contiguous() and experts.is_c_contiguous() and scale.ndim == 1
    if T:
        launch(_expert_scale_kernel, (T * k + THREADS - 1) // THREADS, THREADS, stream, experts, weights, scale)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    return [
        (_expert_scale_kernel, (types.int32[:, ::1], types.float32[:, ::1], types.float32[::1]),
         {"max_registers": 32}),
    ]
