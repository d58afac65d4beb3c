"""attention_wide (head dims past the tiled kernels') in the CUDA simulator: the GPU tests' check,
tiny shapes."""

import numpy as np
import pytest

from tests.gpu.test_attention_wide import check_wide


@pytest.mark.parametrize("L,T,H,Hkv,D,window,n_splits,std,pad", [
    (1, 1, 2, 1, 64, None, 1, 1.0, 0),        # one key
    (19, 1, 4, 2, 128, None, 3, 3.0, 0),      # decode, splits merged
    (23, 5, 2, 1, 512, 8, 2, 0.1, 1),         # 5 rows past the window, Gemma 4's D, a padding row
    (9, 3, 2, 2, 64, None, 1, 1.0, 2),        # a prompt chunk, g = 1, padding rows
], ids=str)
def test_wide(L, T, H, Hkv, D, window, n_splits, std, pad):
    check_wide(np.random.default_rng([L, T, D]), L, T, H, Hkv, D, window, n_splits, std, pad=pad)
