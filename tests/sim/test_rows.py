"""kernels/elementwise/rows.py's gather in numba's CUDA simulator, against gather_row_ref."""

import numpy as np
from numba import cuda

from impnb.kernels.elementwise.rows import gather_row, gather_row_ref


def test_gather_row():
    rng = np.random.default_rng(1)
    src = (rng.standard_normal((19, 300)) * 10).astype(np.float32)
    for row in (0, 7, 18):
        idx = np.array([row], np.int32)
        d_dst = cuda.to_device(np.full((1, 300), np.nan, np.float32))
        gather_row(cuda.to_device(src), cuda.to_device(idx), d_dst, 0)
        assert np.array_equal(d_dst.copy_to_host(), gather_row_ref(src, idx))
