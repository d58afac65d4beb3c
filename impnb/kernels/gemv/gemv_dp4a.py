"""Quantized GEMV on dp4a for decode: y[t, n] (+)= sum_k W[n, k] x̂[t, k], x̂ the int8 form of x
(quant_x.py: 16 columns a scale), as llama.cpp's mmvq does with its q8_1 activations.

The weights' quants (unsigned nibbles, 5 and 6 bits, or Q8_0's signed bytes) meet x̂'s bytes in
dp4a, four products a lane instruction summed exactly in int32; per 16 columns the integer sum is
scaled once in float32 (weight scale x x̂ scale), and a weight's constant term (Q4_1's m, a K-quant's
min, the -8 / -16 / -32 offsets) multiplies x̂'s group sum s. Against gemv.py this costs the x
rounding (|x̂ - x| <= amax/254 a group) and saves most of the per-weight instructions.
Numpy reference: `gemv_dp4a_ref` (gemv_ref of the dequantized x̂).

One kernel per type, row length, T (1..8), row-group span, rows a group and load distance (the
next chunk's loads issued before this one's dots, or not), built on a `<type>_load` and a
`<type>_dot` below on a PackedWeight (repack.py); `choose_dp4a` picks the variant (measured).
The weights are no kernel's output, so a thread's first chunk is loaded before griddepcontrol.wait:
under programmatic launch those loads overlap the kernel before (docs/EXPERIMENTS.md, 'dp4a GEMV').
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, from_dtype, int32, types, uint32, uint64

from impnb import tuning
from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemv.gemv import gemv_ref, tuple_of
from impnb.kernels.gemv.gemv_units import DECODERS, GELU, GLU_ACTS, NO_GLU, SILU  # noqa: F401 (re-exported)
from impnb.kernels.gemv.gemv_variants import BLOCK, WARPS, Variant, span_for
from impnb.kernels.gemv.quant_x import GROUP, QuantX, dequantize_x_ref
from impnb.kernels.common.repack import LAYOUTS, PackedWeight
from impnb.launch import launch

MAX_T = 8


def gemv_dp4a_ref(w: np.ndarray, ggml_type: T, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """Raw GGUF weight bytes (N, row_bytes), x̂ as quant_x.quantize_x_ref's (q, d) -> (T, N) float64."""
    return gemv_ref(w, ggml_type, dequantize_x_ref(xq, xd))


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
def _q4_k_load_w(parts, g, dr):
    qs, hdr = parts
    return qi.ldg_u32x4(qs, 4 * (g + dr)), hdr[uint64(4 * ((g >> 3) + (dr >> 3)) + (g & 3))]


@cuda.jit(device=True, inline=True)
def q4_k_dot_w(raw, c, xw, xf, t):
    q, w = raw
    base = cuda.threadIdx.x & 24
    v = int32(w)
    hdr = (uint32(cuda.shfl_sync(0xFFFFFFFF, v, base)), uint32(cuda.shfl_sync(0xFFFFFFFF, v, base + 1)),
           uint32(cuda.shfl_sync(0xFFFFFFFF, v, base + 2)), uint32(cuda.shfl_sync(0xFFFFFFFF, v, base + 3)))
    lo, hi = _nibbles(q, xw, t)
    return _k_dot(hdr, c, lo, hi, xf, t)


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
        T.Q4_K: q4_k_dot, T.Q5_K: q5_k_dot, T.Q6_K: q6_k_dot}
LOADS = {T.Q8_0: _q8_0_load, T.Q4_0: _q4_0_load, T.Q4_1: _q4_1_load, T.Q5_0: _q5_0_load,
         T.Q4_K: _q4_k_load, T.Q5_K: _q5_k_load, T.Q6_K: _q6_k_load}
DP4A_TYPES = tuple(DOTS)


def _make_gemv_dp4a(ggml_type, n_tok, span, rows, glu, experts, cols, depth, max_registers, block_fns=False):
    _, _, col = DECODERS[ggml_type]
    load = LOADS[ggml_type]
    dot = DOTS[ggml_type]
    if ggml_type == T.Q4_K and cols % 1024 == 0 and n_tok == 1 and glu == NO_GLU and not experts and not qi.SIM:
        load, dot = _q4_k_load_w, q4_k_dot_w  # the header by shuffles (a warp's chunk loops agree)
    act = GLU_ACTS[glu]
    wpg = span // 32  # warps per row group
    groups = WARPS // wpg
    pairs = rows // 2  # GLU: output rows a group (gate rows, then the same up rows)
    out_rows = pairs if glu else rows
    cpr = cols // 32  # chunks a row
    K4 = cols // 4  # x̂ words a token

    @cuda.jit(device=True, inline=True)
    def row_chunk(a, c, r):
        # -- chunk c of the group's slot r: gate (or plain) rows from global chunk g0 on, up rows
        # from g1; consecutive rows are cpr chunks apart, a build-time constant --
        parts, g0, g1 = a
        if glu and r >= pairs:
            return load(parts, g1 + c, (r - pairs) * cpr)
        return load(parts, g0 + c, r * cpr)

    rows_chunk = tuple_of(row_chunk, rows)

    @cuda.jit(device=True, inline=True)
    def chunk_or(a, c, raws):
        # chunk c's loads, or past the row's end raws again (never used)
        return rows_chunk(a, c) if c < cpr else raws

    @cuda.jit(device=True, inline=True)
    def window_start(a, c0, raws):
        # -- the loads of the thread's first depth - 1 chunks, the first (raws) from group_start --
        w = (raws,)
        if depth > 2:
            w = w + (chunk_or(a, c0 + span, raws),)
        if depth > 3:
            w = w + (chunk_or(a, c0 + 2 * span, raws),)
        return w

    @cuda.jit(device=True, inline=True)
    def group_start(parts, n_rows, w0):
        # -- (a, c0, raws): the group's rows as row_chunk's a (gate chunk g0 of its first row, up
        # chunk g1), the thread's first chunk and that chunk's loads; the last groups start R rows
        # before the end (row0) --
        tid = cuda.threadIdx.x
        group = tid // span
        n_out = n_rows // 2 if glu else n_rows
        row0 = min((cuda.blockIdx.x * groups + group) * out_rows, n_out - out_rows)
        g0 = (w0 + row0) * cpr
        a = (parts, g0, g0 + (n_out * cpr if glu else 0))
        c0 = tid - group * span
        return a, c0, rows_chunk(a, min(c0, cpr - 1))

    # grid (ceil(N / (R * G)),), block 128 = 4 warps in G = 128/span groups of `span` threads;
    # group gi = G*b + g owns output rows o = R*gi .. +R-1; the last groups start R rows before
    # the end, computing rows their predecessor writes, and write only rows >= R*gi.
    # Its thread i takes chunks i, i+span, ... of those rows: the R chunks' 16-byte loads (the
    # first chunk's from group_start, the next ones depth - 1 steps ahead), then x̂ of
    # the chunk's columns for every token (through L1: the block's groups share it), then R x T
    # dots. Sums reduce over the warp by shuffles, then over the group's warps in shared memory;
    # GLU: y[t, o] = act(gate row o) * up row o. Token t reads x̂ row xr + t and writes y row
    # yr + t (accumulate: plus res's, res y itself but for router_fold.py's out-of-place add).
    # K (cols) is built in, so a slot's loads share one address.
    @cuda.jit(device=True, inline=True)
    def chunk_dots(cur, c, c8, xq, xd, xs, xr, xw, xf, acc):
        # -- acc[r, t] += chunk c of slot r (its loads cur) . x̂ row xr + t: x̂ of the chunk's
        # columns first, for every token --
        k0 = col(c, 0)
        k1 = col(c, 1)
        for t in range(n_tok):
            xw[t, 0], xw[t, 1], xw[t, 2], xw[t, 3] = qi.ldg_u32x4_l1(xq, (xr + t) * K4 + (k0 >> 2))
            xw[t, 4], xw[t, 5], xw[t, 6], xw[t, 7] = qi.ldg_u32x4_l1(xq, (xr + t) * K4 + (k1 >> 2))
            xf[t, 0] = xd[xr + t, k0 >> 4]
            xf[t, 1] = xd[xr + t, k1 >> 4]
            xf[t, 2] = xs[xr + t, k0 >> 4]
            xf[t, 3] = xs[xr + t, k1 >> 4]
        for r in range(rows):
            for t in range(n_tok):
                acc[r, t] += dot(cur[r], c8, xw, xf, t)

    @cuda.jit(device=True, inline=True)
    def rows_times_x(start, xq, xd, xs, y, n_rows, accumulate, xr, yr, res):
        a, c0, raws = start
        tid = cuda.threadIdx.x
        n_out = n_rows // 2 if glu else n_rows
        acc = cuda.local.array((rows, n_tok), float32)
        for r in range(rows):
            for t in range(n_tok):
                acc[r, t] = 0.0
        xw = cuda.local.array((n_tok, 8), uint32)
        xf = cuda.local.array((n_tok, 4), float32)
        c8 = c0 & 7  # the chunk's place in a 256-superblock: spans are multiples of 8
        if depth > 1:  # the next depth - 1 chunks' loads are out during this chunk's dots
            win = window_start(a, c0, raws)
            for c in range(c0, cpr, span):
                cn = c + (depth - 1) * span
                nxt = chunk_or(a, cn, win[0])
                chunk_dots(win[0], c, c8, xq, xd, xs, xr, xw, xf, acc)
                win = win[1:] + (nxt,)
        else:  # each chunk's loads just before its dots (the first chunk's from group_start)
            if c0 < cpr:
                chunk_dots(raws, c0, c8, xq, xd, xs, xr, xw, xf, acc)
            for c in range(c0 + span, cpr, span):
                chunk_dots(rows_chunk(a, c), c, c8, xq, xd, xs, xr, xw, xf, acc)
        scratch = cuda.shared.array(BLOCK, float32)
        red = cuda.shared.array((WARPS, rows, n_tok), float32)
        lane = tid & 31
        warp = tid >> 5
        for r in range(rows):
            for t in range(n_tok):
                acc[r, t] = qi.warp_sum(acc[r, t], scratch)
                if lane == 0:
                    red[warp, r, t] = acc[r, t]
        cuda.syncthreads()
        if tid < groups * out_rows * n_tok:  # a thread an output (group g, row r, token t)
            g = tid // (out_rows * n_tok)
            rt = tid - g * out_rows * n_tok
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
            gi_t = cuda.blockIdx.x * groups + g
            row = min(gi_t * out_rows, n_out - out_rows) + r
            if row >= gi_t * out_rows:
                if accumulate:
                    s += res[yr + t, row]
                y[yr + t, row] = s

    if block_fns:
        return group_start, rows_times_x

    if experts:
        # grid (ceil(N_out / (R_out * G)), S): blockIdx.y is slot s; W is E stacked (n_rows, K)
        # experts, x̂ row s // x_div the slot's input, y row s its output
        @cuda.jit
        def _gemv_dp4a_experts_kernel(parts, xq, xd, xs, y, n_rows, experts, x_div, accumulate):
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
            s = cuda.blockIdx.y
            start = group_start(parts, n_rows, experts[s] * n_rows)
            rows_times_x(start, xq, xd, xs, y, n_rows, accumulate, s // x_div, s, y)

        return _gemv_dp4a_experts_kernel

    @cuda.jit(**({"max_registers": max_registers} if max_registers and not qi.SIM else {}))
    def _gemv_dp4a_kernel(parts, xq, xd, xs, y, n_rows, accumulate):
        start = group_start(parts, n_rows, 0)  # W is no kernel's output: its first loads go out early
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        rows_times_x(start, xq, xd, xs, y, n_rows, accumulate, 0, 0, y)

    return _gemv_dp4a_kernel


@lru_cache(maxsize=None)
def gemv_dp4a_kernel(ggml_type: T, cols: int, n_tok: int, span: int, rows: int, glu: int = NO_GLU,
                     experts: bool = False, depth: int = 1, max_registers: int | None = None):
    """The compiled-on-first-use dp4a kernel for one type, row length (columns), token count,
    row-group span, rows a group and epilogue (NO_GLU, or SILU / GELU: act(gate) * up of gate|up
    stacked rows); `experts`: the routed-expert kernel (one token a slot, see gemv_dp4a_experts);
    `depth`: the loads of this many chunks a thread are in flight (a Variant's unroll, 1..4: each
    chunk's loads issued depth - 1 steps early); `max_registers`
    caps the registers (T1_CAPPED; not the experts kernel's)."""
    assert ggml_type in DOTS and 1 <= n_tok <= MAX_T and span in (32, 64, BLOCK) and rows in (1, 2, 4, 8)
    assert cols % 256 == 0 or cols % 32 == 0 and ggml_type not in (T.Q4_K, T.Q5_K, T.Q6_K)
    assert glu == NO_GLU or rows % 2 == 0, "GLU needs an even number of rows a group"
    assert not experts or n_tok == 1
    assert not (experts and max_registers), "the routed-experts kernel takes no register cap"
    assert 1 <= depth <= 4
    return _make_gemv_dp4a(T(ggml_type), n_tok, span, rows, glu, experts, cols, depth, max_registers)


@lru_cache(maxsize=None)
def dp4a_block_fns(ggml_type: T, cols: int, n_tok: int, span: int, rows: int, depth: int):
    """The plain kernel's device functions for a kernel that runs its blocks among others
    (router_fold.py): group_start(parts, n_rows, 0), whose loads may go out before the wait, then
    rows_times_x(start, xq, xd, xs, y, n_rows, accumulate, 0, 0, res); both read
    cuda.blockIdx.x as the GEMV's block."""
    assert ggml_type in DOTS and 1 <= n_tok <= MAX_T and span in (32, 64, BLOCK) and rows in (1, 2, 4, 8)
    return _make_gemv_dp4a(T(ggml_type), n_tok, span, rows, NO_GLU, False, cols, depth, None, block_fns=True)


# The measured T = 1 tables (impnb/tuning; the figures in docs/EXPERIMENTS.md): by type, the
# variant for K < LONG_K and for K >= LONG_K; by (type, GLU), a variant with its register cap and
# the fewest output rows it takes; the routed experts' gate|up by type.
LONG_K = tuning.DP4A_LONG_K
T1_VARIANTS = {t: tuple(Variant(*v) for v in vs) for t, vs in tuning.DP4A_T1_VARIANTS.items()}
T1_CAPPED = {key: (Variant(*v), cap, fewest) for key, (v, cap, fewest) in tuning.DP4A_T1_CAPPED.items()}
EXPERTS_T1 = {t: Variant(*v) for t, v in tuning.EXPERTS_T1.items()}


def choose_dp4a(ggml_type: T, n_tok: int, cols: int, glu: int = NO_GLU, n_out: int = 8) -> Variant:
    """The variant for a weight of `cols` columns and n_out output rows times T tokens: T1_VARIANTS
    at T = 1, else two warps a group over 2 rows at T = 2 (or with GLU: a gate and an up row), 1
    past that; no more rows than n_out outputs need, no wider span than a row has chunks."""
    if n_tok == 1:
        span, unroll, rows = T1_VARIANTS[ggml_type][cols >= LONG_K]
    else:
        span, unroll, rows = 64, 1, 2 if n_tok == 2 or glu else 1
    while rows // (2 if glu else 1) > n_out:
        rows //= 2
    return Variant(min(span, span_for(cols)), unroll, rows)


def choose_capped(ggml_type: T, n_tok: int, cols: int, glu: int, n_out: int) -> tuple[Variant, int | None]:
    """gemv_dp4a's variant and register cap: T1_CAPPED's where it has the entry and the weight
    the K and output rows, else choose_dp4a's, uncapped."""
    v, cap, fewest = T1_CAPPED.get((ggml_type, glu != NO_GLU), (None, None, 0))
    if n_tok == 1 and 4096 <= cols < LONG_K and v and n_out >= max(fewest, v.rows // (2 if glu else 1)):
        return v, cap
    return choose_dp4a(ggml_type, n_tok, cols, glu, n_out), None


def choose_measured(table: dict, ggml_type: T, n_tok: int, cols: int, glu: int, n_out: int) -> Variant:
    """One use's measured variant (EXPERTS_T1, router_fold.FOLD_T1): table's entry for the type at
    T = 1 and K < LONG_K where its group's outputs fit n_out, else choose_dp4a's."""
    v = table.get(ggml_type)
    if v and n_tok == 1 and cols < LONG_K and v.rows // (2 if glu else 1) <= n_out:
        return v
    return choose_dp4a(ggml_type, n_tok, cols, glu, n_out)


def choose_experts(ggml_type: T, cols: int, glu: int, n_out: int) -> Variant:
    """gemv_dp4a_experts' variant: EXPERTS_T1's for a gate|up (GLU), else choose_dp4a's at T = 1."""
    return choose_measured(EXPERTS_T1 if glu != NO_GLU else {}, ggml_type, 1, cols, glu, n_out)


def gemv_dp4a(w: PackedWeight, x: QuantX, y, stream, accumulate: bool = False, variant: Variant | None = None,
              glu: int = NO_GLU):
    """y (T, N) float32 = W x̂, or y += W x̂ with accumulate; x̂ (quant_x.quantize_x) of T in 1..8
    tokens (its first T rows, T = y's rows); glu (SILU, GELU): W is gate|up stacked (2F, K) and
    y (T, F) = act(W[:F] x̂) * W[F:] x̂; `variant` overrides `choose_capped`."""
    n_tok, N = y.shape
    K = w.cols
    assert w.ggml_type in DOTS and N == (w.rows // 2 if glu else w.rows) and 1 <= n_tok <= MAX_T
    assert x.q.shape[1] == K // 4 and x.d.shape[1] == K // GROUP and x.q.shape[0] >= n_tok
    assert y.dtype == np.float32 and y.is_c_contiguous()
    v, cap = (variant, None) if variant else choose_capped(w.ggml_type, n_tok, K, glu, N)
    out_rows = v.rows // (2 if glu else 1)  # outputs a group
    assert out_rows <= N, "more rows a group than the weight has"
    per_block = out_rows * (BLOCK // v.span)
    launch(gemv_dp4a_kernel(w.ggml_type, K, n_tok, v.span, v.rows, glu, False, v.unroll, cap),
           ((N + per_block - 1) // per_block,), BLOCK,
           stream, w.parts, x.q[:n_tok], x.d[:n_tok], x.s[:n_tok], y, np.int32(w.rows), np.int32(accumulate))


def gemv_dp4a_experts(w: PackedWeight, n_rows: int, x: QuantX, y, experts, x_div: int, stream, glu: int = NO_GLU,
                      variant: Variant | None = None):
    """Routed experts, one token a slot: y[s] = W_e x̂[s // x_div] with e = experts[s], or with glu
    (SILU, GELU) y[s] = act(gate_e x̂) * up_e x̂ for gate|up stacked per expert.

    w: E experts of n_rows rows stacked, (E * n_rows, K); x̂ (quant_x.quantize_x) of the inputs;
    experts (S,) int32 in 0..E-1; y (S, n_rows) float32, or (S, n_rows / 2) with glu.
    """
    S, K = experts.shape[0], w.cols
    out_rows = n_rows // 2 if glu else n_rows
    assert w.ggml_type in DOTS and w.rows % n_rows == 0 and y.shape == (S, out_rows) and x_div >= 1
    assert x.q.shape[1] == K // 4 and x.d.shape[1] == K // GROUP
    assert y.dtype == np.float32 and y.is_c_contiguous() and experts.dtype == np.int32
    v = variant or choose_experts(w.ggml_type, K, glu, out_rows)
    assert v.rows // (2 if glu else 1) <= out_rows, "more rows a group than an expert has"
    per_block = v.rows // (2 if glu else 1) * (BLOCK // v.span)
    launch(gemv_dp4a_kernel(w.ggml_type, K, 1, v.span, v.rows, glu, True, v.unroll),
           ((out_rows + per_block - 1) // per_block, S),
           BLOCK, stream, w.parts, x.q, x.d, x.s, y, np.int32(n_rows), experts, np.int32(x_div), np.int32(0))


def kernel_args(ggml_type: T, experts: bool = False) -> tuple:
    """Argument types of a gemv_dp4a kernel: parts, x̂ q, d, s, y, W's rows (an expert's with
    experts, then the slots' experts and x_div), accumulate."""
    parts = types.Tuple(tuple(types.Array(from_dtype(np.dtype(dt)), 1, "C") for _, _, _, dt in LAYOUTS[ggml_type]))
    f2 = types.Array(types.float32, 2, "C")
    routed = (types.Array(types.int32, 1, "C"), types.int32) if experts else ()
    return (parts, types.Array(types.uint32, 2, "C"), f2, f2, f2, types.int32, *routed, types.int32)


# Registers (compile_ptx + link): 55-96, 125-127 for the 5/6-bit K-quants at eight rows a group;
# the LTO cubin that runs can take more (Q4_K s128u1r8 at K 14336: 127 against 96), and the
# build test holds it to the same bounds. Built at K 4096 and 16384 in the variants
# choose_capped picks (with its cap where it has one).
BUILD_SIGNATURES = [
    (gemv_dp4a_kernel(t, K, n, v.span, v.rows, NO_GLU, False, v.unroll, cap), types.void(*kernel_args(t)),
     {"max_registers": cap or (160 if v.unroll > 1 else 128)})
    for t in DP4A_TYPES for K in (4096, 16384) for n in (1, 2, 8)
    for v, cap in (choose_capped(t, n, K, NO_GLU, 8192),)
    if K == 4096 or n == 1
] + [  # gate|up with SiLU (llama, qwen3)
    (gemv_dp4a_kernel(t, 4096, n, v.span, v.rows, SILU, False, v.unroll, cap), types.void(*kernel_args(t)),
     {"max_registers": cap or 128})
    for t in (T.Q4_K, T.Q8_0) for n in (1, 8) for v, cap in (choose_capped(t, n, 4096, SILU, 8192),)
] + [  # qwen3moe's routed gate|up experts
    (gemv_dp4a_kernel(t, 2048, 1, v.span, v.rows, SILU, True, v.unroll), types.void(*kernel_args(t, True)),
     {"max_registers": 128})
    for t in (T.Q4_K, T.Q8_0) for v in (choose_experts(t, 2048, SILU, 768),)
]
