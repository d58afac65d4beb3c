"""Final logit softcapping (Gemma): x = cap * tanh(x / cap) in place (numpy twin softcap_ref)."""

import math

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.launch import launch

THREADS = 256


def softcap_ref(x: np.ndarray, cap: float) -> np.ndarray:
    c = np.float32(cap)
    return (c * np.tanh(x.astype(np.float32) / c)).astype(np.float32)


# grid (ceil(N / THREADS), R), block THREADS: thread owns column i of row r. No shared memory.
@cuda.jit
def _softcap_kernel(x, cap, inv_cap):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    r = cuda.blockIdx.y
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < x.shape[1]:
        x[r, i] = cap * math.tanh(x[r, i] * inv_cap)


def softcap(x, cap: float, stream) -> None:
    """x (R, N) float32 = cap * tanh(x / cap), in place."""
    R, N = x.shape
    assert x.dtype == np.float32 and x.is_c_contiguous() and cap > 0
    if R and N:
        launch(_softcap_kernel, ((N + THREADS - 1) // THREADS, R), THREADS, stream, x,
               np.float32(cap), np.float32(1.0 / cap))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    return [
        (_softcap_kernel, (types.float32[:, ::1], types.float32, types.float32), {"max_registers": 32}),
    ]
