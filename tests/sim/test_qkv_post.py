"""The fused QK-norm + RoPE + KV write in the CUDA simulator (the GPU test's checks, small)."""

import numpy as np
import pytest

from tests.gpu.test_qkv_post import check_qkv_post


@pytest.mark.parametrize("T,H,Hkv,D,n_rot,neox,norm", [
    (1, 2, 1, 64, 64, True, True),
    (3, 2, 1, 64, 32, False, False),
])
def test_qkv_post(T, H, Hkv, D, n_rot, neox, norm):
    check_qkv_post(np.random.default_rng(T), T, H, Hkv, D, n_rot, neox, norm, 1.0)


def test_qkv_post_gemv_tail():
    """The Q|K|V GEMV's last block doing the work: 5 heads over 4 warps, two tokens."""
    from gguf import GGMLQuantizationType as T

    check_qkv_post(np.random.default_rng(5), 2, 2, 1, 64, 64, True, True, 1.0, ggml_type=T.Q8_0)


def test_qkv_post_gemv_tail_v_only():
    from tests.gpu.test_qkv_post import test_qkv_post_gemv_tail_v_only

    test_qkv_post_gemv_tail_v_only()
