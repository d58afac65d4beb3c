"""Device functions that decode MXFP4 and NVFP4 chunks (32 weights) from the repacked layout
(repack.py), as quant_blocks32.py does for the integer types; the formats: impnb/quant_fp4.py.

E2M1 codes become int8 (ggml's doubled KVALUES) through a 16-byte table in four words and byte
permutes (`e2m1_words`, as llama.cpp's get_int_from_table_16), the form the exact decoders widen;
the dp4a GEMVs take the lookups in their own byte order (`e2m1_interleaved`) or as positive and
negative magnitudes (`e2m1_signed`); the scale byte becomes its halved float by bit assembly. A weight is
scale_half · k, exact in float32, bit-equal to `gguf.quants.dequantize`.

Chunk layout (g = row · cols/32 + c), the same quants for both types (MXFP4's reordered at load,
repack.mxfp4_chunk_order): 16 bytes as 4 words, words 2h, 2h+1 half h (weights 16h..16h+15),
byte b of word 2h + i holding weights 16h + 4i + b (low nibble) and 16h + 8 + 4i + b (high);
MXFP4's e[g] one E8M0 byte for the chunk, NVFP4's d[g] u16 the UE4M3 bytes of half 0 | 1 << 8.
Half h of chunk c holds row columns 32c + 16h .. + 15 (quant_blocks32.block32_k).
"""

import numpy as np
from numba import cuda, float32, uint32

from impnb.kernels.common.quant_intrinsics import SIGN8, as_f32, bytes4_minus, f16_to_f32, ldg_u32x4, prmt, shr32

KV_POS0, KV_POS1 = np.uint32(0x03020100), np.uint32(0x0C080604)  # KVALUES[0..7]: 0 1 2 3 | 4 6 8 12
KV_NEG0, KV_NEG1 = np.uint32(0xFDFEFF00), np.uint32(0xF4F8FAFC)  # KVALUES[8..15]: 0 -1 -2 -3 | -4 -6 -8 -12
LOW3 = np.uint32(0x77777777)
SIGN4 = np.uint32(0x88888888)
SIGN4_AT2 = np.uint32(0x44444444)  # a nibble's sign bit (3) shifted to bit 2
BYTE_IDS = np.uint32(0x32103210)  # prmt selectors 0 1 2 3 for each 16-bit half
INT8_OFF = np.float32(8388736.0)  # 2^23 + 128: an int8 byte xor 0x80 as 2^23 + q + 128


@cuda.jit(device=True, inline=True)
def e2m1_selectors(q):
    """A word's 8 E2M1 codes as prmt selectors: (magnitudes, bit 3 cleared so prmt copies rather
    than sign-fills; per code its byte index, + 4 where negative, to pick from neg after pos)."""
    return q & LOW3, (shr32(q, 1) & SIGN4_AT2) | BYTE_IDS


@cuda.jit(device=True, inline=True)
def e2m1_lookup4(sel, pick):
    """The int8 values of the 4 codes in the low 16 bits of the selectors (prmt reads no more):
    each magnitude looked up in the positive and in the negative table, then per byte the one
    its sign picks."""
    return prmt(prmt(KV_POS0, KV_POS1, sel), prmt(KV_NEG0, KV_NEG1, sel), pick)


@cuda.jit(device=True, inline=True)
def e2m1_interleaved(q):
    """8 E2M1 codes (a word's nibbles) -> the int8 words of nibbles 0..3 and 4..7 as they lie:
    byte b of a word holds its low nibble's value at byte 2 (b % 2) and its high nibble's at
    2 (b % 2) + 1 of word b // 2. Dots against x̂ words permuted to match
    (gemv_dp4a_units.fp4_x_order)."""
    sel, pick = e2m1_selectors(q)
    return e2m1_lookup4(sel, pick), e2m1_lookup4(shr32(sel, 16), shr32(pick, 16))


@cuda.jit(device=True, inline=True)
def e2m1_signed(q):
    """8 E2M1 codes -> (pos, neg), each two words in e2m1_interleaved's byte order: pos the
    magnitudes of the positive codes and 0 for the negative, neg the other way round, so a
    code's value is pos - neg. One table lookup each, no masks: prmt with a selector's bit 3
    set (a negative code; for neg the codes with their sign bits flipped) replicates the sign of
    the table's byte, 0 for every magnitude."""
    nq = q ^ SIGN4
    return ((prmt(KV_POS0, KV_POS1, q), prmt(KV_POS0, KV_POS1, shr32(q, 16))),
            (prmt(KV_POS0, KV_POS1, nq), prmt(KV_POS0, KV_POS1, shr32(nq, 16))))


@cuda.jit(device=True, inline=True)
def e2m1_words(q):
    """8 E2M1 codes (a word's nibbles) -> (int8 word of the 4 low nibbles' values, int8 word of
    the 4 high nibbles')."""
    t0, t1 = e2m1_interleaved(q)
    return prmt(t0, t1, 0x6420), prmt(t0, t1, 0x7531)


@cuda.jit(device=True, inline=True)
def e8m0_half(e):
    """E8M0 byte -> 2^(e - 128) (0 and 1 subnormal), without a branch."""
    e = uint32(e) & 0xFF
    return as_f32(uint32(uint32(0x00200000) << e) if e < 2 else uint32((e - uint32(1)) << uint32(23)))


@cuda.jit(device=True, inline=True)
def ue4m3_half(b):
    """UE4M3 byte -> half its value, bit 7 ignored but 0x7F reads 0 (0xFF does not, as gguf):
    the low 7 bits shifted into an IEEE half's exponent and top mantissa bits are the value times
    2^-8, subnormals included (the bias 15 against 7), so a half conversion and one multiply by
    2^7, without a branch."""
    b = uint32(b) & 0xFF
    v = f16_to_f32((b & 0x7F) << 7) * float32(128.0)
    return float32(0.0) if b == 0x7F else v


@cuda.jit(device=True, inline=True)
def fp4_half_codes(q, h, w):
    """w[0:16] = the int8 values of half h of a chunk's quant words q, as floats."""
    for i in range(2):
        lo, hi = e2m1_words(q[2 * h + i])
        bytes4_minus(lo ^ SIGN8, INT8_OFF, w, 4 * i)
        bytes4_minus(hi ^ SIGN8, INT8_OFF, w, 8 + 4 * i)


# -- MXFP4: qs 16 bytes per chunk, e one byte --

@cuda.jit(device=True, inline=True)
def mxfp4_load(parts, g):
    qs, e = parts
    return ldg_u32x4(qs, 4 * g), e[g]


@cuda.jit(device=True, inline=True)
def mxfp4_run(raw, c, h, w):
    fp4_half_codes(raw[0], h, w)
    return e8m0_half(raw[1])


# -- NVFP4: qs 16 bytes per chunk (two sub-blocks), d two UE4M3 bytes --

@cuda.jit(device=True, inline=True)
def nvfp4_load(parts, g):
    qs, d = parts
    return ldg_u32x4(qs, 4 * g), d[g]


@cuda.jit(device=True, inline=True)
def nvfp4_run(raw, c, h, w):
    fp4_half_codes(raw[0], h, w)
    return ue4m3_half(shr32(raw[1], 8 * h))
