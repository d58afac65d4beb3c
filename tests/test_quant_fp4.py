"""MXFP4 and NVFP4 (impnb/quant_fp4.py): decode bit-exact against gguf.quants on every scale byte
and code, the UE4M3 encoder against gguf's, the encoders' round trip on valid blocks and their
error on Gaussian data."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from impnb import quant_fp4 as f

FORMATS = (f.MXFP4, f.NVFP4)
IDS = [fmt.ggml_type.name for fmt in FORMATS]
# the scale bytes ggml's encoder can write: every E8M0 exponent but the three whose ±12
# overflows; UE4M3 1..0x77 (normal and subnormal) and 0x7E, the saturated 448
VALID_SCALES = {T.MXFP4: np.arange(0, 253), T.NVFP4: np.r_[np.arange(1, 0x78), 0x7E]}


def _gguf(raw, fmt):
    with np.errstate(all="ignore"):
        return gq.dequantize(raw, fmt.ggml_type)


def _blocks(fmt, scales, codes):
    return fmt.pack(np.asarray(scales, np.uint8), np.asarray(codes, np.uint8))


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_every_scale_byte_and_code(fmt):
    """Each of the 256 scale bytes (E8M0 0/1 subnormal and 255, UE4M3 subnormals, 0x7F's zero,
    bit 7 set) with all 16 codes, ±0 included."""
    n = 256
    codes = np.tile(np.arange(16, dtype=np.uint8), (n, fmt.n_sub, fmt.sub // 16))
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], fmt.n_sub, axis=1)
    raw = _blocks(fmt, scales, codes).reshape(8, -1)
    with np.errstate(over="ignore"):
        got = fmt.dequantize(raw)
    assert np.array_equal(got.view(np.uint32), _gguf(raw, fmt).view(np.uint32))


@pytest.mark.parametrize("rows", (1, 19, 111))
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_random_and_zero_blocks(fmt, rows):
    rng = np.random.default_rng(rows)
    raw = rng.integers(0, 256, (rows, 3 * fmt.size), dtype=np.uint8)
    raw[rows // 2] = 0
    got = fmt.dequantize(raw)
    assert np.array_equal(got.view(np.uint32), _gguf(raw, fmt).view(np.uint32))
    assert not got[rows // 2].any()


def test_ue4m3_matches_gguf():
    """to_ue4m3 as gguf's fp32_to_ue4m3 (ggml's C rule) on every magnitude, the subnormal
    boundary, the rounding carries and saturation; ue4m3_half as gguf's decode on all bytes."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(20000) * s for s in (1e-5, 1e-3, 1e-2, 1, 100, 1e4)])
    edges = [0, 2 ** -6, np.nextafter(2 ** -6, 0), 7.5 / 512, 7.49 / 512, 0.5 / 512, 0.49 / 512,
             1.9375, 1.96875, 240, 248, 440, 448, 449, 1e30]
    x = np.abs(np.concatenate([x, edges])).astype(np.float32)
    assert np.array_equal(f.to_ue4m3(x), gq.NVFP4.fp32_to_ue4m3(x))
    assert not f.to_ue4m3(np.array([-1.0, -0.0, np.nan, -np.inf], np.float32)).any()
    b = np.arange(256, dtype=np.uint8)
    assert np.array_equal(f.ue4m3_half(b), gq.NVFP4.ue4m3_to_fp32(b).astype(np.float32))
    assert np.array_equal(f.e8m0_half(b).view(np.uint32), gq.MXFP4.e8m0_to_fp32_half(b).view(np.uint32))


def test_mxfp4_encoder_matches_gguf():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((30, 320)) * np.repeat([1e-3, 1.0, 1e3], 10)[:, None]).astype(np.float32)
    x[0] = 0
    x[1, :40] = 0
    x[2, :32] = 2.0 ** rng.integers(-20, 20, 32)  # exact powers of two: floor(log2) at its edge
    assert np.array_equal(f.quantize_mxfp4(x), gq.quantize(x, T.MXFP4))


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_round_trip_of_valid_blocks(fmt):
    """encode(dequant(q)) == q where q is what the encoder writes: a scale byte it can write, a
    ±12 code in each scale's group, zeros as code 0 (not 8); zero groups as scale 0, codes 0."""
    rng = np.random.default_rng(int(fmt.ggml_type))
    n = 4000
    scales = rng.choice(VALID_SCALES[fmt.ggml_type], (n, fmt.n_sub)).astype(np.uint8)
    codes = rng.integers(0, 16, (n, fmt.n_sub, fmt.sub)).astype(np.uint8)
    codes[codes == 8] = 0
    top = rng.integers(0, fmt.sub, (n, fmt.n_sub, 1))
    np.put_along_axis(codes, top, rng.choice([7, 15], (n, fmt.n_sub, 1)).astype(np.uint8), axis=-1)
    scales[:50] = 0
    codes[:50] = 0
    q = _blocks(fmt, scales, codes)
    w = fmt.dequantize(q.reshape(1, -1))
    assert np.isfinite(w).all()
    assert np.array_equal(f.quantize(w.reshape(n, -1), fmt.ggml_type), q)


@pytest.mark.parametrize("std", (0.05, 1.0, 100.0))
def test_nvfp4_gaussian_error(std):
    """(UE4M3's smallest scale is 2^-9: groups below amax 6 · 2^-10 encode as zeros, the reason
    checkpoints carry a second-level scale.) Each weight within half a grid step of its scale's E2M1 grid (|x| <= 6 d̂, d̂ = the scale
    amax / 6 rounded to UE4M3, at most 1/16 off); NMSE as E2M1's."""
    rng = np.random.default_rng(int(std * 1000))
    x = (rng.standard_normal((19, 640)) * std).astype(np.float32)
    q = f.quantize_nvfp4(x)
    w = f.NVFP4.dequantize(q)
    assert np.array_equal(w, _gguf(q, f.NVFP4))
    groups = np.abs(x).reshape(-1, 16)
    d = f.ue4m3_half(q.reshape(-1, 36)[:, :4]).reshape(-1, 1)  # half a scale: the grid's unit
    err = np.abs(w - x).reshape(-1, 16)
    # the grid's largest gap is 4 units (8 -> 12); past 12 units the clamp's error
    bound = np.maximum(2 * d, groups - 12 * d) * (1 + 1e-6)
    assert (err <= bound).all()
    nmse = np.mean((w - x) ** 2) / np.mean(x ** 2)
    assert nmse < 0.02, nmse
