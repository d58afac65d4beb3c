"""gemm_wgmma_rs (kernels/gemm/gemm_wgmma_rs.py) on the GPU against gemm_ref of the f16x2 decoders'
weights (gemm_tc's bounds), A permuted by permute_a: Q4_K and Q6_K, 5..100 rows (every token tile width,
ragged last tiles), N not a multiple of the block's 128 rows, 1..4 splits, staged 6 and 3
steps deep; A Gaussian at std 0.1, 1 and 10; outputs NaN-poisoned."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemm.gemm_tc import gemm_ref
from impnb.kernels.gemm.gemm_wgmma_rs import gemm_wgmma_rs, gemm_wgmma_rs_pair
from impnb.kernels.gemm.gemm_wgmma_rs_block import permute_a
from tests.gpu import test_gemm_tc as gemm_tests

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("M,N,K,S", [(12, 264, 1024, 1), (16, 256, 1024, 3), (30, 264, 2048, 2), (64, 4096, 4096, 4),
                                     (100, 136, 1024, 1), (5, 128, 256, 1)])
@pytest.mark.parametrize("stages", [6, 3])
def test_wgmma_rs(M, N, K, S, stages):
    raw, w16, w = gemm_tests.weight(T.Q4_K, N, K)
    a = (np.random.default_rng(M).standard_normal((M, K)) * (0.1, 1.0, 10.0)[M % 3]).astype(np.float16)
    part = cuda.to_device(np.full((S, M, N), np.nan, np.float32))
    c = cuda.to_device(np.full((M, N), np.nan, np.float32))
    gemm_wgmma_rs(cuda.to_device(permute_a(a)), w, c, part, 0, S, stages=stages)
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


@pytest.mark.parametrize("M,NQ,NK,NV,K,S", [(12, 192, 72, 136, 1024, 2), (16, 256, 128, 128, 2048, 4),
                                             (30, 128, 136, 264, 1024, 3), (64, 512, 256, 256, 4096, 8),
                                             (100, 136, 8, 72, 512, 1)])
def test_wgmma_rs_pair(M, NQ, NK, NV, K, S):
    """gemm_wgmma_rs_pair: a Q4_K Q|K (NQ + NK rows) and a Q6_K V (NV rows) in one launch, the
    three outputs each against gemm_ref of its own weight; row counts not multiples of the block's
    128, so a block straddles neither weight's end."""
    raw1, w16_1, w1 = gemm_tests.weight(T.Q4_K, NQ + NK, K)
    raw2, w16_2, w2 = gemm_tests.weight(T.Q6_K, NV, K)
    a = (np.random.default_rng(M + 2).standard_normal((M, K)) * (0.1, 1.0, 10.0)[M % 3]).astype(np.float16)
    part = cuda.to_device(np.full((S, M, NQ + NK + NV), np.nan, np.float32))
    ys = [cuda.to_device(np.full((M, n), np.nan, np.float32)) for n in (NQ, NK, NV)]
    gemm_wgmma_rs_pair(cuda.to_device(permute_a(a)), w1, w2, ys, part, 0, S)
    qk = np.concatenate([ys[0].copy_to_host(), ys[1].copy_to_host()], axis=1).astype(np.float64)
    gemm_tests.check(qk, gemm_ref(a, raw1, T.Q4_K, f16x2=True), a, w16_1, K)
    gemm_tests.check(ys[2].copy_to_host().astype(np.float64), gemm_ref(a, raw2, T.Q6_K, f16x2=True), a, w16_2, K)
