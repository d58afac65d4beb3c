"""Device functions that decode the GGML K-quant superblocks (Q4_K, Q5_K, Q6_K) from impnb's
repacked layout (kernels/common/repack.py).

Every quant type is decoded in *chunks* of 32 weights: `<type>_load(parts, g)` reads global chunk
g = row * cols/32 + c with 16-byte loads; `<type>_run(raw, c, h, w)` writes the 16 weights of half
h into w[0:16] and returns their scale s, so the weights are w[i] * s, bit-equal to
`gguf.quants.dequantize` (symmetric types return q - offset and the block scale; types with a min
return the finished weight and s = 1; only c % 8 matters, rows hold whole superblocks). Those 16
weights sit at row columns `<type>_k(c, h) + 0..15`. GEMV's faster affine decoders (gemv.py)
reuse the loads and layouts. Columns of a half-chunk: k4_k (Q4_K, Q5_K), q6_k_k.
"""

import numpy as np
from numba import cuda, float32, uint32

from impnb.kernels.common.quant_intrinsics import (HALF, LO1, LO2, LO4, NEG_TWO23, ONE, bytes4_affine,
                                            bytes4_minus, f16_to_f32, f32_to_f16_bits, fma_f16x2, ldg_u32x4,
                                            prmt, shr32)


@cuda.jit(device=True, inline=True)
def k_scales(hdr, c):
    """6-bit (scale, min) of sub-blocks 2p and 2p+1, p = (c % 8) // 2 (Q4_K, Q5_K), from the 12
    scale bytes hdr[1..3]; the pair sits at the same byte offset and is decoded at once."""
    s = 8 * (c & 2)
    b1 = shr32(hdr[1], s)
    b2 = shr32(hdr[2], s)
    b3 = shr32(hdr[3], s)
    if c & 4:
        sc = (b3 & 0x0F0F) | ((b1 >> 2) & 0x3030)
        mn = ((b3 >> 4) & 0x0F0F) | ((b2 >> 2) & 0x3030)
    else:
        sc = b1 & 0x3F3F
        mn = b2 & 0x3F3F
    return (float32(uint32(sc & 0xFF)), float32(uint32(mn & 0xFF)),
            float32(uint32((sc >> 8) & 0xFF)), float32(uint32((mn >> 8) & 0xFF)))


# -- Q4_K / Q5_K: 8 chunks per 256-superblock; chunk L holds sub-blocks 2(L//2) (low nibbles)
#    and 2(L//2)+1 (high nibbles), columns 16(L%2)..+16 of each; hdr = d, dmin, 12 scale bytes --

@cuda.jit(device=True, inline=True)
def q4_k_load(parts, g):
    qs, hdr = parts
    return ldg_u32x4(qs, 4 * g), ldg_u32x4(hdr, 4 * (g >> 3))


@cuda.jit(device=True, inline=True)
def _k_affine_words(hdr, c, h):
    sc0, mn0, sc1, mn1 = k_scales(hdr, c)
    sc = sc0 if h == 0 else sc1
    mn = mn0 if h == 0 else mn1
    dd = f16_to_f32(hdr[0] & HALF) * sc
    dm = f16_to_f32(hdr[0] >> 16) * mn
    return dd, dd * NEG_TWO23, -dm


@cuda.jit(device=True, inline=True)
def q4_k_run(raw, c, h, w):
    q = raw[0]
    dd, nd23, m = _k_affine_words(raw[1], c, h)
    sh = 4 * h
    for j in range(4):
        bytes4_affine(shr32(q[j], sh) & LO4, dd, nd23, m, w, 4 * j)
    return ONE


@cuda.jit(device=True, inline=True)
def q5_k_load(parts, g):
    qs, qh, hdr = parts
    sb = g >> 3
    return (ldg_u32x4(qs, 4 * g), ldg_u32x4(qh, 8 * sb + 4 * (g & 1)),
            ldg_u32x4(hdr, 4 * sb))


@cuda.jit(device=True, inline=True)
def q5_k_run(raw, c, h, w):
    q = raw[0]
    qh = raw[1]
    dd, nd23, m = _k_affine_words(raw[2], c, h)
    sh = 4 * h
    hb = 2 * ((c & 7) >> 1) + h
    for j in range(4):
        hi = (shr32(qh[j], hb) & LO1) << 4
        bytes4_affine((shr32(q[j], sh) & LO4) | hi, dd, nd23, m, w, 4 * j)
    return ONE


@cuda.jit(device=True, inline=True)
def k4_k(c, h):
    L = c & 7
    return 256 * (c >> 3) + 64 * (L >> 1) + 16 * (L & 1) + 32 * h


# -- Q4_K on f16x2 (the wgmma tiles' decode): a byte of nibbles masked to one nibble and given an
#    exponent byte by prmt makes a half of value base + q: 1024 for a low nibble (mantissa unit 1),
#    64 for a high one kept at bits 4..7 (mantissa unit 1/16 there); the base taken off exactly,
#    then q * s + m rounded once per half --

LO_NIBBLES = np.uint32(0x0F0F0F0F)
HI_NIBBLES = np.uint32(0xF0F0F0F0)
EXP_1024 = np.uint32(0x64646464)  # the high byte of half 1024, in every byte
EXP_64 = np.uint32(0x54545454)    # of half 64
H2_ONE = np.uint32(0x3C003C00)
H2_NEG_1024 = np.uint32(0xE400E400)
H2_NEG_64 = np.uint32(0xD400D400)


@cuda.jit(device=True, inline=True)
def h2(v):
    """v rounded to fp16, in both halves of a word."""
    b = f32_to_f16_bits(v)
    return b | (b << 16)


@cuda.jit(device=True, inline=True)
def _q4_pairs(x, exp, base, s2, m2):
    # -- bytes 0..3 of x (one nibble each) -> (w0, w1), (w2, w3) as f16x2 words --
    w01 = fma_f16x2(fma_f16x2(prmt(x, exp, 0x4140), H2_ONE, base), s2, m2)
    w23 = fma_f16x2(fma_f16x2(prmt(x, exp, 0x4342), H2_ONE, base), s2, m2)
    return w01, w23


@cuda.jit(device=True, inline=True)
def q4_word(q, lo_s2, lo_m2, hi_s2, hi_m2):
    """One 32-bit word of Q4_K quants as f16x2 words q * s2 + m2: its low nibbles' 4 weights (two
    words of bytes 0-1 and 2-3), then its high nibbles' (the next sub-block's scale and min)."""
    a0, a1 = _q4_pairs(q & LO_NIBBLES, EXP_1024, H2_NEG_1024, lo_s2, lo_m2)
    b0, b1 = _q4_pairs(q & HI_NIBBLES, EXP_64, H2_NEG_64, hi_s2, hi_m2)
    return a0, a1, b0, b1


@cuda.jit(device=True, inline=True)
def q4_k_words(raw, c):
    """Chunk c's 32 weights as 16 f16x2 words: words 0..7 half 0 (columns k4_k(c, 0) + 0..15), 8..15
    half 1, word i holding columns 2i (low half) and 2i + 1 of its half: q * fp16(d sc) +
    fp16(-dmin mn) rounded once, so within a rounding of the scale and the min of q4_k_run's values
    (not bit-equal to dequant). Numpy twin: dequant.q4_k_f16x2_ref."""
    q = raw[0]
    d0, _, m0 = _k_affine_words(raw[1], c, 0)
    d1, _, m1 = _k_affine_words(raw[1], c, 1)
    s0, n0, s1, n1 = h2(d0), h2(m0), h2(d1), h2(m1)
    a0, a1, e0, e1 = q4_word(q[0], s0, n0, s1, n1)
    b0, b1, f0, f1 = q4_word(q[1], s0, n0, s1, n1)
    c0, c1, g0, g1 = q4_word(q[2], s0, n0, s1, n1)
    x0, x1, h0, h1 = q4_word(q[3], s0, n0, s1, n1)
    return a0, a1, b0, b1, c0, c1, x0, x1, e0, e1, f0, f1, g0, g1, h0, h1


# -- Q6_K: chunk L = 4*hb + cc of a superblock holds ql bytes 64hb+16cc..+16: low nibbles are
#    columns 128hb+16cc+i, high nibbles +64; their 2 high bits sit in qh bytes 32hb+16(cc%2)+i --

@cuda.jit(device=True, inline=True)
def q6_k_load(parts, g):
    ql, qh, sc, d = parts
    sb = g >> 3
    L = g & 7
    s = 16 * sb + 8 * (L >> 2) + (L & 3)
    return (ldg_u32x4(ql, 4 * g), ldg_u32x4(qh, 16 * sb + 8 * (L >> 2) + 4 * (L & 1)),
            float32(d[sb]), float32(sc[s]), float32(sc[s + 4]))


@cuda.jit(device=True, inline=True)
def q6_k_run(raw, c, h, w):
    ql = raw[0]
    qh = raw[1]
    sh = 4 * h
    hs = 2 * (2 * h + ((c & 3) >> 1))
    off = np.float32(8388640.0)  # 2^23 + 32
    for j in range(4):
        hi = (shr32(qh[j], hs) & LO2) << 4
        bytes4_minus((shr32(ql[j], sh) & LO4) | hi, off, w, 4 * j)
    return raw[2] * (raw[3] if h == 0 else raw[4])


H2_NEG_1056 = np.uint32(0xE420E420)  # -(1024 + 32) in both halves


@cuda.jit(device=True, inline=True)
def q6_pairs(x, s2):
    """Bytes 0..3 of x (6-bit quants) as f16x2 words (w0, w1), (w2, w3): (q - 32) * s2 rounded once."""
    w01 = fma_f16x2(fma_f16x2(prmt(x, EXP_1024, 0x4140), H2_ONE, H2_NEG_1056), s2, uint32(0))
    w23 = fma_f16x2(fma_f16x2(prmt(x, EXP_1024, 0x4342), H2_ONE, H2_NEG_1056), s2, uint32(0))
    return w01, w23


@cuda.jit(device=True, inline=True)
def _q6_half(ql, qh, c, h, s2):
    # -- half h's 16 weights: low (h 0) or high nibbles of ql, 2 bits of qh above them --
    sh = 4 * h
    hs = 2 * (2 * h + ((c & 3) >> 1))
    a0, a1 = q6_pairs((shr32(ql[0], sh) & LO4) | ((shr32(qh[0], hs) & LO2) << 4), s2)
    b0, b1 = q6_pairs((shr32(ql[1], sh) & LO4) | ((shr32(qh[1], hs) & LO2) << 4), s2)
    c0, c1 = q6_pairs((shr32(ql[2], sh) & LO4) | ((shr32(qh[2], hs) & LO2) << 4), s2)
    d0, d1 = q6_pairs((shr32(ql[3], sh) & LO4) | ((shr32(qh[3], hs) & LO2) << 4), s2)
    return a0, a1, b0, b1, c0, c1, d0, d1


@cuda.jit(device=True, inline=True)
def q6_k_words(raw, c):
    """Chunk c's 32 weights as 16 f16x2 words as q4_k_words lays them out (columns q6_k_k(c, h)):
    (q - 32) * fp16(d sc) rounded once, the quant made the half 1024 + q by prmt and 1056 taken off
    exactly; within a rounding of the scale of q6_k_run's values. Numpy twin: dequant.q6_k_f16x2_ref."""
    ql = raw[0]
    qh = raw[1]
    a = _q6_half(ql, qh, c, 0, h2(raw[2] * raw[3]))
    b = _q6_half(ql, qh, c, 1, h2(raw[2] * raw[4]))
    return a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]


@cuda.jit(device=True, inline=True)
def q6_k_k(c, h):
    L = c & 7
    return 256 * (c >> 3) + 128 * (L >> 2) + 16 * (L & 3) + 64 * h
