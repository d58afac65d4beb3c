"""Every supported GGML type read back from a GGUF file dequantizes bit-exactly as gguf.quants does."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, quants as gguf_quants

from impnb.errors import UnsupportedError
from impnb.gguf_file import open_model_file
from impnb.quants import FORMATS, quant_format
from tests.gguf_craft import write_tiny_gguf

ROWS = (1, 19, 111)
BLOCKS_PER_ROW = 3
STDS = (0.01, 1.0, 100.0)
REQUIRED = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
            T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.MXFP4, T.NVFP4)


def _gguf_can_quantize(qtype: T) -> bool:
    try:
        gguf_quants.quantize(np.ones((1, GGML_QUANT_SIZES[qtype][0]), np.float32), qtype)
    except NotImplementedError:
        return False
    return True


TYPES = [fmt.ggml_type for fmt in FORMATS.values()]  # FORMATS is keyed by type id
QUANTIZABLE = [t for t in TYPES if _gguf_can_quantize(t)]


def as_bytes(array: np.ndarray) -> np.ndarray:
    """Rows of any tensor encoding as uint8 (rows, row_bytes), the form written to the file."""
    return np.ascontiguousarray(array).view(np.uint8)


def noise(rng, rows: int, qtype: T) -> np.ndarray:
    return rng.integers(0, 256, (rows, FORMATS[qtype].row_bytes(cols(qtype))), dtype=np.uint8)


def cols(qtype: T) -> int:
    return BLOCKS_PER_ROW * FORMATS[qtype].block_size


def read_back(tmp_path, qtype: T, raw: np.ndarray, seed: int) -> np.ndarray:
    """Write `raw` as tensor x between two random-bytes tensors, open the file, dequantize x."""
    rng = np.random.default_rng(seed + 1000)
    path = write_tiny_gguf(tmp_path / "q.gguf", {
        "before": (noise(rng, 2, T.Q8_0), T.Q8_0),
        "x": (raw, qtype),
        "after": (noise(rng, 3, T.Q4_0), T.Q4_0),
    })
    tensor = open_model_file(path).tensors["x"]
    assert tensor.ggml_type == qtype and tensor.shape == (raw.shape[0], cols(qtype))
    with np.errstate(all="ignore"):  # random scales may be inf/NaN
        return tensor.dequantize()


def assert_matches_reference(out: np.ndarray, raw: np.ndarray, qtype: T):
    with np.errstate(all="ignore"):
        ref = gguf_quants.dequantize(raw, qtype)
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert np.array_equal(out, ref, equal_nan=True), (
        f"{qtype.name}: {np.count_nonzero(~((out == ref) | np.isnan(out) & np.isnan(ref)))} values differ")
    return ref


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_gaussian_data(tmp_path, qtype, std, rows):
    seed = rows * 7 + STDS.index(std)
    x = (np.random.default_rng(seed).standard_normal((rows, cols(qtype))) * std).astype(np.float32)
    raw = as_bytes(gguf_quants.quantize(x, qtype))
    out = read_back(tmp_path, qtype, raw, seed)
    assert_matches_reference(out, raw, qtype)
    # The bytes hold x in this format: the round trip stays near it (4-bit types: NMSE ~1e-2).
    assert np.mean((out - x) ** 2) / np.mean(x ** 2) < 0.05


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_random_bytes(tmp_path, qtype, rows):
    """Every bit pattern, scales included; non-finite scales give NaN/inf, compared NaN-equal."""
    raw = noise(np.random.default_rng(rows), rows, qtype)
    out = read_back(tmp_path, qtype, raw, rows)
    ref = assert_matches_reference(out, raw, qtype)
    assert np.isfinite(ref).mean() > 0.5 and np.count_nonzero(ref) > ref.size // 4


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_zero_blocks(tmp_path, qtype, rows):
    raw = np.zeros((rows, FORMATS[qtype].row_bytes(cols(qtype))), np.uint8)
    out = read_back(tmp_path, qtype, raw, rows)
    assert_matches_reference(out, raw, qtype)
    assert not out.any()


def test_supported_table():
    assert set(REQUIRED) <= set(FORMATS)
    for qtype, fmt in FORMATS.items():
        assert (fmt.ggml_type, fmt.block_size, fmt.type_size) == (qtype, *GGML_QUANT_SIZES[qtype])
        assert quant_format(int(qtype), "w") is fmt


@pytest.mark.parametrize("qtype", [T.IQ2_XXS, T.TQ1_0, T.IQ4_XS])
def test_quant_format_refuses_unsupported(qtype):
    with pytest.raises(UnsupportedError, match=rf"tensor blk\.0\.ffn_down\.weight: GGML type {qtype.name} "):
        quant_format(int(qtype), "blk.0.ffn_down.weight")


def test_quant_format_refuses_unknown_id():
    with pytest.raises(UnsupportedError, match="tensor w: unknown GGML type id 200"):
        quant_format(200, "w")


@pytest.mark.slow
@pytest.mark.parametrize("model_path", ["smollm2_path", "gemma3_path"])
def test_real_model_tensors_dequantize(model_path, request):
    model = open_model_file(request.getfixturevalue(model_path))
    assert model.tensors
    for name, tensor in model.tensors.items():
        out = tensor.dequantize()
        assert out.dtype == np.float32 and out.shape == tensor.shape, name
        assert np.isfinite(out).all(), name
