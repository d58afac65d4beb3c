"""gemm_wgmma_rs (kernels/gemm/gemm_wgmma_rs.py) on the GPU against gemm_ref of the f16x2 decoders'
weights (gemm_tc's bounds), A permuted by permute_a: Q4_K and Q6_K, 5..100 rows (every token tile width,
ragged last tiles), N not a multiple of the block's 128 rows, 1..4 splits, the staged form at 6
and 3 steps and the registers-ahead form; A Gaussian at std 0.1, 1 and 10; outputs NaN-poisoned."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemm.gemm_tc import gemm_ref
from impnb.kernels.gemm.gemm_wgmma_rs import gemm_wgmma_rs, permute_a
from tests.gpu import test_gemm_tc as gemm_tests

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("M,N,K,S", [(12, 264, 1024, 1), (16, 256, 1024, 3), (30, 264, 2048, 2), (64, 4096, 4096, 4),
                                     (100, 136, 1024, 1), (5, 128, 256, 1)])
@pytest.mark.parametrize("staged", [6, 3, 0])
def test_wgmma_rs(M, N, K, S, staged):
    raw, w16, w = gemm_tests.weight(T.Q4_K, N, K)
    a = (np.random.default_rng(M).standard_normal((M, K)) * (0.1, 1.0, 10.0)[M % 3]).astype(np.float16)
    part = cuda.to_device(np.full((S, M, N), np.nan, np.float32))
    c = cuda.to_device(np.full((M, N), np.nan, np.float32))
    gemm_wgmma_rs(cuda.to_device(permute_a(a)), w, c, part, 0, S, staged=staged)
    got = c.copy_to_host().astype(np.float64)
    gemm_tests.check(got, gemm_ref(a, raw, T.Q4_K, f16x2=True), a, w16, K)


@pytest.mark.parametrize("M,N,K,S", [(12, 264, 1024, 1), (16, 256, 2048, 3), (30, 136, 1024, 2), (64, 4096, 12288, 8),
                                     (100, 128, 512, 1)])
def test_wgmma_rs_q6_k(M, N, K, S):
    """The Q6_K kernel (128-column steps, A permuted as for Q4_K)."""
    raw, w16, w = gemm_tests.weight(T.Q6_K, N, K)
    a = (np.random.default_rng(M + 1).standard_normal((M, K)) * (0.1, 1.0, 10.0)[M % 3]).astype(np.float16)
    part = cuda.to_device(np.full((S, M, N), np.nan, np.float32))
    c = cuda.to_device(np.full((M, N), np.nan, np.float32))
    gemm_wgmma_rs(cuda.to_device(permute_a(a)), w, c, part, 0, S)
    gemm_tests.check(c.copy_to_host().astype(np.float64), gemm_ref(a, raw, T.Q6_K, f16x2=True), a, w16, K)
