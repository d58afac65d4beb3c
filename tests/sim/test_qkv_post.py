"""The fused QK-norm + RoPE + KV write in the CUDA simulator (the GPU test's checks, small)."""

import numpy as np
import pytest

from tests.gpu.test_qkv_post import check_qkv_post


@pytest.mark.parametrize("T,H,Hkv,D,n_rot,neox,norm", [
    (1, 2, 1, 64, 64, True, True),
    (3, 2, 1, 64, 32, False, False),
    (2, 3, 2, 64, 64, False, True),  # 7 heads: two blocks of 4 warps, the last one's fourth idle
])
def test_qkv_post(T, H, Hkv, D, n_rot, neox, norm):
    check_qkv_post(np.random.default_rng(T), T, H, Hkv, D, n_rot, neox, norm, 1.0)


def test_qkv_post_two_sequences():
    check_qkv_post(np.random.default_rng(7), 2, 2, 1, 64, 64, True, True, 1.0, B=3)
