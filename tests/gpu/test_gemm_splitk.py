"""The split-K quantized tile GEMM on the GPU against gemm_ref (gemm_tc's harness and bounds):
few rows (2..256, odd), K split into 1..many parts (uneven shares), accumulate, several types;
outputs NaN-poisoned (and the partial scratch too), A Gaussian at std 0.1, 1 and 10."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemm.gemm_quant_splitk import gemm_splitk, gemm_splitk_split, splits_for
from impnb.kernels.gemm.gemm_tc import gemm_ref
from tests.gpu import test_gemm_tc as gemm_tests

pytestmark = pytest.mark.gpu


def check_splitk(ggml_type, M, N, K, splits, std, seed, accumulate=False, gemm=gemm_splitk, f16x2=False):
    """gemm (gemm_splitk's arguments) against gemm_ref (of the f16x2 decoders' weights with f16x2),
    partials and output NaN-poisoned."""
    raw, w16, w = gemm_tests.weight(ggml_type, N, K)
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((M, K)) * std).astype(np.float16)
    c0 = rng.standard_normal((M, N)).astype(np.float32) if accumulate else None
    part = cuda.to_device(np.full((splits, M, N), np.nan, np.float32))

    def fn(a_, w_, c_, s, accumulate):
        gemm(a_, w_, c_, part, s, splits, accumulate)

    got = gemm_tests.run(fn, a, w, M, N, c0)
    ref = gemm_ref(a, raw, ggml_type, c=None if c0 is None else c0.astype(np.float64), f16x2=f16x2)
    gemm_tests.check(got, ref, a, w16, K, c0)


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_K, T.Q4_0])
@pytest.mark.parametrize("M,splits", [(9, 5), (19, 3), (64, 1), (111, 8), (256, 2)])
def test_splitk(ggml_type, M, splits):
    check_splitk(ggml_type, M, 264, 2048, splits, (0.1, 1.0, 10.0)[M % 3], seed=M)


@pytest.mark.parametrize("M", [16, 37])
def test_splitk_accumulate_and_model_shapes(M):
    check_splitk(T.Q4_K, M, 4096, 4096, splits_for(M, 4096, 4096), 1.0, seed=M, accumulate=True)
    check_splitk(T.Q6_K, M, 1024, 12288, splits_for(M, 1024, 12288), 1.0, seed=M + 1)



def check_splitk_split(ggml_type, M, sizes, K, splits, seed, gemm_split=gemm_splitk_split, f16x2=False):
    """Stacked rows (sum of sizes, K) into len(sizes) outputs, each its rows of gemm_ref."""
    N = sum(sizes)
    raw, w16, w = gemm_tests.weight(ggml_type, N, K)
    a = (np.random.default_rng(seed).standard_normal((M, K))).astype(np.float16)
    part = cuda.to_device(np.full((splits, M, N), np.nan, np.float32))
    ys = [cuda.to_device(np.full((M, n), np.nan, np.float32)) for n in sizes]
    gemm_split(cuda.to_device(a), w, ys, part, 0, splits)
    got = np.concatenate([y.copy_to_host() for y in ys], axis=1).astype(np.float64)
    gemm_tests.check(got, gemm_ref(a, raw, ggml_type, f16x2=f16x2), a, w16, K)


@pytest.mark.parametrize("M,sizes", [(17, (4096, 1024, 1024)), (64, (4096, 512)), (9, (136, 36, 36))])
def test_splitk_split_qkv(M, sizes):
    check_splitk_split(T.Q4_K, M, sizes, 2048, 4, seed=M)
