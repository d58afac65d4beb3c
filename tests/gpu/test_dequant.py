"""Dequantize kernels on the GPU: fp16 output bit-equal (NaN-equal) to gguf's dequantize cast to fp16."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.gemm.dequant import DECODERS, dequant, dequant_ref
from impnb.kernels.common.repack import repack
from tests.gpu.cases import fitting
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu

SHAPES = [(576, 1536), (2048, 640), (1, 256), (19, 576), (111, 2048), (989, 640), (640, 1024), (19, 2048)]


def check_dequant(ggml_type, rows, cols, std):
    raw = make_weight(ggml_type, rows, cols, np.random.default_rng([int(ggml_type), rows, cols]), std)
    w = repack(raw, ggml_type).to_device()
    stream = cuda.stream()
    out = cuda.to_device(np.full((rows, cols), np.nan, np.float16), stream=stream)
    dequant(w, out, stream)
    got = out.copy_to_host(stream=stream)
    stream.synchronize()
    ref = dequant_ref(raw, ggml_type)
    bad = np.argwhere(~((got == ref) | (np.isnan(got) & np.isnan(ref))))
    assert len(bad) == 0, f"{len(bad)} values differ, first at {bad[:3].tolist()}"



@pytest.mark.parametrize("ggml_type,rows,cols", fitting(list(DECODERS), SHAPES))
def test_dequant_bit_exact(ggml_type, rows, cols):
    for std in (0.1, 1.0, 10.0):
        check_dequant(ggml_type, rows, cols, std)


@pytest.mark.parametrize("ggml_type", list(DECODERS), ids=lambda t: t.name)
def test_dequant_4096x14336(ggml_type):
    check_dequant(ggml_type, 4096, 14336, 1.0)
