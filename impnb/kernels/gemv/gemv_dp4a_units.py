"""dp4a GEMV units: `<type>_load` reads a chunk's quants and scales, `<type>_dot` meets them with x̂'s
int8 words in dp4a (after `prepare_of(type)`, which decodes FP4 once a row-chunk); `LOADS` and `DOTS`
map a type to them. Used by gemv_dp4a.py and the MoE dp4a
kernels, as gemv_units.py's decoders by gemv.py."""

from gguf import GGMLQuantizationType as T
from numba import cuda, float32, int32, uint32, uint64

from impnb import tuning
from impnb.kernels.common import quant_blocks_fp4 as qbf
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.warp import group_sums_lanes
from impnb.kernels.gemv.gemv_rows import tuple_of


# -- loads: `<type>_load` of quant_blocks*.py for chunk g + dr, where dr = r x chunks-a-row for
#    a group's row r is a build-time constant kept apart (a multiple of 8: whole superblocks), so a
#    group's rows share one address (loads at immediate offsets) and the scalar loads skip numba's
#    negative-index wrap (the index is unsigned) --

@cuda.jit(device=True, inline=True)
def _q8_0_load(parts, g, dr):
    qs, d = parts
    return qi.ldg_u32x4(qs, 8 * (g + dr)), qi.ldg_u32x4(qs, 8 * (g + dr) + 4), float32(d[uint64(g + dr)])


@cuda.jit(device=True, inline=True)
def _q4_0_load(parts, g, dr):
    qs, d = parts
    return qi.ldg_u32x4(qs, 4 * (g + dr)), float32(d[uint64(g + dr)])


@cuda.jit(device=True, inline=True)
def _q4_1_load(parts, g, dr):
    qs, dm = parts
    return qi.ldg_u32x4(qs, 4 * (g + dr)), dm[uint64(g + dr)]


@cuda.jit(device=True, inline=True)
def _q5_0_load(parts, g, dr):
    qs, qh, d = parts
    return qi.ldg_u32x4(qs, 4 * (g + dr)), qh[uint64(g + dr)], float32(d[uint64(g + dr)])


@cuda.jit(device=True, inline=True)
def _fp4_load(parts, g, dr):
    qs, sc = parts  # MXFP4: sc the E8M0 byte; NVFP4: the two UE4M3 bytes (u16)
    return qi.ldg_u32x4(qs, 4 * (g + dr)), uint32(sc[uint64(g + dr)])


@cuda.jit(device=True, inline=True)
def _q4_k_load(parts, g, dr):
    qs, hdr = parts
    return qi.ldg_u32x4(qs, 4 * (g + dr)), qi.ldg_u32x4(hdr, 4 * ((g >> 3) + (dr >> 3)))


@cuda.jit(device=True, inline=True)
def _q5_k_load(parts, g, dr):
    qs, qh, hdr = parts
    sb = (g >> 3) + (dr >> 3)
    return (qi.ldg_u32x4(qs, 4 * (g + dr)), qi.ldg_u32x4(qh, 8 * sb + 4 * (g & 1)), qi.ldg_u32x4(hdr, 4 * sb))


@cuda.jit(device=True, inline=True)
def _q6_k_load(parts, g, dr):
    ql, qh, sc, d = parts
    sb = (g >> 3) + (dr >> 3)
    L = g & 7
    s = 16 * sb + 8 * (L >> 2) + (L & 3)
    return (qi.ldg_u32x4(ql, 4 * (g + dr)), qi.ldg_u32x4(qh, 16 * sb + 8 * (L >> 2) + 4 * (L & 1)),
            float32(d[uint64(sb)]), float32(sc[uint64(s)]), float32(sc[uint64(s + 4)]))


# -- dot units: `<type>_dot(raw, c, xw, xf, t)` = the chunk's 32 weights (raw from `<type>_load`)
#    times token t's x̂: xw[t, 0:4] the int8 words at the half-0 columns col(c, 0)..+16, xw[t, 4:8]
#    at col(c, 1)..+16; xf[t] = (d0, d1, s0, s1) their scales and group sums --

@cuda.jit(device=True, inline=True)
def _dot_u(q0, q1, q2, q3, xw, t, o):
    """sum of 16 unsigned bytes (4 words) times the 16 int8 of xw[t, o:o+4], int32."""
    i = qi.dp4a_us(q0, xw[t, o], 0)
    i = qi.dp4a_us(q1, xw[t, o + 1], i)
    i = qi.dp4a_us(q2, xw[t, o + 2], i)
    return qi.dp4a_us(q3, xw[t, o + 3], i)


@cuda.jit(device=True, inline=True)
def _nibbles(q, xw, t):
    """(low nibbles . half 0, high nibbles . half 1) of the 4 quant words q, int32."""
    lo = _dot_u(q[0] & qi.LO4, q[1] & qi.LO4, q[2] & qi.LO4, q[3] & qi.LO4, xw, t, 0)
    hi = _dot_u(qi.shr32(q[0], 4) & qi.LO4, qi.shr32(q[1], 4) & qi.LO4, qi.shr32(q[2], 4) & qi.LO4,
                qi.shr32(q[3], 4) & qi.LO4, xw, t, 4)
    return lo, hi


@cuda.jit(device=True, inline=True)
def q8_0_dot(raw, c, xw, xf, t):
    a, b, d = raw
    i0 = qi.dp4a_ss(a[0], xw[t, 0], 0)
    i0 = qi.dp4a_ss(a[1], xw[t, 1], i0)
    i0 = qi.dp4a_ss(a[2], xw[t, 2], i0)
    i0 = qi.dp4a_ss(a[3], xw[t, 3], i0)
    i1 = qi.dp4a_ss(b[0], xw[t, 4], 0)
    i1 = qi.dp4a_ss(b[1], xw[t, 5], i1)
    i1 = qi.dp4a_ss(b[2], xw[t, 6], i1)
    i1 = qi.dp4a_ss(b[3], xw[t, 7], i1)
    return d * (xf[t, 0] * float32(i0) + xf[t, 1] * float32(i1))


@cuda.jit(device=True, inline=True)
def q4_0_dot(raw, c, xw, xf, t):
    lo, hi = _nibbles(raw[0], xw, t)  # weight d (q - 8)
    return raw[1] * ((xf[t, 0] * float32(lo) + xf[t, 1] * float32(hi)) - float32(8.0) * (xf[t, 2] + xf[t, 3]))


@cuda.jit(device=True, inline=True)
def q4_1_dot(raw, c, xw, xf, t):
    lo, hi = _nibbles(raw[0], xw, t)  # weight d q + m
    d = qi.f16_to_f32(raw[1] & qi.HALF)
    m = qi.f16_to_f32(raw[1] >> 16)
    return d * (xf[t, 0] * float32(lo) + xf[t, 1] * float32(hi)) + m * (xf[t, 2] + xf[t, 3])


@cuda.jit(device=True, inline=True)
def _q5_0_word(q, qh, j, h):
    # 4 five-bit quants: nibbles at bit 4h of q, their high bits at bit 16h + 4j of qh
    hi = ((qi.shr32(qh, 16 * h + 4 * j) & 15) * qi.SPREAD4) & qi.BIT4
    return (qi.shr32(q, 4 * h) & qi.LO4) | hi


@cuda.jit(device=True, inline=True)
def q5_0_dot(raw, c, xw, xf, t):
    q, qh, d = raw  # weight d (q - 16)
    lo = _dot_u(_q5_0_word(q[0], qh, 0, 0), _q5_0_word(q[1], qh, 1, 0), _q5_0_word(q[2], qh, 2, 0),
                _q5_0_word(q[3], qh, 3, 0), xw, t, 0)
    hi = _dot_u(_q5_0_word(q[0], qh, 0, 1), _q5_0_word(q[1], qh, 1, 1), _q5_0_word(q[2], qh, 2, 1),
                _q5_0_word(q[3], qh, 3, 1), xw, t, 4)
    return d * ((xf[t, 0] * float32(lo) + xf[t, 1] * float32(hi)) - float32(16.0) * (xf[t, 2] + xf[t, 3]))


@cuda.jit(device=True, inline=True)
def _dot_s(a0, a1, a2, a3, xw, t, o):
    """sum of 16 signed bytes (4 words) times the 16 int8 of xw[t, o:o+4], int32."""
    i = qi.dp4a_ss(a0, xw[t, o], 0)
    i = qi.dp4a_ss(a1, xw[t, o + 1], i)
    i = qi.dp4a_ss(a2, xw[t, o + 2], i)
    return qi.dp4a_ss(a3, xw[t, o + 3], i)


# FP4: the E2M1 codes become ggml's doubled int8 values (quant_blocks_fp4.e2m1_interleaved) and
# meet x̂ in dp4a; the halved scale makes the weight, so no offset term (s unused). The decode is
# `<type>_prepare`'s, once a row-chunk, not once a token (PREPARES; the other types' dots read the
# loads as they are), and x̂'s words are put in its byte order once a chunk (fp4_x_order).
@cuda.jit(device=True, inline=True)
def _fp4_words(q):
    # words 2h, 2h+1 half h: low nibbles its columns 0..7, high 8..15 (both types' layout); each
    # word's values as e2m1_interleaved leaves them (columns 4i, 4i+8, 4i+1, 4i+9 | 4i+2, 4i+10,
    # 4i+3, 4i+11 of word 2h+i), the order fp4_x_order puts x̂ in: no permutes a row-chunk to undo it
    a0, a1 = qbf.e2m1_interleaved(q[0])
    a2, a3 = qbf.e2m1_interleaved(q[1])
    b0, b1 = qbf.e2m1_interleaved(q[2])
    b2, b3 = qbf.e2m1_interleaved(q[3])
    return (a0, a1, a2, a3), (b0, b1, b2, b3)


@cuda.jit(device=True, inline=True)
def mxfp4_prepare(raw):
    a, b = _fp4_words(raw[0])
    d = qbf.e8m0_half(raw[1])
    return a, b, d, d


@cuda.jit(device=True, inline=True)
def nvfp4_prepare(raw):
    a, b = _fp4_words(raw[0])
    return a, b, qbf.ue4m3_half(raw[1]), qbf.ue4m3_half(qi.shr32(raw[1], 8))


@cuda.jit(device=True, inline=True)
def fp4_dot(w, c, xw, xf, t):
    a, b, d0, d1 = w  # half 0's and half 1's int8 words in fp4_x_order's order, their halved scales
    i0 = _dot_s(a[0], a[1], a[2], a[3], xw, t, 0)
    i1 = _dot_s(b[0], b[1], b[2], b[3], xw, t, 4)
    return d0 * (xf[t, 0] * float32(i0)) + d1 * (xf[t, 1] * float32(i1))


@cuda.jit(device=True, inline=True)
def _fp4_signed_words(q):
    # _fp4_words' as positive and negative magnitudes (quant_blocks_fp4.e2m1_signed): half the
    # byte permutes and none of the selector masks, for twice the dp4a (fp4_signed_dot)
    (p0, p1), (n0, n1) = qbf.e2m1_signed(q[0])
    (p2, p3), (n2, n3) = qbf.e2m1_signed(q[1])
    (p4, p5), (n4, n5) = qbf.e2m1_signed(q[2])
    (p6, p7), (n6, n7) = qbf.e2m1_signed(q[3])
    return (p0, p1, p2, p3), (p4, p5, p6, p7), (n0, n1, n2, n3), (n4, n5, n6, n7)


@cuda.jit(device=True, inline=True)
def mxfp4_signed_prepare(raw):
    a, b, na, nb = _fp4_signed_words(raw[0])
    d = qbf.e8m0_half(raw[1])
    return a, b, na, nb, d, d


@cuda.jit(device=True, inline=True)
def nvfp4_signed_prepare(raw):
    a, b, na, nb = _fp4_signed_words(raw[0])
    return a, b, na, nb, qbf.ue4m3_half(raw[1]), qbf.ue4m3_half(qi.shr32(raw[1], 8))


@cuda.jit(device=True, inline=True)
def fp4_signed_dot(w, c, xw, xf, t):
    a, b, na, nb, d0, d1 = w  # half 0's and half 1's magnitudes, positive then negative codes'
    i0 = int32(_dot_u(a[0], a[1], a[2], a[3], xw, t, 0) - _dot_u(na[0], na[1], na[2], na[3], xw, t, 0))
    i1 = int32(_dot_u(b[0], b[1], b[2], b[3], xw, t, 4) - _dot_u(nb[0], nb[1], nb[2], nb[3], xw, t, 4))
    return d0 * (xf[t, 0] * float32(i0)) + d1 * (xf[t, 1] * float32(i1))


@cuda.jit(device=True, inline=True)
def fp4_x_order(xw, t):
    """x̂ words of token t in _fp4_words' column order, once a chunk for all its rows: per half h,
    words 4h + i and 4h + i + 2 (columns 4i.. and 4i+8..) interleaved byte by byte."""
    for h in range(2):
        w0, w1, w2, w3 = xw[t, 4 * h], xw[t, 4 * h + 1], xw[t, 4 * h + 2], xw[t, 4 * h + 3]
        xw[t, 4 * h] = qi.prmt(w0, w2, 0x5140)
        xw[t, 4 * h + 1] = qi.prmt(w0, w2, 0x7362)
        xw[t, 4 * h + 2] = qi.prmt(w1, w3, 0x5140)
        xw[t, 4 * h + 3] = qi.prmt(w1, w3, 0x7362)


@cuda.jit(device=True, inline=True)
def x_as_loaded(xw, t):
    pass


@cuda.jit(device=True, inline=True)
def as_loaded(raw):
    return raw


@cuda.jit(device=True, inline=True)
def _k_scale_pairs(hdr, c):
    """quant_blocks_k.k_scales without its branch, as byte pairs: (sc0 | sc1 << 8, mn0 | mn1 << 8)
    of sub-blocks 2p and 2p+1, p = (c % 8) // 2. c % 8 is a thread's constant here, so the
    shift, masks and choices leave the loop."""
    s = 8 * (c & 2)
    up = (c & 4) != 0  # sub-blocks 4..7: low 4 bits in bytes 8..11, high 2 atop bytes 0..7
    m_lo = uint32(0x0F0F) if up else uint32(0x3F3F)
    m_hi = uint32(0x3030) if up else uint32(0)
    sc = (qi.shr32(hdr[3] if up else hdr[1], s) & m_lo) | (qi.shr32(hdr[1], s + 2) & m_hi)
    mn = (qi.shr32(hdr[3] if up else hdr[2], s + (4 if up else 0)) & m_lo) | (qi.shr32(hdr[2], s + 2) & m_hi)
    return sc, mn


@cuda.jit(device=True, inline=True)
def _k_dot(hdr, c, lo, hi, xf, t):
    # weight d sc q - dmin mn, (sc, mn) of the chunk's two sub-blocks; lo * sc stays an int32
    # below 2^22 (|lo| <= 16 * 31 * 127, sc < 64), so small_int_f32 converts it, and mn's bytes
    # go through the 2^23 trick: no I2F (about 1 point of the copy rate on Q4_K's long rows)
    sc, mn = _k_scale_pairs(hdr, c)
    d = qi.f16_to_f32(hdr[0] & qi.HALF)
    dmin = qi.f16_to_f32(hdr[0] >> 16)
    v = (xf[t, 0] * qi.small_int_f32(lo * int32(sc & 0xFF))
         + xf[t, 1] * qi.small_int_f32(hi * int32(qi.shr32(sc, 8))))
    m = (xf[t, 2] * (qi.as_f32((mn & 0xFF) | qi.MAGIC) + qi.NEG_TWO23)
         + xf[t, 3] * (qi.as_f32(qi.shr32(mn, 8) | qi.MAGIC) + qi.NEG_TWO23))
    return d * v - dmin * m


@cuda.jit(device=True, inline=True)
def q4_k_dot(raw, c, xw, xf, t):
    lo, hi = _nibbles(raw[0], xw, t)
    return _k_dot(raw[1], c, lo, hi, xf, t)


@cuda.jit(device=True, inline=True)
def _nibbles_hi16(q, xw, t):
    """_nibbles with the high nibbles met in place (q & 0xF0F0F0F0: 16 times each nibble, at most
    240 x 127 x 16 in the sum) and their sum shifted down by 4 once, exactly: one operation a
    chunk where the shifts of each word take four. For one token a row-chunk (the multi-token dots
    share the masked words between tokens, and would shift each token's sum)."""
    lo = _dot_u(q[0] & qi.LO4, q[1] & qi.LO4, q[2] & qi.LO4, q[3] & qi.LO4, xw, t, 0)
    hi16 = _dot_u(q[0] & qi.HI4, q[1] & qi.HI4, q[2] & qi.HI4, q[3] & qi.HI4, xw, t, 4)
    return lo, qi.sar32(hi16, 4)


@cuda.jit(device=True, inline=True)
def q4_k_dot_t1(raw, c, xw, xf, t):
    """q4_k_dot at one token a row-chunk (_nibbles_hi16): the same sums bit for bit."""
    lo, hi = _nibbles_hi16(raw[0], xw, t)
    return _k_dot(raw[1], c, lo, hi, xf, t)


@cuda.jit(device=True, inline=True)
def _q5_k_word(q, qh, hb, h):
    return (qi.shr32(q, 4 * h) & qi.LO4) | ((qi.shr32(qh, hb + h) & qi.LO1) << 4)


# Q4_K with one header word a thread: lane l loads word l % 4 of its superblock's 16-byte header
# and q4_k_dot_w gathers the four from lanes 8 (l // 8) .. +3 by shfl.sync, where every lane of
# the warp works on the same number of chunks (K a multiple of 1024; not under the simulator,
# which has no shuffles). Taken at T = 1 without GLU, the cases measured and checked on the GPU
# (T > 1, GLU and the experts keep the 16-byte header: untimed there). A row-chunk then holds
# 5 registers in flight rather than 8: s128u1r8 at K 14336 builds at 96 registers, 5 blocks an
# SM where 127 gave 4, and reaches 85% of the copy rate on 4096x14336 against 81% (docs/
# EXPERIMENTS.md, 'dp4a GEMV').
@cuda.jit(device=True, inline=True)
def q4_k_load_w(parts, g, dr):
    qs, hdr = parts
    return qi.ldg_u32x4(qs, 4 * (g + dr)), hdr[uint64(4 * ((g >> 3) + (dr >> 3)) + (g & 3))]


@cuda.jit(device=True, inline=True)
def _lanes_header(w):
    """The 16-byte header of a lane's superblock from the word each of lanes 8 (l // 8) .. +3 loaded."""
    base = cuda.threadIdx.x & 24
    v = int32(w)
    return (uint32(cuda.shfl_sync(0xFFFFFFFF, v, base)), uint32(cuda.shfl_sync(0xFFFFFFFF, v, base + 1)),
            uint32(cuda.shfl_sync(0xFFFFFFFF, v, base + 2)), uint32(cuda.shfl_sync(0xFFFFFFFF, v, base + 3)))


def _dot_w_of(nibbles):
    """q4_k's dot over the shuffled header (q4_k_load_w's loads) with nibbles' sums of the quants."""
    @cuda.jit(device=True, inline=True)
    def dot_w(raw, c, xw, xf, t):
        q, w = raw
        hdr = _lanes_header(w)
        lo, hi = nibbles(q, xw, t)
        return _k_dot(hdr, c, lo, hi, xf, t)
    return dot_w


q4_k_dot_w = _dot_w_of(_nibbles)
q4_k_dot_w_t1 = _dot_w_of(_nibbles_hi16)  # the high nibbles masked in place: the same sums bit for bit


@cuda.jit(device=True, inline=True)
def q5_k_dot(raw, c, xw, xf, t):
    q, qh, hdr = raw
    hb = 2 * ((c & 7) >> 1)  # the high bits of sub-blocks hb (half 0) and hb + 1
    lo = _dot_u(_q5_k_word(q[0], qh[0], hb, 0), _q5_k_word(q[1], qh[1], hb, 0), _q5_k_word(q[2], qh[2], hb, 0),
                _q5_k_word(q[3], qh[3], hb, 0), xw, t, 0)
    hi = _dot_u(_q5_k_word(q[0], qh[0], hb, 1), _q5_k_word(q[1], qh[1], hb, 1), _q5_k_word(q[2], qh[2], hb, 1),
                _q5_k_word(q[3], qh[3], hb, 1), xw, t, 4)
    return _k_dot(hdr, c, lo, hi, xf, t)


@cuda.jit(device=True, inline=True)
def _q6_k_word(ql, qh, hs, h):
    return (qi.shr32(ql, 4 * h) & qi.LO4) | ((qi.shr32(qh, hs + 4 * h) & qi.LO2) << 4)


@cuda.jit(device=True, inline=True)
def q6_k_dot(raw, c, xw, xf, t):
    ql, qh, d, s0, s1 = raw  # weight d sc (q - 32), sc per 16 columns
    hs = 2 * ((c & 3) >> 1)
    lo = _dot_u(_q6_k_word(ql[0], qh[0], hs, 0), _q6_k_word(ql[1], qh[1], hs, 0), _q6_k_word(ql[2], qh[2], hs, 0),
                _q6_k_word(ql[3], qh[3], hs, 0), xw, t, 0)
    hi = _dot_u(_q6_k_word(ql[0], qh[0], hs, 1), _q6_k_word(ql[1], qh[1], hs, 1), _q6_k_word(ql[2], qh[2], hs, 1),
                _q6_k_word(ql[3], qh[3], hs, 1), xw, t, 4)
    return d * (s0 * (xf[t, 0] * float32(lo) - float32(32.0) * xf[t, 2])
                + s1 * (xf[t, 1] * float32(hi) - float32(32.0) * xf[t, 3]))


DOTS = {T.Q8_0: q8_0_dot, T.Q4_0: q4_0_dot, T.Q4_1: q4_1_dot, T.Q5_0: q5_0_dot,
        T.Q4_K: q4_k_dot, T.Q5_K: q5_k_dot, T.Q6_K: q6_k_dot, T.MXFP4: fp4_dot, T.NVFP4: fp4_dot}
LOADS = {T.Q8_0: _q8_0_load, T.Q4_0: _q4_0_load, T.Q4_1: _q4_1_load, T.Q5_0: _q5_0_load,
         T.Q4_K: _q4_k_load, T.Q5_K: _q5_k_load, T.Q6_K: _q6_k_load, T.MXFP4: _fp4_load, T.NVFP4: _fp4_load}
PREPARES = {T.MXFP4: mxfp4_prepare, T.NVFP4: nvfp4_prepare}  # a row-chunk's loads -> the dot's input
DP4A_TYPES = tuple(DOTS)


X_ORDERS = {T.MXFP4: fp4_x_order, T.NVFP4: fp4_x_order}  # x̂ words -> the order a type's prepared words take


# One token a dot (T = 1, the routed experts' slots): (prepare, dot) that trade byte permutes for
# dp4a, for the types that have such a form and where tuning.FP4_SIGNED_T1 takes it.
SIGNED_T1 = {T.MXFP4: (mxfp4_signed_prepare, fp4_signed_dot),
             T.NVFP4: (nvfp4_signed_prepare, fp4_signed_dot)}


def prepare_of(ggml_type, n_tok: int = 2):
    """The device function that turns a row-chunk's loads into its dot's input, once for every
    token (n_tok of them)."""
    if n_tok == 1 and ggml_type in SIGNED_T1 and ggml_type in tuning.FP4_SIGNED_T1:
        return SIGNED_T1[ggml_type][0]
    return PREPARES.get(ggml_type, as_loaded)


def dot_of(ggml_type, n_tok: int = 2):
    """The dot unit over prepare_of(ggml_type, n_tok)'s output."""
    if n_tok == 1 and ggml_type in SIGNED_T1 and ggml_type in tuning.FP4_SIGNED_T1:
        return SIGNED_T1[ggml_type][1]
    if n_tok == 1 and ggml_type == T.Q4_K and tuning.NIBBLE_HI16:
        return q4_k_dot_t1
    return DOTS[ggml_type]


def x_order_of(ggml_type):
    """The device function `(xw, t)` that reorders token t's x̂ words of a chunk in place for the
    type's prepared words, once a chunk after they are loaded (a no-op for most types)."""
    return X_ORDERS.get(ggml_type, x_as_loaded)


def block_reduce(rows: int, n_tok: int, span: int, glu: int, act, lanes: bool = True):
    """(reduce_sums, output_of) of a dp4a GEMV block of WARPS warps in row groups of span
    threads, R = rows row slots by T = n_tok tokens a thread: reduce_sums(acc, tid) sums acc (R, T)
    over the warp by shuffles into red (WARPS, R, T) in shared memory (after a barrier: the
    group's warps' partials), with lanes the R x T sums at once (warp.warp_sums_lanes, up to 32),
    else each in a chain of its own (fewer registers: the one-sequence decode's); a span of 8 or 16
    lanes (R x T at most span) sums within its group (warp.group_sums_lanes) into red (groups, R,
    T); output_of(red, o) -> (g, r, t, s) of the block's output o, row r < R_out (R, or R / 2 with
    a GLU, whose s is act(gate row r) * up row r) of group g, token t."""
    from impnb.kernels.gemv.gemv_variants import BLOCK

    wpg = max(span // 32, 1)  # red's entries a row group: its warps' (one for a group within a warp)
    gs = min(span, 32)  # lanes summed together: a warp, or a group within one
    gbits = gs.bit_length() - 1
    slots = BLOCK // gs  # red's entries: a warp's, or a group's within a warp
    pairs = rows // 2
    out_rows = pairs if glu else rows
    n = rows * n_tok  # sums a thread
    NP = 1 << (n - 1).bit_length()  # as group_sums_lanes takes them (up to gs: else one a warp_sum)
    assert span >= 32 or NP <= span, "a group within a warp sums at most span values a lane"
    shift = gbits - (NP.bit_length() - 1)  # a group's lane i holds sum i >> shift

    @cuda.jit(device=True, inline=True)
    def reduce_sums(acc, tid):
        scratch = cuda.shared.array(BLOCK, float32)
        red = cuda.shared.array((slots, rows, n_tok), float32)
        lane = tid & 31
        if span < 32 or lanes and NP <= 32:  # warp_sum's sums bit for bit either way
            v = cuda.local.array(NP, float32)
            for r in range(rows):
                for t in range(n_tok):
                    v[r * n_tok + t] = acc[r, t]
            for i in range(n, NP):
                v[i] = float32(0.0)
            s = group_sums_lanes(v, NP, gs)
            gl = lane & (gs - 1)
            i = gl >> shift
            if gl == i << shift and i < n:
                red[tid >> gbits, i // n_tok, i - (i // n_tok) * n_tok] = s
        else:
            for r in range(rows):
                for t in range(n_tok):
                    s = qi.warp_sum(acc[r, t], scratch)
                    if lane == 0:
                        red[tid >> 5, r, t] = s
        cuda.syncthreads()
        return red

    @cuda.jit(device=True, inline=True)
    def output_of(red, o):
        g = o // (out_rows * n_tok)
        rt = o - g * out_rows * n_tok
        r = rt // n_tok
        t = rt - r * n_tok
        s = float32(0.0)
        for i in range(wpg):
            s += red[g * wpg + i, r, t]
        if glu:
            u = float32(0.0)
            for i in range(wpg):
                u += red[g * wpg + i, pairs + r, t]
            s = act(s) * u
        return g, r, t, s

    return reduce_sums, output_of


def chunk_loaders(load, rows: int, glu: bool, cpr: int) -> tuple:
    """(rows_chunk, chunk_or), the device functions that load a row group's raw chunks with
    `load` (LOADS'): rows_chunk(a, c) the tuple of chunk c of each of the group's rows, a = (parts,
    g0, g1): gate (or plain) rows from global chunk g0 on, with glu the up rows (the group's second
    half) from g1, consecutive rows cpr chunks (a row's) apart; chunk_or(a, c, raws) the same, or
    past the row's end raws again (never used)."""
    pairs = rows // 2

    @cuda.jit(device=True, inline=True)
    def row_chunk(a, c, r):
        parts, g0, g1 = a
        if glu and r >= pairs:
            return load(parts, g1 + c, (r - pairs) * cpr)
        return load(parts, g0 + c, r * cpr)

    rows_chunk = tuple_of(row_chunk, rows)

    @cuda.jit(device=True, inline=True)
    def chunk_or(a, c, raws):
        return rows_chunk(a, c) if c < cpr else raws

    return rows_chunk, chunk_or
