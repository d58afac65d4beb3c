"""RMSNorm, RoPE and gated activations in the CUDA simulator: the GPU tests' checks, tiny shapes."""

import numpy as np
import pytest

from tests.gpu.test_norm_rope_act import (check_glu, check_rms_norm, check_rms_norm_add,
                                          check_rms_norm_post_add, check_rope)


@pytest.mark.parametrize("shape,std", [((1, 1), 1.0), ((2, 19), 10.0), ((1, 300), 0.1), ((3, 2, 64), 1.0)],
                         ids=str)
def test_rms_norm(shape, std):
    """(., 1..256): warp per row; (1, 300): block per row (128 threads, 3 columns each). Each shape
    at one scale: the paths are the shapes', the scales only the numbers'."""
    rng = np.random.default_rng([len(shape), shape[-1], int(std * 10)])
    check_rms_norm(rng, shape, std)
    check_rms_norm(rng, shape, std, in_place=True)


@pytest.mark.parametrize("shape,std", [((1, 1), 0.1), ((2, 19), 10.0), ((1, 300), 0.1)], ids=str)
def test_rms_norm_fused(shape, std):
    rng = np.random.default_rng([shape[-1], int(std * 10)])
    check_rms_norm_add(rng, shape, std)
    check_rms_norm_post_add(rng, shape, std)


@pytest.mark.parametrize("shape,std", [((2, 304), 1.0), ((3, 128), 10.0)], ids=str)
def test_rms_norm_post_add_int8_output(shape, std):
    """The post-norm's kernel writing out's int8 form: 304 columns (the last pass's warps partly,
    one wholly, past the row) and one pass of 128."""
    check_rms_norm_post_add(np.random.default_rng([shape[-1], 7]), shape, std, quant=True)


@pytest.mark.parametrize("T,H,Hkv,D,n_rot,base,neox", [(3, 4, 2, 64, 64, 10000.0, False),  # adjacent pairs, all dims
                                                     (2, 2, 1, 16, 8, 1e6, True),         # halves, part rotated
                                                     (2, 2, 1, 16, 8, 1e6, False)])       # pairs, part rotated
def test_rope(T, H, Hkv, D, n_rot, base, neox):
    check_rope(np.random.default_rng([T, D, int(neox)]), T, H, Hkv, D, n_rot, base, neox, 1.0)


@pytest.mark.parametrize("T,F,std,act", [(1, 1, 1.0, "silu"), (2, 19, 0.1, "gelu"), (3, 300, 10.0, "silu"),
                                          (3, 300, 10.0, "gelu")])
def test_glu(T, F, std, act):
    check_glu(np.random.default_rng([T, F, len(act)]), T, F, std, act)
