"""y *= sigmoid(g) over rows: the gate of Qwen3.5's gated attention (g as wide as y, one gate a
column) and of its shared expert (g one column, one gate a row)."""

import math

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.launch import launch

_ONE = np.float32(1)
_THREADS = 256


# grid (ceil(N / 256), R), block 256: thread owns column i of row r. No shared memory.
# g[r, i] gates y[r, i] (g as wide as y) or g[r, 0] gates the whole row (g one column wide).
@cuda.jit
def _sigmoid_gate_kernel(y, g):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    r = cuda.blockIdx.y
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < y.shape[1]:
        gate = g[r, i] if g.shape[1] == y.shape[1] else g[r, 0]
        y[r, i] = y[r, i] / (_ONE + math.exp(-gate))


def sigmoid_gate(y, g, stream) -> None:
    """y (R, N) float32 *= sigmoid(g) in place; g (R, N) (a gate a column) or (R, 1) (a row)."""
    for a, name in ((y, "y"), (g, "g")):
        assert a.dtype == np.float32 and a.ndim == 2 and a.is_c_contiguous(), f"{name}: (R, n) float32"
    R, N = y.shape
    assert g.shape in ((R, N), (R, 1)), (y.shape, g.shape)
    if R and N:
        launch(_sigmoid_gate_kernel, ((N + _THREADS - 1) // _THREADS, R), _THREADS, stream, y, g)


def sigmoid_gate_ref(y: np.ndarray, g: np.ndarray) -> np.ndarray:
    """y * sigmoid(g), g broadcast over the columns where it is one wide."""
    return (y / (np.float32(1) + np.exp(-g.astype(np.float32)))).astype(np.float32)


_F2 = types.float32[:, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(_sigmoid_gate_kernel, (_F2, _F2), {"max_registers": 32})]
