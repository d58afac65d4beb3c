"""GEMV weight decoders: `<type>_unit(raw, c, h, w)` fills 16 floats u_i of half h of chunk c and
returns (a, b) with weight_i = a * u_i + b (see the note below); `DECODERS` maps a type to its
(load, unit, column) triple. Used by gemv.py; the dequant kernels use quant_blocks*.py directly."""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.common import quant_blocks32 as qb32
from impnb.kernels.common import quant_blocks_fp4 as qbf
from impnb.kernels.common import quant_blocks_k as qbk
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.elementwise.activations import gelu_tanh_dev, silu_dev

NO_GLU, SILU, GELU = 0, 1, 2  # epilogues: plain rows, act(gate) * up with SiLU or tanh GELU


@cuda.jit(device=True, inline=True)
def _identity(v):
    return v


GLU_ACTS = (_identity, silu_dev, gelu_tanh_dev)

# -- GEMV decoders: `<type>_unit(raw, c, h, w)` writes w[i] = u_i, an exact float affine
#    in the quant q_i (u = (1 + q/2^bits)/2; u = q + 1152 for Q8_0), and returns (a, b) with
#    weight_i = a * u_i + b, so a row's dot with x is a * sum(u x) + b * sum(x): one fma per
#    weight and a sum of x shared by the rows; rounding stays relative to |x|. --

HALF_1024 = np.uint32(0x64646464)  # high bytes of the half 1024 + byte
ONE_HI = np.uint32(0x3F000000)  # byte 3 of 1.0f


@cuda.jit(device=True, inline=True)
def units4_bytes(word, pos, bits, w, o):
    """w[o+b] = (1 + v_b / 2^bits) / 2 for the fields at bit pos of each byte (bits <= 7): one
    shift and mask per word puts v at bits 7-bits..6 of its byte, then one byte permute per
    weight builds the float 0x3F000000 | byte << 16."""
    top = 7 - bits
    mask = ((1 << bits) - 1) << top
    mask4 = mask | (mask << 8) | (mask << 16) | (mask << 24)
    if pos <= top:
        v = word << (top - pos)
    else:
        v = qi.shr32(word, pos - top)
    p = v & mask4
    w[o] = qi.as_f32(qi.prmt(p, ONE_HI, 0x7054))
    w[o + 1] = qi.as_f32(qi.prmt(p, ONE_HI, 0x7154))
    w[o + 2] = qi.as_f32(qi.prmt(p, ONE_HI, 0x7254))
    w[o + 3] = qi.as_f32(qi.prmt(p, ONE_HI, 0x7354))


@cuda.jit(device=True, inline=True)
def q8_0_unit(raw, c, h, w):
    # u = q + 1152 exactly: the half 0x64 << 8 | (q + 128) is 1024 + q + 128; one byte permute
    # makes two halves, each widened by one conversion.
    q = raw[0] if h == 0 else raw[1]
    for j in range(4):
        u = q[j] ^ qi.SIGN8
        lo = qi.prmt(u, HALF_1024, 0x5140)
        hi = qi.prmt(u, HALF_1024, 0x5342)
        w[4 * j] = qi.f16_to_f32(lo & qi.HALF)
        w[4 * j + 1] = qi.f16_to_f32(lo >> 16)
        w[4 * j + 2] = qi.f16_to_f32(hi & qi.HALF)
        w[4 * j + 3] = qi.f16_to_f32(hi >> 16)
    d = raw[2]
    return d, d * np.float32(-1152.0)


@cuda.jit(device=True, inline=True)
def q4_0_unit(raw, c, h, w):
    q = raw[0]
    for j in range(4):
        units4_bytes(q[j], 4 * h, 4, w, 4 * j)
    d = raw[1]
    return d * np.float32(32.0), d * np.float32(-24.0)  # q = 16 (2u - 1), weight d (q - 8)


@cuda.jit(device=True, inline=True)
def q4_1_unit(raw, c, h, w):
    q = raw[0]
    for j in range(4):
        units4_bytes(q[j], 4 * h, 4, w, 4 * j)
    d = qi.f16_to_f32(raw[1] & qi.HALF) * np.float32(16.0)  # q = 16 (2u - 1), weight d q + m
    return d + d, qi.f16_to_f32(raw[1] >> 16) - d


@cuda.jit(device=True, inline=True)
def q5_0_unit(raw, c, h, w):
    q = raw[0]
    for j in range(4):
        hi = ((qi.shr32(raw[1], 16 * h + 4 * j) & 15) * qi.SPREAD4) & qi.BIT4
        units4_bytes((qi.shr32(q[j], 4 * h) & qi.LO4) | hi, 0, 5, w, 4 * j)
    d = raw[2]
    return d * np.float32(64.0), d * np.float32(-48.0)  # q = 32 (2u - 1), weight d (q - 16)


@cuda.jit(device=True, inline=True)
def _k_unit_affine(hdr, c, h, two_bits):
    sc0, mn0, sc1, mn1 = qbk.k_scales(hdr, c)
    sc = sc0 if h == 0 else sc1
    mn = mn0 if h == 0 else mn1
    dd = qi.f16_to_f32(hdr[0] & qi.HALF) * sc * two_bits  # q = 2^bits (2u - 1)
    return dd + dd, -dd - qi.f16_to_f32(hdr[0] >> 16) * mn


@cuda.jit(device=True, inline=True)
def q4_k_unit(raw, c, h, w):
    q = raw[0]
    for j in range(4):
        units4_bytes(q[j], 4 * h, 4, w, 4 * j)
    return _k_unit_affine(raw[1], c, h, np.float32(16.0))


@cuda.jit(device=True, inline=True)
def q5_k_unit(raw, c, h, w):
    q = raw[0]
    qh = raw[1]
    hb = 2 * ((c & 7) >> 1) + h
    for j in range(4):
        hi = (qi.shr32(qh[j], hb) & qi.LO1) << 4
        units4_bytes((qi.shr32(q[j], 4 * h) & qi.LO4) | hi, 0, 5, w, 4 * j)
    return _k_unit_affine(raw[2], c, h, np.float32(32.0))


@cuda.jit(device=True, inline=True)
def q6_k_unit(raw, c, h, w):
    ql = raw[0]
    qh = raw[1]
    hs = 2 * (2 * h + ((c & 3) >> 1))
    for j in range(4):
        hi = (qi.shr32(qh[j], hs) & qi.LO2) << 4
        units4_bytes((qi.shr32(ql[j], 4 * h) & qi.LO4) | hi, 0, 6, w, 4 * j)
    d = raw[2] * (raw[3] if h == 0 else raw[4])
    return d * np.float32(128.0), d * np.float32(-96.0)  # q = 64 (2u - 1), weight d (q - 32)


@cuda.jit(device=True, inline=True)
def mxfp4_unit(raw, c, h, w):
    return qbf.mxfp4_run(raw, c, h, w), np.float32(0.0)  # u the int8 E2M1 value, a the halved scale


@cuda.jit(device=True, inline=True)
def nvfp4_unit(raw, c, h, w):
    return qbf.nvfp4_run(raw, c, h, w), np.float32(0.0)


@cuda.jit(device=True, inline=True)
def f16_unit(raw, c, h, w):
    return qb32.f16_run(raw, c, h, w), np.float32(0.0)


@cuda.jit(device=True, inline=True)
def f32_unit(raw, c, h, w):
    return qb32.f32_run(raw, c, h, w), np.float32(0.0)


# type -> (load, unit decoder, column of a half-chunk)
DECODERS = {
    T.Q8_0: (qb32.q8_0_load, q8_0_unit, qb32.block32_k),
    T.Q4_0: (qb32.q4_0_load, q4_0_unit, qb32.block32_k),
    T.Q4_1: (qb32.q4_1_load, q4_1_unit, qb32.block32_k),
    T.Q5_0: (qb32.q5_0_load, q5_0_unit, qb32.block32_k),
    T.Q4_K: (qbk.q4_k_load, q4_k_unit, qbk.k4_k),
    T.Q5_K: (qbk.q5_k_load, q5_k_unit, qbk.k4_k),
    T.Q6_K: (qbk.q6_k_load, q6_k_unit, qbk.q6_k_k),
    T.MXFP4: (qbf.mxfp4_load, mxfp4_unit, qb32.block32_k),
    T.NVFP4: (qbf.nvfp4_load, nvfp4_unit, qb32.block32_k),
    T.F16: (qb32.f16_load, f16_unit, qb32.block32_k),
    T.F32: (qb32.f32_load, f32_unit, qb32.block32_k),
}
