"""quant_blocks_k.q4_k_words and q6_k_words (Q4_K, Q6_K decoded on f16x2) in numba's CUDA simulator: bit-equal to its numpy
twin dequant.q4_k_f16x2_ref at every chunk and half, and the twin within a rounding of the scale and
the min of gguf's values."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.common.quant_blocks_k import k4_k, q4_k_load, q4_k_words, q6_k_k, q6_k_load, q6_k_words
from impnb.kernels.common.repack import repack
from impnb.kernels.gemm.dequant import F16X2_REFS, dequant_ref
from tests.test_repack import make_weight


def _words_kernel(load, words, col_of):
    @cuda.jit
    def kernel(parts, out):
        # grid (rows,), block cpr: thread c writes both halves of chunk c of row blockIdx.x
        row = cuda.blockIdx.x
        c = cuda.threadIdx.x
        cpr = cuda.blockDim.x
        w = words(load(parts, row * cpr + c), c)
        for h in range(2):
            col = col_of(c, h) // 2
            for i in range(8):
                out[row, col + i] = w[8 * h + i]
    return kernel


KERNELS = {T.Q4_K: (q4_k_load, q4_k_words, k4_k), T.Q6_K: (q6_k_load, q6_k_words, q6_k_k)}


@pytest.mark.parametrize("ggml_type", list(KERNELS), ids=lambda t: t.name)
@pytest.mark.parametrize("std", [0.02, 1.0, 30.0])
def test_words_equal_their_twin(ggml_type, std):
    rng = np.random.default_rng(int(std * 100))
    N, K = 5, 512
    raw = make_weight(ggml_type, N, K, rng, std=std)
    w = repack(raw, ggml_type).to_device()
    out = cuda.to_device(np.zeros((N, K // 2), np.uint32))
    _words_kernel(*KERNELS[ggml_type])[N, K // 32](w.parts, out)
    got = out.copy_to_host().view(np.float16)
    twin = F16X2_REFS[ggml_type](raw)
    assert np.array_equal(got.view(np.uint16), twin.view(np.uint16)), np.argwhere(got != twin)[:5]
    exact = dequant_ref(raw, ggml_type).astype(np.float64)
    scale = np.abs(exact).reshape(N, -1, 32).max(-1, keepdims=True)
    err = np.abs(twin.astype(np.float64) - exact).reshape(N, -1, 32)
    assert (err <= 2.0 ** -9 * scale + 1e-30).all(), err.max()
