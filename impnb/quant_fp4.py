"""MXFP4 and NVFP4, the GGUF 4-bit float formats: their block layouts, the numpy reference decode
the GPU kernels share (E2M1 codes -> int8 through one table, times the block scale), and the
encoders (the `gguf` package cannot quantize NVFP4).

Both store E2M1 codes, nibble i = sign | 3-bit magnitude, as the *doubled* values of `KVALUES`
(0, ±1, ±2, ±3, ±4, ±6, ±8, ±12) and halve the scale instead, as ggml does; a weight is
scale_half · KVALUES[code], exact in float32 (at most 4 + 2 significant bits).

  MXFP4  32 weights in 17 bytes: e (E8M0 exponent), qs[16] (byte j: weights j and j + 16)
  NVFP4  64 weights in 36 bytes: d[4] (UE4M3 scale per 16 weights), qs[32] (sub-block s owns
         bytes 8s..8s+7; byte 8s + j: weights 16s + j and 16s + j + 8)

NVFP4 in GGUF carries no per-tensor second-level scale (ggml's block_nvfp4 is d[4] and qs[32]):
a tensor's global scale, where a checkpoint has one, is folded into the blocks at conversion.
"""

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """E8M0 exponent bytes -> 2^(e - 128) float32 (the scale halved; e < 2 subnormal)."""
    e = np.asarray(e, np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def ue4m3_half(b: np.ndarray) -> np.ndarray:
    """UE4M3 scale bytes -> half their value, float32: bits 6..3 exponent (bias 7), 2..0
    mantissa, bit 7 ignored; exponent 0 is subnormal (m · 2^-9); 0x7F (NaN in E4M3) reads 0."""
    b = np.asarray(b, np.uint32)
    e, m = (b >> 3) & 15, b & 7
    normal = ((e + 119) << np.uint32(23)) | (m << np.uint32(20))  # (1 + m/8) 2^(e - 8)
    sub = (m.astype(np.float32) * np.float32(2.0 ** -10)).view(np.uint32)
    bits = np.where(e == 0, sub, normal)
    return np.where(b == 0x7F, np.uint32(0), bits).astype(np.uint32).view(np.float32)


def to_ue4m3(x: np.ndarray) -> np.ndarray:
    """float32 -> UE4M3 bytes, ggml's rule: x <= 0 or NaN -> 0; clamp at 448; below 2^-6 the
    subnormal m = int(x · 512 + 0.5) clamped to 1..7 (else 0); above, the top three mantissa bits
    rounded half up on the fourth, saturating at 0x7E (448)."""
    x = np.asarray(x, np.float32)
    pos = x > 0  # NaN compares False
    x = np.where(pos, np.minimum(x, np.float32(448.0)), np.float32(0.0)).astype(np.float32)
    bits = x.view(np.uint32).astype(np.int64)
    exp = ((bits >> 23) & 0xFF) - 120  # the UE4M3 exponent before rounding
    man = ((bits >> 20) & 7) + ((bits >> 19) & 1)
    carried = np.where(man > 7, exp + 1, exp)
    normal = np.where(carried >= 15, 0x7E, (np.clip(carried, 0, 15) << 3) | (man & 7))
    sub = np.clip((x * np.float32(512.0) + np.float32(0.5)).astype(np.int64), 0, 7)
    out = np.where(exp <= 0, sub, normal)
    return np.where(pos, out, 0).astype(np.uint8)


def nearest_codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The code of KVALUES · d nearest each x (float32 |k d - x|, ties to the lowest code, as
    ggml's best_index_mxfp4): x (..., n), d (..., 1) -> uint8 (..., n)."""
    with np.errstate(over="ignore"):  # near float32's top, far codes' distances overflow to inf
        err = np.abs(KVALUES.astype(np.float32) * d[..., None] - x[..., None])
    return np.argmin(err, axis=-1).astype(np.uint8)


@dataclass(frozen=True)
class Fp4Format:
    """One 4-bit float format: `block` weights in `size` bytes, `sub` weights a scale; the scale
    bytes lead the block; within a sub-block byte j holds weights j (low nibble) and j + sub/2."""

    ggml_type: T
    block: int
    size: int
    sub: int
    scale_half: staticmethod  # scale bytes -> the halved scale, float32

    @property
    def n_sub(self) -> int:
        return self.block // self.sub

    def codes(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(n, size) uint8 blocks -> (scale bytes (n, n_sub), codes (n, n_sub, sub))."""
        sc, qs = blocks[:, :self.n_sub], blocks[:, self.n_sub:].reshape(-1, self.n_sub, self.sub // 2)
        return sc, np.concatenate([qs & 0x0F, qs >> 4], axis=-1)

    def pack(self, sc: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """codes() inverted: scale bytes (n, n_sub) and codes (n, n_sub, sub) -> (n, size) blocks."""
        h = self.sub // 2
        qs = (codes[..., :h] | (codes[..., h:] << 4)).astype(np.uint8)
        return np.concatenate([sc.astype(np.uint8), qs.reshape(len(sc), -1)], axis=1)

    def dequantize(self, data: np.ndarray) -> np.ndarray:
        """Raw bytes (rows, row_bytes) -> float32 (rows, cols): scale_half · KVALUES[code]."""
        raw = np.ascontiguousarray(data).view(np.uint8)
        sc, codes = self.codes(raw.reshape(-1, self.size))
        with np.errstate(over="ignore"):  # E8M0 254 and 255 overflow at the larger codes, as ggml
            w = self.scale_half(sc)[..., None] * KVALUES[codes].astype(np.float32)
        return w.reshape(raw.shape[0], -1)


MXFP4 = Fp4Format(T.MXFP4, 32, 17, 32, staticmethod(e8m0_half))
NVFP4 = Fp4Format(T.NVFP4, 64, 36, 16, staticmethod(ue4m3_half))
FP4_FORMATS = {f.ggml_type: f for f in (MXFP4, NVFP4)}


def quantize_nvfp4(x: np.ndarray) -> np.ndarray:
    """float32 (rows, cols), cols a multiple of 64 -> NVFP4 bytes (rows, cols / 64 · 36), as
    ggml's quantize_row_nvfp4_ref: per 16 weights the scale UE4M3(amax / 6) (float32 division),
    each weight the nearest code of that scale's grid."""
    x = np.asarray(x, np.float32)
    rows, cols = x.shape
    assert cols % NVFP4.block == 0, cols
    xs = x.reshape(-1, NVFP4.n_sub, NVFP4.sub)
    sc = to_ue4m3(np.abs(xs).max(axis=-1) / np.float32(6.0))
    codes = nearest_codes(xs, ue4m3_half(sc)[..., None])
    return NVFP4.pack(sc, codes).reshape(rows, -1)


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    """float32 (rows, cols), cols a multiple of 32 -> MXFP4 bytes, as ggml's quantize_row_mxfp4_ref
    (and gguf's): exponent floor(log2(amax)) - 2 + 127, codes nearest on that grid."""
    x = np.asarray(x, np.float32)
    rows, cols = x.shape
    xs = x.reshape(-1, 1, 32)
    amax = np.abs(xs).max(axis=-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)
    codes = nearest_codes(xs, e8m0_half(e)[..., None])
    return MXFP4.pack(e, codes).reshape(rows, -1)


QUANTIZERS = {T.MXFP4: quantize_mxfp4, T.NVFP4: quantize_nvfp4}


def quantize(x: np.ndarray, ggml_type: T) -> np.ndarray:
    """float32 (rows, cols) -> the GGUF bytes of an FP4 type."""
    return QUANTIZERS[T(ggml_type)](x)
