"""The few-row quantized GEMM (kernels/gemm/gemm_few.py) on the GPU against gemm_ref, through the
split-K tiles' harness (test_gemm_splitk: gemm_tc's bounds): rows 2..256 (odd, each m-tile
count, 64-row slabs), K split into 1..many parts (uneven shares), accumulate, stacked outputs,
every type it takes; outputs and the partial scratch NaN-poisoned, A Gaussian at std 0.1, 1 and 10."""

import pytest
from gguf import GGMLQuantizationType as T

from impnb.kernels.gemm.gemm_few import gemm_few, gemm_few_split, splits_for
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES
from tests.gpu.test_gemm_splitk import check_splitk, check_splitk_split

pytestmark = pytest.mark.gpu


def check_few(ggml_type, M, N, K, splits, std, seed, accumulate=False):
    check_splitk(ggml_type, M, N, K, splits, std, seed, accumulate, gemm=gemm_few)


def check_few_split(ggml_type, M, sizes, K, splits, seed):
    check_splitk_split(ggml_type, M, sizes, K, splits, seed, gemm_split=gemm_few_split)


@pytest.mark.parametrize("ggml_type", QUANT_TYPES)
@pytest.mark.parametrize("M,splits", [(9, 5), (19, 3), (64, 1), (111, 4), (256, 2)])
def test_few(ggml_type, M, splits):
    check_few(ggml_type, M, 264, 1024 if ggml_type in (T.Q4_K, T.Q5_K, T.Q6_K) else 640, splits,
              (0.1, 1.0, 10.0)[M % 3], seed=M)


@pytest.mark.parametrize("M", [2, 16, 33, 100])
def test_few_accumulate_and_model_shapes(M):
    check_few(T.Q4_K, M, 4096, 4096, splits_for(M, 4096, 4096), 1.0, seed=M, accumulate=True)
    check_few(T.Q6_K, M, 1024, 12288, splits_for(M, 1024, 12288), 1.0, seed=M + 1)


@pytest.mark.parametrize("M,sizes", [(17, (4096, 1024, 1024)), (64, (4096, 512)), (9, (136, 36, 36))])
def test_few_split_qkv(M, sizes):
    check_few_split(T.Q4_K, M, sizes, 2048, 4, seed=M)
