"""Repacked weights rebuild the GGUF bytes exactly; test weights for the kernel tests are made here.

`make_weight` builds real blocks with `gguf.quants.quantize` where the package can quantize the type
(Q4_0, Q4_1, Q5_0, Q8_0, F16, F32), with impnb.quant_fp4 for MXFP4 and NVFP4 (in random blocks MXFP4's
exponents stay within 2^±8 of std's, NVFP4's scales within 2^-4..2^2 of a Gaussian block's; every
scale byte is tests/sim/test_dequant.py's), and random blocks otherwise (K-quants: random bytes whose fp16
scale fields are overwritten with finite Gaussian-derived values). Random-bytes blocks (with finite
scales) and zero blocks are mixed in so every bit pattern of the quants occurs.
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import quantize

from impnb import quant_fp4
from impnb.kernels.common.repack import ALIGN, PACKED_TYPES, repack, rows_aligned, rows_of, unpack
from impnb.quants import dequantize

QUANTIZABLE = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0)
# byte ranges of fp16 scale fields in a block
SCALE_FIELDS = {
    T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,),
    T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
}


def _finite_scales(blocks: np.ndarray, ggml_type: T, rng, std: float):
    if ggml_type == T.MXFP4:
        blocks[:, 0] = 128 + np.round(np.log2(0.2 * std)) + rng.integers(-8, 9, blocks.shape[0])
    if ggml_type == T.NVFP4:  # a spread over 2^-4..2^2 of the Gaussian blocks' scales
        d = 0.4 * std * 2.0 ** rng.uniform(-4, 2, (blocks.shape[0], 4))
        blocks[:, 0:4] = quant_fp4.to_ue4m3(d.astype(np.float32))
    for off in SCALE_FIELDS.get(ggml_type, ()):
        d = (rng.standard_normal(blocks.shape[0]) * 0.02 * std).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)


def make_weight(ggml_type: T, rows: int, cols: int, rng, std: float = 1.0) -> np.ndarray:
    """Raw GGUF bytes (rows, row_bytes) uint8 of a plausible weight of this type."""
    ggml_type = T(ggml_type)
    if ggml_type in (T.F16, T.F32):
        dt = np.float16 if ggml_type == T.F16 else np.float32
        return (rng.standard_normal((rows, cols)) * std).astype(dt).view(np.uint8)
    block, size = GGML_QUANT_SIZES[ggml_type]
    n_blocks = rows * cols // block
    if ggml_type in QUANTIZABLE or ggml_type in quant_fp4.FP4_FORMATS:
        data = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        encode = quant_fp4.quantize if ggml_type in quant_fp4.FP4_FORMATS else quantize
        blocks = encode(data, ggml_type).reshape(n_blocks, size).copy()
        noisy = rng.random(n_blocks) < 0.25  # a quarter random bytes
        rand = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
        _finite_scales(rand, ggml_type, rng, std)
        blocks[noisy] = rand[noisy]
    else:
        blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
        _finite_scales(blocks, ggml_type, rng, std)
    blocks[rng.random(n_blocks) < 0.03] = 0  # some zero blocks
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("ggml_type", PACKED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,cols", [(1, 256), (19, 512), (111, 768)])
def test_repack_is_lossless(ggml_type, rows, cols):
    rng = np.random.default_rng([int(ggml_type), rows, cols])
    raw = make_weight(ggml_type, rows, cols, rng)
    packed = repack(raw, ggml_type)
    assert (packed.rows, packed.cols) == (rows, cols)
    assert packed.nbytes == raw.nbytes
    assert packed.buffer.nbytes < raw.nbytes + ALIGN * len(packed.parts)  # the file's bytes, aligned
    assert np.array_equal(unpack(packed), raw)
    for part in packed.parts:
        # offsets in the buffer are aligned (a device allocation starts 256-byte aligned)
        assert (part.ctypes.data - packed.buffer.ctypes.data) % ALIGN == 0
        assert np.shares_memory(part, packed.buffer)


@pytest.mark.parametrize("ggml_type", PACKED_TYPES, ids=lambda t: t.name)
def test_rows_of_is_a_view_of_those_rows(ggml_type):
    """rows_of's slices of every part hold exactly those rows' GGUF bytes, in the weight's buffer,
    16-byte aligned; a row that starts off 16 bytes in some part is refused."""
    rows, cols = 9, 512
    raw = make_weight(ggml_type, rows, cols, np.random.default_rng(int(ggml_type)))
    packed = repack(raw, ggml_type)
    for start, stop in ((0, 8), (8, 9), (0, 9), (4, 6)):
        view = rows_of(packed, start, stop)
        assert (view.rows, view.cols, view.ggml_type) == (stop - start, cols, ggml_type)
        assert np.array_equal(unpack(view), raw[start:stop])
        for part in view.parts:
            assert np.shares_memory(part, packed.buffer) and (part.ctypes.data - packed.buffer.ctypes.data) % 16 == 0
    short = max(32, GGML_QUANT_SIZES[ggml_type][0])  # one block a row: e.g. Q8_0's d, 2 bytes a row
    odd = next((r for r in range(1, rows) if not rows_aligned(ggml_type, short, r)), None)
    if odd is not None:
        with pytest.raises(AssertionError):
            rows_of(repack(make_weight(ggml_type, rows, short, np.random.default_rng(1)), ggml_type), odd, odd + 1)


def test_repack_takes_typed_f16_f32_rows():
    rng = np.random.default_rng(1)
    for dt, t in ((np.float16, T.F16), (np.float32, T.F32)):
        w = rng.standard_normal((19, 64)).astype(dt)  # as ModelFile gives F16/F32 tensors
        packed = repack(w, t)
        assert (packed.rows, packed.cols) == (19, 64)
        assert np.array_equal(unpack(packed).view(dt), w)


@pytest.mark.parametrize("ggml_type", PACKED_TYPES, ids=lambda t: t.name)
def test_make_weight_is_finite(ggml_type):
    w = dequantize(make_weight(ggml_type, 19, 512, np.random.default_rng(7)), ggml_type)
    assert np.isfinite(w).all() and np.std(w) > 0


def test_repack_rejects_partial_rows():
    with pytest.raises(ValueError):
        repack(np.zeros((2, 20), np.uint8), T.Q8_0)
    with pytest.raises(ValueError):
        repack(np.zeros((2, 16), np.float16), T.F16)  # 16 columns: not whole 32-chunks
