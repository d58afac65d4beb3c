"""The few-row wgmma GEMM (kernels/gemm/gemm_wgmma_few.py) on the GPU against gemm_ref, through the
split-K tiles' harness (test_gemm_splitk: gemm_tc's bounds): rows 2..300 (odd, both tile heights,
128-row slabs), K split into 1..many parts (uneven shares, a split of one step), accumulate with
and without splits, stacked outputs, every type it takes; outputs and the partial scratch
NaN-poisoned, A Gaussian at std 0.1, 1 and 10."""

import pytest
from gguf import GGMLQuantizationType as T

from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES
from impnb.kernels.gemm.gemm_wgmma_few import F16X2, gemm_wgmma_few, gemm_wgmma_few_split, splits_for
from tests.gpu.test_gemm_splitk import check_splitk, check_splitk_split

pytestmark = pytest.mark.gpu


def check_wgf(ggml_type, M, N, K, splits, std, seed, accumulate=False):
    check_splitk(ggml_type, M, N, K, splits, std, seed, accumulate, gemm=gemm_wgmma_few, f16x2=F16X2)


@pytest.mark.parametrize("ggml_type", QUANT_TYPES)
@pytest.mark.parametrize("M,splits", [(9, 5), (19, 3), (64, 1), (65, 16), (111, 4), (128, 1), (300, 2)])
def test_wgmma_few(ggml_type, M, splits):
    check_wgf(ggml_type, M, 264, 1024, splits, (0.1, 1.0, 10.0)[M % 3], seed=M)


@pytest.mark.parametrize("M", [2, 16, 33, 100, 128])
def test_wgmma_few_accumulate_and_model_shapes(M):
    check_wgf(T.Q4_K, M, 4096, 4096, splits_for(M, 4096, 4096), 1.0, seed=M, accumulate=True)
    check_wgf(T.Q4_K, M, 1024, 4096, 1, 1.0, seed=M, accumulate=True)
    check_wgf(T.Q6_K, M, 4096, 12288, splits_for(M, 4096, 12288), 1.0, seed=M + 1)


@pytest.mark.parametrize("M,sizes", [(17, (4096, 1024, 1024)), (64, (4096, 512)), (9, (136, 36, 36)),
                                     (128, (4096, 1024, 1024))])
def test_wgmma_few_split_qkv(M, sizes):
    check_splitk_split(T.Q4_K, M, sizes, 2048, 1 if M == 128 else 4, seed=M, gemm_split=gemm_wgmma_few_split,
                       f16x2=F16X2)
