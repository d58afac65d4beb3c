"""attention_wide (head dims past the tiled kernels') in the CUDA simulator: the GPU tests' check,
tiny shapes."""

import numpy as np
import pytest

from tests.gpu.test_attention_wide import check_wide


@pytest.mark.parametrize("L,T,H,Hkv,D,window,n_splits,std,pad,tiled", [
    (1, 1, 2, 1, 64, None, 1, 1.0, 0, False),        # one key
    (19, 1, 4, 2, 128, None, 3, 3.0, 0, False),      # decode, splits merged
    (23, 5, 2, 1, 512, 8, 2, 0.1, 1, False),         # 5 rows past the window, Gemma 4's D, a padding row
    (9, 3, 2, 2, 64, None, 1, 1.0, 2, False),        # a prompt chunk, g = 1, padding rows
    (1, 1, 2, 1, 64, None, 1, 1.0, 0, True),         # tiled: one key, 7 of the tile out
    (37, 1, 16, 2, 64, None, 2, 3.0, 0, True),       # 8 warps a tile, splits of 19 and 18 keys
    (23, 3, 4, 2, 128, 8, 2, 1.0, 1, True),          # 2 warps (4 keys each), a window, padding
    (13, 1, 32, 2, 64, None, 1, 0.1, 0, True),       # 16 warps, 8 of them only scoring
], ids=str)
def test_wide(L, T, H, Hkv, D, window, n_splits, std, pad, tiled):
    check_wide(np.random.default_rng([L, T, D]), L, T, H, Hkv, D, window, n_splits, std, pad=pad, tiled=tiled)


def test_tiled_groupings_taken():
    """The tiled kernel takes groups that split a tile of 8 keys evenly and fit an SM's registers;
    attention_wide's own kernel takes the rest (3 heads a KV head, 32)."""
    from impnb.kernels.attention.attention_wide_tiled import takes

    assert all(takes(g) for g in (1, 2, 4, 8, 16)) and not any(takes(g) for g in (0, 3, 6, 12, 24, 32))
