"""The non-finite logits flag in the CUDA simulator, against its numpy twin."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.sample.nonfinite import CHUNK, NONFINITE_BIT, flag_nonfinite, flag_nonfinite_ref


@pytest.mark.parametrize("V", [1, 19, CHUNK + 7])
def test_flag_marks_rows_with_nan_or_inf_only(V):
    rng = np.random.default_rng(V)
    logits = rng.standard_normal((4, V)).astype(np.float32) * 30
    logits[1, V - 1] = np.nan
    logits[2, 0] = -np.inf
    logits[3, V // 2] = np.inf
    ids = rng.integers(0, V, 4).astype(np.int32)
    want = ids.copy()
    flag_nonfinite_ref(logits, want)
    out = cuda.to_device(ids)
    flag_nonfinite(cuda.to_device(logits), out, cuda.default_stream())
    got = out.copy_to_host()
    np.testing.assert_array_equal(got, want)
    assert got[0] == ids[0] and all(got[1:] & NONFINITE_BIT)
    np.testing.assert_array_equal(got & (NONFINITE_BIT - 1), ids)
