"""Dequantize kernels in numba's CUDA simulator: fp16 output bit-equal to gguf's dequantize cast to fp16."""

import numpy as np
import pytest
from numba import cuda

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
