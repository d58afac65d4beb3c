"""Device functions that decode the 32-weight GGML blocks (Q8_0, Q4_0, Q4_1, Q5_0) and plain
F16 / F32 rows from impnb's repacked layout (kernels/common/repack.py).

Every quant type is decoded in *chunks* of 32 weights: `<type>_load(parts, g)` reads global chunk
g = row * cols/32 + c with 16-byte loads; `<type>_run(raw, c, h, w)` writes the 16 weights of half
h into w[0:16] and returns their scale s, so the weights are w[i] * s, bit-equal to
`gguf.quants.dequantize` (symmetric types return q - offset and the block scale; types with a min
return the finished weight and s = 1; only c % 8 matters, rows hold whole superblocks). Those 16
weights sit at row columns `<type>_k(c, h) + 0..15`. GEMV's faster affine decoders (gemv.py)
reuse the loads and layouts. Column of a half-chunk: block32_k.
"""

import numpy as np
from numba import cuda, float32

from impnb.kernels.common.quant_intrinsics import (BIT4, HALF, LO4, NEG_TWO23, ONE, SIGN8, SPREAD4, as_f32,
                                            bytes4_affine, bytes4_minus, f16_to_f32, halves2,
                                            ldg_u32x4, shr32)


# -- Q8_0: qs int8 (4 u32 per half-chunk), d f16 per 32 --

@cuda.jit(device=True, inline=True)
def q8_0_load(parts, g):
    qs, d = parts
    a = ldg_u32x4(qs, 8 * g)
    b = ldg_u32x4(qs, 8 * g + 4)
    return a, b, float32(d[g])


@cuda.jit(device=True, inline=True)
def q8_0_run(raw, c, h, w):
    q = raw[0] if h == 0 else raw[1]
    off = np.float32(8388736.0)  # 2^23 + 128: bytes xor 0x80 are q + 128
    for j in range(4):
        bytes4_minus(q[j] ^ SIGN8, off, w, 4 * j)
    return raw[2]


# -- Q4_0 / Q4_1 / Q5_0: qs 16 bytes per block (byte i: elements i and 16+i) --

@cuda.jit(device=True, inline=True)
def q4_0_load(parts, g):
    qs, d = parts
    return ldg_u32x4(qs, 4 * g), float32(d[g])


@cuda.jit(device=True, inline=True)
def q4_0_run(raw, c, h, w):
    q = raw[0]
    sh = 4 * h
    off = np.float32(8388616.0)  # 2^23 + 8
    for j in range(4):
        bytes4_minus(shr32(q[j], sh) & LO4, off, w, 4 * j)
    return raw[1]


@cuda.jit(device=True, inline=True)
def q4_1_load(parts, g):
    qs, dm = parts
    return ldg_u32x4(qs, 4 * g), dm[g]


@cuda.jit(device=True, inline=True)
def q4_1_run(raw, c, h, w):
    q = raw[0]
    d = f16_to_f32(raw[1] & HALF)
    m = f16_to_f32(raw[1] >> 16)
    nd23 = d * NEG_TWO23
    sh = 4 * h
    for j in range(4):
        bytes4_affine(shr32(q[j], sh) & LO4, d, nd23, m, w, 4 * j)
    return ONE


@cuda.jit(device=True, inline=True)
def q5_0_load(parts, g):
    qs, qh, d = parts
    return ldg_u32x4(qs, 4 * g), qh[g], float32(d[g])


@cuda.jit(device=True, inline=True)
def q5_0_run(raw, c, h, w):
    q = raw[0]
    sh = 4 * h
    off = np.float32(8388624.0)  # 2^23 + 16
    for j in range(4):
        hi = ((shr32(raw[1], 16 * h + 4 * j) & 15) * SPREAD4) & BIT4
        bytes4_minus((shr32(q[j], sh) & LO4) | hi, off, w, 4 * j)
    return raw[2]


@cuda.jit(device=True, inline=True)
def block32_k(c, h):
    return 32 * c + 16 * h


# -- F16 / F32: plain rows, 32 values per chunk --

@cuda.jit(device=True, inline=True)
def f16_load(parts, g):
    (v,) = parts
    return (ldg_u32x4(v, 16 * g), ldg_u32x4(v, 16 * g + 4),
            ldg_u32x4(v, 16 * g + 8), ldg_u32x4(v, 16 * g + 12))


@cuda.jit(device=True, inline=True)
def f16_run(raw, c, h, w):
    a = raw[0] if h == 0 else raw[2]
    b = raw[1] if h == 0 else raw[3]
    for j in range(4):
        halves2(a[j], w, 2 * j)
        halves2(b[j], w, 8 + 2 * j)
    return ONE


@cuda.jit(device=True, inline=True)
def f32_load(parts, g):
    (v,) = parts
    return (ldg_u32x4(v, 32 * g), ldg_u32x4(v, 32 * g + 4),
            ldg_u32x4(v, 32 * g + 8), ldg_u32x4(v, 32 * g + 12),
            ldg_u32x4(v, 32 * g + 16), ldg_u32x4(v, 32 * g + 20),
            ldg_u32x4(v, 32 * g + 24), ldg_u32x4(v, 32 * g + 28))


@cuda.jit(device=True, inline=True)
def f32_run(raw, c, h, w):
    for i in range(4):
        q = raw[4 * h + i]
        for j in range(4):
            w[4 * i + j] = as_f32(q[j])
    return ONE
