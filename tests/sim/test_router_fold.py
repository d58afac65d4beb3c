"""The folded router (kernels/moe/router_fold.py) in numba's CUDA simulator on tiny shapes, through
tests/gpu/test_router_fold.py's check."""

import numpy as np
from gguf import GGMLQuantizationType as T

from tests.gpu.test_router_fold import check_router_fold


def test_router_fold():
    rng = np.random.default_rng(7)
    check_router_fold(rng, T.Q8_0, 12, 64, 96, 2, 3, True, 1.0)
    check_router_fold(rng, T.Q4_K, 9, 48, 256, 1, 2, False, 3.0, calls=1)
