"""The dp4a GEMV and quantize_x in numba's CUDA simulator on tiny shapes, through
tests/gpu/test_gemv_dp4a.py's checks (dp4a through its plain-Python twin)."""

import numpy as np
from gguf import GGMLQuantizationType as T

from impnb.kernels.gemv.gemv_dp4a import NO_GLU, SILU, Variant
from impnb.kernels.gemv.gemv_dp4a_units import DP4A_TYPES
from tests.gpu import test_gemv_dp4a as g


def test_quantize_x():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 48)) * 3).astype(np.float32)
    x[0, :16] = 0.0
    g.check_quantize_x(x)


def test_gemv_dp4a_every_type():
    for i, t in enumerate(DP4A_TYPES):
        g.check_case(t, 5, 256, 1 + i % 2, 1.0, seed=i)


def test_gemv_dp4a_spans_and_tokens():
    g.check_case(T.Q4_K, 3, 512, 3, 10.0, seed=1, variant=Variant(32, 1, 1))
    g.check_case(T.Q6_K, 9, 256, 1, 0.1, seed=2, variant=Variant(64, 1, 4), accumulate=True)


def test_gemv_dp4a_loads_ahead():
    """unroll 2: each chunk's loads a step early (two steps a thread here, then the last alone)."""
    g.check_case(T.Q4_K, 5, 2048, 1, 1.0, seed=8, variant=Variant(32, 2, 4))
    g.check_case(T.Q4_1, 3, 2048, 2, 1.0, seed=9, variant=Variant(64, 2, 2), accumulate=True)


def test_gemv_dp4a_loads_deeper():
    """unroll 3 and 4: loads two and three steps early (4 steps a thread; 2 steps, fewer than the
    window)."""
    g.check_case(T.Q4_K, 3, 4096, 1, 1.0, seed=10, variant=Variant(32, 3, 2))
    g.check_case(T.Q6_K, 2, 2048, 1, 10.0, seed=11, variant=Variant(32, 4, 2))


def test_quantize_x_norm_and_glu():
    rng = np.random.default_rng(3)
    # a block a row (rows up to 128 groups, 3 and 4 of them here), and a row over two blocks
    for n_tok, K, std in ((2, 64, 5.0), (3, 48, 0.1), (2, 2064, 1.0)):
        g.check_quantize_x_norm((rng.standard_normal((n_tok, K)) * std).astype(np.float32),
                                (1 + 0.3 * rng.standard_normal(K)).astype(np.float32), 1e-6)
    g.check_glu(T.Q4_K, 5, 256, 1, SILU, seed=4)
    g.check_glu(T.Q8_0, 3, 64, 3, SILU, seed=5)


def test_gemv_dp4a_experts():
    g.check_experts(T.Q4_K, 4, 10, 256, 1, 3, SILU, seed=6)
    g.check_experts(T.Q8_0, 3, 5, 64, 2, 2, NO_GLU, seed=7)


def test_gemv_dp4a_residual():
    """The residual tail run by the dp4a grid's last block (grids of 1 and 5 blocks), twice each."""
    g.check_dp4a_residual(T.Q4_K, 12, 256, 1, True, 1.0, seed=15)
    g.check_dp4a_residual(T.NVFP4, 40, 128, 2, False, 10.0, seed=16, variant=Variant(32, 1, 2))
