"""wgmma GEMM tiles (kernels/gemm/gemm_wgmma.py, gemm_wgmma_quant.py) on the GPU against float64 with
test_gemm_tc's bound.

First a layout probe whose products encode their position: a wrong accumulator fragment map,
descriptor stride or swizzle puts a value where another (row, column) is expected. Then Gaussian
A and W at three magnitudes, odd M and N, real model shapes, every tile and weight type (random
GGUF blocks, the reference on their dequantized values), outputs poisoned.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemm.gemm_tc import gemm_ref
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES
from impnb.kernels.gemm.gemm_wgmma import TILES, gemm_wgmma
from impnb.kernels.gemm.gemm_wgmma_quant import gemm_wgmma_quant
from tests.gpu.test_gemm_tc import Q_SHAPES, STDS, check, run, weight

pytestmark = pytest.mark.gpu

SHAPES = [(1, 576, 1536), (7, 640, 2048), (19, 2048, 640), (111, 1536, 576), (989, 1024, 640),
          (4096, 256, 512), (130, 200, 128), (64, 192, 576), (300, 4096, 256)]


def _wgmma(tile):
    return lambda a, w, c, s, accumulate: gemm_wgmma(a, w, c, s, accumulate, tile=tile)


@pytest.mark.parametrize("tile", sorted(TILES))
def test_layout_probe(tile):
    """C[m, n] = m + 256 n + k-position marks: A[m, 0] = m, A[m, 1] = 1, W[n, 1] = 256 n,
    W[n, 0] = 1, and for each further K column j one more product 2^-(j % 4) * (j // 8) that
    only lands if column j of A meets column j of W (swizzle and k-step offsets); every partial
    sum is exact in fp32."""
    M, N, K = 200, 264, 128
    a = np.zeros((M, K), np.float16)
    w = np.zeros((N, K), np.float16)
    a[:, 0] = np.arange(M) % 2048
    a[:, 1] = 1
    w[:, 0] = 1
    w[:, 1] = 256 * (np.arange(N) % 255)
    j = np.arange(2, K)
    a[:, 2:] = 2.0 ** -(j % 4)
    w[:, 2:] = j // 8
    got = run(_wgmma(tile), a, cuda.to_device(w), M, N)
    want = gemm_ref(a, w)
    bad = np.argwhere(got != want)
    first = tuple(bad[0]) if len(bad) else None
    assert not len(bad), f"{len(bad)} outputs differ; first at {first}: {got[first]} != {want[first]}"


@pytest.mark.parametrize("tile", sorted(TILES))
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_gemm_wgmma(M, N, K, tile):
    rng = np.random.default_rng([M, N, K])
    w16 = rng.standard_normal((N, K)).astype(np.float16)
    d_w = cuda.to_device(w16)
    for std in STDS:
        a = (rng.standard_normal((M, K)) * std).astype(np.float16)
        check(run(_wgmma(tile), a, d_w, M, N), gemm_ref(a, w16), a, w16, K)


def test_gemm_wgmma_accumulate_and_cube():
    rng = np.random.default_rng(1)
    M, N, K = 111, 640, 1024
    w16 = rng.standard_normal((N, K)).astype(np.float16)
    a = rng.standard_normal((M, K)).astype(np.float16)
    c0 = rng.standard_normal((M, N)).astype(np.float32) * 10
    got = run(gemm_wgmma, a, cuda.to_device(w16), M, N, c0)
    check(got, gemm_ref(a, w16, c=c0.astype(np.float64)), a, w16, K, c0)
    M = N = K = 4096
    w16 = rng.standard_normal((N, K)).astype(np.float16)
    a = rng.standard_normal((M, K)).astype(np.float16)
    got = run(gemm_wgmma, a, cuda.to_device(w16), M, N)
    rows = rng.choice(M, 64, replace=False)  # float64 reference on a sample of rows
    check(got[rows], gemm_ref(a[rows], w16), a[rows], w16, K)


@pytest.mark.parametrize("ggml_type,M,N,K", [pytest.param(t, M, N, K, id=f"{t.name}-{M}x{N}x{K}")
                                             for t in QUANT_TYPES for M, N, K in Q_SHAPES
                                             if K % (256 if t in (T.Q4_K, T.Q5_K, T.Q6_K) else 64) == 0])
def test_gemm_wgmma_quant(ggml_type, M, N, K):
    raw, w16, w = weight(ggml_type, N, K)
    rng = np.random.default_rng([M, N, K, int(ggml_type)])
    for std in STDS:
        a = (rng.standard_normal((M, K)) * std).astype(np.float16)
        check(run(gemm_wgmma_quant, a, w, M, N), gemm_ref(a, raw, ggml_type), a, w16, K)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.MXFP4], ids=lambda t: t.name)
def test_gemm_wgmma_quant_prefill_shape_and_accumulate(ggml_type):
    """The benchmark shape M=512, N=4096, K=14336 (reference on a sample of rows); accumulate."""
    M, N, K = 512, 4096, 14336
    raw, w16, w = weight(ggml_type, N, K)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((M, K)).astype(np.float16)
    got = run(gemm_wgmma_quant, a, w, M, N)
    rows = rng.choice(M, 32, replace=False)
    check(got[rows], gemm_ref(a[rows], raw, ggml_type), a[rows], w16, K)
    M, N, K = 77, 640, 1024
    raw, w16, w = weight(ggml_type, N, K)
    a = rng.standard_normal((M, K)).astype(np.float16)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    got = run(gemm_wgmma_quant, a, w, M, N, c0)
    check(got, gemm_ref(a, raw, ggml_type, c=c0.astype(np.float64)), a, w16, K, c0)
