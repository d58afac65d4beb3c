"""gemv_gated in numba's CUDA simulator: tests/gpu/test_gemv_gated.py's check on tiny shapes, each
weight type once, odd row counts, T 1..8, x at std 0.1, 1 and 10, stored and accumulated, row groups
of one warp and of two (the shared-memory reduction), the gate buffer's row stride past the column
read (its tolerance)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from impnb.kernels.gemv.gemv_variants import Variant
from tests.gpu.test_gemv_gated import check_gemv_gated

CASES = [  # type, N, K, T, std, accumulate, variant (None: choose's)
    (T.Q8_0, 19, 64, 1, 1.0, True, None),
    (T.Q4_K, 1, 256, 3, 10.0, False, None),
    (T.Q6_K, 19, 256, 8, 0.1, True, None),
    (T.Q4_0, 5, 64, 2, 1.0, False, Variant(64, 1, 2)),
    (T.Q5_K, 3, 256, 1, 1.0, False, Variant(32, 2, 4)),
    (T.MXFP4, 7, 64, 2, 10.0, True, None),
    (T.F32, 19, 96, 1, 1.0, True, Variant(64, 1, 1)),
    (T.F16, 2, 64, 8, 0.1, False, None),
]


@pytest.mark.parametrize("ggml_type,N,K,T_,std,accumulate,variant", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_gemv_gated(ggml_type, N, K, T_, std, accumulate, variant):
    rng = np.random.default_rng([int(ggml_type), N, T_])
    check_gemv_gated(rng, ggml_type, N, K, T_, std, accumulate, G=N % 4 + 2, col=N % 4 + 1, variant=variant)
