"""cast_f16 in the simulator against its numpy reference."""

import numpy as np
from numba import cuda

from impnb.kernels.elementwise.cast import cast_f16, cast_f16_ref


def test_cast_f16_matches_reference():
    rng = np.random.default_rng(0)
    for n, std in ((1, 1.0), (19, 10.0), (111, 1e5)):
        x = (rng.standard_normal(n) * std).astype(np.float32)
        out = cuda.to_device(np.full(n, np.nan, np.float16))
        cast_f16(cuda.to_device(x), out, cuda.default_stream())
        np.testing.assert_array_equal(out.copy_to_host(), cast_f16_ref(x))


def test_cast_f16_norm_matches_reference():
    from tests.gpu.test_cast import check_cast_norm

    rng = np.random.default_rng(1)
    check_cast_norm(rng, 3, 516, 2.0)
    check_cast_norm(rng, 2, 260, 1.0, w_std=3e4)


def test_cast_f16_perm_matches_the_plain_cast():
    from tests.gpu.test_cast import check_cast_perm

    rng = np.random.default_rng(2)
    check_cast_perm(rng, 3, 128, 1.0, True)
    check_cast_perm(rng, 2, 64, 5e4, False)
