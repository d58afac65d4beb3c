"""MXFP4 and NVFP4 weights read in their GGUF blocks by the decode and prefill kernels, in numba's
CUDA simulator, through the GPU tests' checks: the decode units (test_fp4_units), the dp4a GEMV (plain, accumulate, loads ahead,
gate|up with its GLU, the routed experts, the experts' down sum, the router folded into
attn_output) and the float GEMV on odd row counts and 19-chunk rows, x Gaussian at std 0.1, 1,
10; the tensor-core tile decoding NVFP4 into shared memory (both types' decoders, which the dequant
for cuBLAS and the grouped expert GEMM share, are bit-checked by test_dequant.py).
Weights are encoded Gaussian blocks with a quarter random-bytes blocks (test_repack.make_weight)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from impnb.kernels.gemm.gemm_tc import gemm_ref
from impnb.kernels.gemm.gemm_tc_quant import gemm_quant
from impnb.kernels.gemv.gemv_dp4a import NO_GLU, SILU, Variant
from tests.gpu import test_gemm_tc as gemm_tests
from tests.gpu import test_gemv_dp4a as g
from tests.gpu import test_fp4_units as units
from tests.gpu import test_moe as moe
from tests.gpu.test_router_fold import check_router_fold
from tests.sim import test_gemv as sim_gemv
from tests.test_repack import make_weight

FP4 = (T.MXFP4, T.NVFP4)
IDS = [t.name for t in FP4]
# a row of 19 chunks where the type allows it (NVFP4's blocks are 64 wide: 18)
ODD_K = {T.MXFP4: 608, T.NVFP4: 576}


def test_fp4_units():
    rng = np.random.default_rng(9)
    units.check_prmt(rng, n=256)
    units.check_e2m1(rng, n=64)
    units.check_scales()


@pytest.mark.parametrize("t", FP4, ids=IDS)
def test_gemv_dp4a_fp4(t):
    for i, (rows, n_tok, std) in enumerate(((19, 1, 0.1), (7, 3, 10.0))):
        g.check_case(t, rows, ODD_K[t], n_tok, std, seed=[int(t), i])
    g.check_case(t, 5, 1024, 2, 1.0, seed=[int(t), 2], accumulate=True)
    g.check_case(t, 3, 2048, 1, 1.0, seed=[int(t), 3], variant=Variant(32, 2, 2))


@pytest.mark.parametrize("t", FP4, ids=IDS)
def test_gemv_dp4a_fp4_glu_and_experts(t):
    g.check_glu(t, 5, 128, 1, SILU, seed=[int(t), 4])
    g.check_experts(t, 4, 6, 128, 1, 2, SILU, seed=[int(t), 5])
    g.check_experts(t, 3, 5, 128, 2, 2, NO_GLU, seed=[int(t), 6])


@pytest.mark.parametrize("t", FP4, ids=IDS)
def test_moe_fp4(t):
    rng = np.random.default_rng(int(t))
    moe.check_down_sum(rng, t, 3, 9, 128, 1, 2, 1.0, dp4a=True)
    check_router_fold(rng, t, 9, 48, 128, 1, 2, True, 3.0, calls=1)


@pytest.mark.parametrize("t", FP4, ids=IDS)
def test_gemv_float_fp4(t):
    rng = np.random.default_rng([int(t), 7])
    raw = make_weight(t, 7, ODD_K[t], rng, std=10.0)
    x = (rng.standard_normal((3, ODD_K[t])) * 0.1).astype(np.float32)
    sim_gemv.check(raw, t, x, sim_gemv.run_gemv(raw, t, x))


def test_gemm_tile_nvfp4():
    M, N, K = 5, 8, 128
    raw, w16, w = gemm_tests.weight(T.NVFP4, N, K)
    a = np.random.default_rng(1).standard_normal((M, K)).astype(np.float16)

    def fn(a_, w_, c_, s, accumulate):
        gemm_quant(a_, w_, c_, s, accumulate, bm=64)

    got = gemm_tests.run(fn, a, w, M, N)
    gemm_tests.check(got, gemm_ref(a, raw, T.NVFP4), a, w16, K)

