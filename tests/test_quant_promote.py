"""quant_promote: Q4_0 / Q5_0 blocks re-encoded as Q8_0 hold the same values, bit for bit (gguf)."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

from impnb.quant_promote import common_type, promote


def random_blocks(ggml_type: T, shape: tuple, seed: int) -> np.ndarray:
    """Random GGUF bytes (*shape[:-1], shape[-1] weights as blocks) with finite fp16 scales."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[ggml_type]
    n = int(np.prod(shape)) // block
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    d = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 2, n)).astype(np.float16)
    d[::7] = 0  # zero blocks too
    raw[:, :2] = d.view(np.uint8).reshape(n, 2)
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q5_0, T.Q8_0])
@pytest.mark.parametrize("shape", [(19, 640), (3, 5, 256)])
def test_promote_to_q8_0_exact(ggml_type, shape):
    raw = random_blocks(ggml_type, shape, seed=hash((ggml_type, shape)) % 1000)
    out = promote(raw, ggml_type, T.Q8_0)
    assert out.shape == (*shape[:-1], shape[-1] // 32 * 34)
    want = dequantize(raw.reshape(-1, raw.shape[-1]), ggml_type)
    got = dequantize(out.reshape(-1, out.shape[-1]), T.Q8_0)
    assert want.shape == got.shape and np.array_equal(want, got)
    assert np.abs(want).max() > 0


def test_common_type():
    assert common_type([T.Q4_K, T.Q4_K]) == T.Q4_K
    assert common_type([T.Q5_0, T.Q5_0, T.Q8_0]) == T.Q8_0
    assert common_type([T.Q4_0, T.Q5_0]) == T.Q8_0
    assert common_type([T.Q4_K, T.Q6_K]) is None
    assert common_type([T.Q4_1, T.Q8_0]) is None
