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
                                            bytes4_minus, f16_to_f32, ldg_u32x4, shr32)


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


@cuda.jit(device=True, inline=True)
def q6_k_k(c, h):
    L = c & 7
    return 256 * (c >> 3) + 128 * (L >> 2) + 16 * (L & 3) + 64 * h
