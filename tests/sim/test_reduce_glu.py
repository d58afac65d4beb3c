"""reduce_glu in the simulator against the launches it replaces and its numpy reference."""

import numpy as np

from tests.gpu.test_reduce_glu import check_reduce_glu


def test_reduce_glu():
    rng = np.random.default_rng(3)
    check_reduce_glu(rng, 3, 9, 64, "silu", 1.0)
    check_reduce_glu(rng, 1, 2, 32, "gelu", 4.0)
