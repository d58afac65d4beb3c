"""reduce_glu (kernels/gemm/reduce_glu.py) on the GPU: gate|up's split-K partials to the down's
operand in one launch, bit for bit what the three launches it replaces write (gemm_quant_splitk's
reduce, activations' swiglu_fused / geglu_fused, then cast_f16 or quant_x32's quantize_x32), and
near reduce_glu_ref; partials Gaussian at several magnitudes, one to several splits, odd row
counts (QuantX32's rows past M zero), outputs poisoned first."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.elementwise import activations
from impnb.kernels.elementwise.cast import cast_f16
from impnb.kernels.gemm.gemm_mmq import slab_rows
from impnb.kernels.gemm.quant_x32 import QuantX32, dequantize_x32_ref, quantize_x32
from impnb.kernels.gemm.gemm_quant_splitk import reduce_parts
from impnb.kernels.gemm.reduce_glu import reduce_glu, reduce_glu_ref

pytestmark = pytest.mark.gpu


def poisoned_q(MP, F) -> QuantX32:
    return QuantX32(cuda.to_device(np.full((MP, F // 4), 0xDEADBEEF, np.uint32)),
                    cuda.to_device(np.full((F // 32, MP, 2), np.nan, np.float32)))


def check_reduce_glu(rng, S, M, F, act, std):
    part = (rng.standard_normal((S, M, 2 * F)) * std).astype(np.float32)
    d_part = cuda.to_device(part)
    # the three launches it replaces
    gate_up = cuda.to_device(np.full((M, 2 * F), np.nan, np.float32))
    reduce_parts(d_part, (gate_up, gate_up, gate_up), 2 * F, 0, False, 0)
    act_out = cuda.to_device(np.full((M, F), np.nan, np.float32))
    (activations.swiglu_fused if act == "silu" else activations.geglu_fused)(gate_up, act_out, 0)
    want16 = cuda.to_device(np.full((M, F), np.nan, np.float16))
    cast_f16(act_out, want16, 0)
    MP = slab_rows(M)
    want_q = poisoned_q(MP, F)
    quantize_x32(act_out, want_q, 0)
    # the one launch
    got16 = cuda.to_device(np.full((M, F), np.nan, np.float16))
    reduce_glu(d_part, act, got16, 0)
    got_q = poisoned_q(MP, F)
    reduce_glu(d_part, act, got_q, 0)
    got_p = cuda.to_device(np.full((M, F), np.nan, np.float16))
    if F % 64 == 0:  # gemm_wgmma_rs's column order
        reduce_glu(d_part, act, got_p, 0, perm=True)
    got16, want16 = got16.copy_to_host(), want16.copy_to_host()
    assert np.array_equal(got16.view(np.uint16), want16.view(np.uint16))
    if F % 64 == 0:
        from impnb.kernels.gemm.gemm_wgmma_rs_block import permute_a
        assert np.array_equal(got_p.copy_to_host().view(np.uint16), permute_a(want16).view(np.uint16))
    assert np.array_equal(got_q.q.copy_to_host(), want_q.q.copy_to_host())
    ds, want_ds = got_q.ds.copy_to_host(), want_q.ds.copy_to_host()
    assert np.array_equal(ds, want_ds) and (ds[:, M:] == 0).all() and (got_q.q.copy_to_host()[M:] == 0).all()
    # and near the reference (exp / tanh to a few ulps, then fp16 or int8 rounding)
    ref = reduce_glu_ref(part, act).astype(np.float64)
    # (GeGLU's 1 + tanh in float32 cancels where the gate is far below zero: float32's unit of g * u)
    atol = 2 ** -24 + 2 ** -20 * std * std * S
    np.testing.assert_allclose(got16.astype(np.float64), ref, rtol=2 ** -10, atol=atol)
    vals = dequantize_x32_ref(got_q.q.copy_to_host(), ds)[:M]
    amax = np.abs(ref.reshape(M, F // 32, 32)).max(axis=2, keepdims=True)
    assert (np.abs(vals.reshape(M, F // 32, 32) - ref.reshape(M, F // 32, 32)) <= amax / 254 * 1.01 + 1e-30).all()


@pytest.mark.parametrize("S, M, F", [(1, 9, 1536), (2, 16, 12288), (3, 37, 768), (5, 128, 3072)])
@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_reduce_glu(S, M, F, act):
    rng = np.random.default_rng([S, M, F])
    for std in (0.05, 1.0, 8.0):
        check_reduce_glu(rng, S, M, F, act, std)
