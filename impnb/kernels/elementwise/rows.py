"""Row gather: dst (1, D) = src[idx[0]] with the row index on the device, so a captured graph
reads whichever row the host chose at replay time (the last real row of a padded prompt chunk).
Numpy twin: `gather_row_ref`."""

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.launch import launch

NT = 128


def gather_row_ref(src: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return src[int(idx[0])][None, :].copy()


# grid ceil(D / 128), block 128: thread i of block b copies column 128 b + i.
@cuda.jit
def _gather_row_kernel(src, idx, dst):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    i = cuda.blockIdx.x * NT + cuda.threadIdx.x
    if i < dst.shape[1]:
        dst[0, i] = src[idx[0], i]


def gather_row(src, idx, dst, stream) -> None:
    """dst (1, D) = src (R, D)[idx[0]]; float32, idx int32 (1,) on the device, 0 <= idx[0] < R."""
    assert src.dtype == dst.dtype == np.float32 and src.ndim == dst.ndim == 2
    assert dst.shape == (1, src.shape[1]) and idx.dtype == np.int32 and src.is_c_contiguous()
    launch(_gather_row_kernel, -(-src.shape[1] // NT), NT, stream, src, idx, dst)


_F2 = types.float32[:, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(_gather_row_kernel, types.void(_F2, types.int32[::1], _F2), {"max_registers": 32})]
