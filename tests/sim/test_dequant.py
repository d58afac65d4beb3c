"""Dequantize kernels in numba's CUDA simulator: fp16 output bit-equal to gguf's dequantize cast to fp16."""

import numpy as np
import pytest
from numba import cuda

from impnb import quant_fp4
from impnb.kernels.gemm.dequant import DECODERS, dequant, dequant_ref
from impnb.kernels.common.repack import repack
from tests.test_repack import make_weight


def run_dequant(raw, ggml_type):
    w = repack(raw, ggml_type).to_device()
    out = cuda.to_device(np.full((w.rows, w.cols), np.nan, np.float16))
    dequant(w, out, 0)
    return out.copy_to_host()


@pytest.mark.parametrize("ggml_type", list(DECODERS), ids=lambda t: t.name)
def test_dequant_is_bit_exact(ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    raw = make_weight(ggml_type, 19, 512, rng, std=10.0)
    got = run_dequant(raw, ggml_type)
    ref = dequant_ref(raw, ggml_type)
    assert np.array_equal(got, ref, equal_nan=True), np.argwhere(got != ref)[:5]


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # E8M0 254, 255: inf, as gguf's
@pytest.mark.parametrize("fmt", (quant_fp4.MXFP4, quant_fp4.NVFP4), ids=lambda f: f.ggml_type.name)
def test_dequant_fp4_every_scale_and_code(fmt):
    """Every scale byte (E8M0's subnormal and overflowing exponents, UE4M3's subnormals, 0x7F and
    bit 7) against all 16 codes, ±0 included: bit-equal to gguf's values cast to fp16."""
    codes = np.tile(np.arange(16, dtype=np.uint8), (256, fmt.n_sub, fmt.sub // 16))
    codes[1::2] = codes[1::2, :, ::-1]  # both halves of a chunk see every code
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], fmt.n_sub, axis=1)
    raw = fmt.pack(scales, codes).reshape(8, -1)
    with np.errstate(over="ignore"):
        ref = dequant_ref(raw, fmt.ggml_type)
    got = run_dequant(raw, fmt.ggml_type)
    assert np.array_equal(got.view(np.uint16), ref.view(np.uint16)), np.argwhere(got != ref)[:5]
