"""Quantized GEMV for decode: y[t, n] (+)= sum_k W[n, k] x[t, k], dequant fused, fp32 accumulation.

One kernel per weight type and token count T (1..8), built from the type's chunk decoder in
quant_blocks32.py / quant_blocks_k.py on a PackedWeight (repack.py). Numpy reference: `gemv_ref`.
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, from_dtype, types

from impnb.kernels import ptx
from impnb.kernels import quant_blocks32 as qb32
from impnb.kernels import quant_blocks_k as qbk
from impnb.kernels import quant_intrinsics as qi
from impnb.kernels.activations import _gelu_tanh, _silu
from impnb.kernels.repack import LAYOUTS, PackedWeight
from impnb.launch import launch
from impnb.quants import dequantize

WARPS = 4
BLOCK = 32 * WARPS
MAX_T = 8
NO_GLU, SILU, GELU = 0, 1, 2  # epilogues: plain rows, act(gate) * up with SiLU or tanh GELU


@cuda.jit(device=True, inline=True)
def _identity(v):
    return v


GLU_ACTS = (_identity, _silu, _gelu_tanh)

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
    T.F16: (qb32.f16_load, f16_unit, qb32.block32_k),
    T.F32: (qb32.f32_load, f32_unit, qb32.block32_k),
}


def gemv_ref(w: np.ndarray, ggml_type: T, x: np.ndarray) -> np.ndarray:
    """Raw GGUF weight bytes (N, row_bytes), x (T, K) -> (T, N) float64 = x @ dequant(W).T."""
    wd = dequantize(np.asarray(w).view(np.uint8).reshape(w.shape[0], -1), ggml_type)
    return x.astype(np.float64) @ wd.astype(np.float64).reshape(w.shape[0], -1).T


# T = 1 types whose 4-row kernel stays under ~96 registers (5/6-bit types would need ~128)
FOUR_ROW_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.F16, T.F32)


def rows_per_block(ggml_type: T, n_tok: int) -> int:
    """Rows a thread works on at once, sharing each x load: 4 for T = 1 (x held in registers;
    2 for the 5/6-bit types), 2 for T = 2, 1 for larger T (keeps registers down)."""
    if n_tok == 1:
        return 4 if ggml_type in FOUR_ROW_TYPES else 2
    return 2 if n_tok == 2 else 1


def span_for(cols: int) -> int:
    """Threads per row group: enough for one chunk each (cols/32), from one warp up to 128."""
    chunks = cols // 32
    return 32 if chunks <= 32 else 64 if chunks <= 64 else BLOCK


def _make_gemv(load, unit, col, n_tok, span, rows, glu):
    wpg = span // 32  # warps per row group
    groups = WARPS // wpg
    act = GLU_ACTS[glu]

    # grid (ceil(N_out / (R_out * G)),), block 128 = 4 warps in G = 128/span groups of `span`
    # threads, R = rows_per_block(type, T) weight rows per group. Group gi = G*b + g owns rows
    # R*gi .. +R-1 (past the last: clamped, computed and dropped), or with GLU the R/2 gate rows
    # o = R/2*gi .. and their up rows F + o; its thread i takes chunks i, i+span, ... of those rows:
    # 16-byte quant loads of all R rows first, 32 weights per chunk in two halves of 16, each half
    # FMAed against x[t, k..k+16] (float4 loads through L1) for every token t. Partial sums
    # acc[r, t] are reduced over the warp by shuffles, then (span > 32) over the group's warps in
    # shared memory red[4, R, T]; `store` writes a group's rows for one token.
    @cuda.jit(device=True, inline=True)
    def half_chunk(raw_a, raw_b, c, h, x, K, acc, wa, wb):
        # -- decode 16 weights of each row, FMA against every token --
        # weights are a * u[i] + b: dot = a * sum(u x) + b * sum(x)
        aa, ba = unit(raw_a, c, h, wa)
        if rows == 2:
            ab, bb = unit(raw_b, c, h, wb)
        k = col(c, h)
        for t in range(n_tok):
            pa = float32(0.0)
            pb = float32(0.0)
            sx = float32(0.0)
            for v in range(4):
                x0, x1, x2, x3 = qi.ldg_f32x4(x, t * K + k + 4 * v)
                pa += wa[4 * v] * x0
                pa += wa[4 * v + 1] * x1
                pa += wa[4 * v + 2] * x2
                pa += wa[4 * v + 3] * x3
                if rows == 2:
                    pb += wb[4 * v] * x0
                    pb += wb[4 * v + 1] * x1
                    pb += wb[4 * v + 2] * x2
                    pb += wb[4 * v + 3] * x3
                sx += (x0 + x1) + (x2 + x3)
            acc[0, t] += aa * pa + ba * sx
            if rows == 2:
                acc[1, t] += ab * pb + bb * sx

    @cuda.jit(device=True, inline=True)
    def half_chunk_x1(raws, c, h, x, acc, w):
        # -- T = 1: x[k..k+16] and its sum in registers, then each row decoded and FMAed --
        k = col(c, h)
        xv = cuda.local.array(16, float32)
        sx = float32(0.0)
        for v in range(4):
            x0, x1, x2, x3 = qi.ldg_f32x4(x, k + 4 * v)
            xv[4 * v] = x0
            xv[4 * v + 1] = x1
            xv[4 * v + 2] = x2
            xv[4 * v + 3] = x3
            sx += (x0 + x1) + (x2 + x3)
        for r in range(4):
            a, b = unit(raws[r], c, h, w)
            p = float32(0.0)
            for i in range(16):
                p += w[i] * xv[i]
            acc[r, 0] += a * p + b * sx

    pairs = rows // 2  # GLU: output rows per group (gate rows, then the same up rows)
    out_rows = pairs if glu else rows

    @cuda.jit(device=True, inline=True)
    def weight_row(gi, r, n_rows):
        # -- row r of group gi: GLU groups hold gate rows o.. and up rows F + o.. --
        if glu:
            F = n_rows // 2
            return min(gi * pairs + r % pairs, F - 1) + (F if r >= pairs else 0)
        return min(gi * rows + r, n_rows - 1)

    @cuda.jit(device=True, inline=True)
    def store(y0, y1, y2, n0, n1, n_rows, gi, t, tot, accumulate):
        # -- GLU: y0[t, o] = act(gate) * up; else row i to y0, y1 or y2 by the splits n0, n1 --
        for i in range(out_rows):
            if glu:
                o = gi * pairs + i
                if o < n_rows // 2:
                    v = act(tot[i]) * tot[pairs + i]
                    if accumulate:
                        v += y0[t, o]
                    y0[t, o] = v
            else:
                row = gi * rows + i
                v = tot[i]
                if row < n0:
                    if accumulate:
                        v += y0[t, row]
                    y0[t, row] = v
                elif row < n0 + n1:
                    if accumulate:
                        v += y1[t, row - n0]
                    y1[t, row - n0] = v
                elif row < n_rows:
                    if accumulate:
                        v += y2[t, row - n0 - n1]
                    y2[t, row - n0 - n1] = v

    @cuda.jit
    def _gemv_kernel(parts, x, y0, y1, y2, n0, n1, n_rows, accumulate):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        K = x.shape[1]
        cpr = K // 32
        tid = cuda.threadIdx.x
        group = tid // span
        gi = cuda.blockIdx.x * groups + group
        row_a = weight_row(gi, 0, n_rows)
        row_b = weight_row(gi, 1, n_rows)
        acc = cuda.local.array((rows, n_tok), float32)
        for r in range(rows):
            for t in range(n_tok):
                acc[r, t] = 0.0
        wa = cuda.local.array(16, float32)
        wb = cuda.local.array(16, float32)
        row_c = weight_row(gi, 2, n_rows)
        row_d = weight_row(gi, 3, n_rows)
        for c in range(tid - group * span, cpr, span):
            # -- load the rows' chunk c --
            raw_a = load(parts, row_a * cpr + c)
            if rows == 4:
                raws = (raw_a, load(parts, row_b * cpr + c), load(parts, row_c * cpr + c),
                        load(parts, row_d * cpr + c))
                half_chunk_x1(raws, c, 0, x, acc, wa)
                half_chunk_x1(raws, c, 1, x, acc, wa)
            else:
                raw_b = load(parts, row_b * cpr + c) if rows == 2 else raw_a
                half_chunk(raw_a, raw_b, c, 0, x, K, acc, wa, wb)
                half_chunk(raw_a, raw_b, c, 1, x, K, acc, wa, wb)
        # -- reduce over the warp, then over the group's warps; one thread stores a (group, t) --
        scratch = cuda.shared.array(BLOCK, float32)
        red = cuda.shared.array((WARPS, rows, n_tok), float32)
        tot = cuda.local.array(rows, float32)
        lane = tid & 31
        warp = tid >> 5
        for r in range(rows):
            for t in range(n_tok):
                acc[r, t] = qi.warp_sum(acc[r, t], scratch)
                if wpg > 1 and lane == 0:
                    red[warp, r, t] = acc[r, t]
        if wpg == 1:
            if lane == 0:
                for t in range(n_tok):
                    for r in range(rows):
                        tot[r] = acc[r, t]
                    store(y0, y1, y2, n0, n1, n_rows, gi, t, tot, accumulate)
        else:
            cuda.syncthreads()
            if tid < groups * n_tok:
                g = tid // n_tok
                t = tid - g * n_tok
                for r in range(rows):
                    s = float32(0.0)
                    for i in range(wpg):
                        s += red[g * wpg + i, r, t]
                    tot[r] = s
                store(y0, y1, y2, n0, n1, n_rows, cuda.blockIdx.x * groups + g, t, tot, accumulate)

    return _gemv_kernel


@lru_cache(maxsize=None)
def gemv_kernel(ggml_type: T, n_tok: int, span: int = BLOCK, glu: int = NO_GLU):
    """The compiled-on-first-use kernel for one type, token count, row-group span and epilogue."""
    if not 1 <= n_tok <= MAX_T:
        raise ValueError(f"gemv: T={n_tok} tokens, supported 1..{MAX_T}")
    assert span in (32, 64, BLOCK)
    ggml_type = T(ggml_type)
    rows = rows_per_block(ggml_type, n_tok)
    assert glu == NO_GLU or rows % 2 == 0, "GLU needs an even number of rows per group"
    return _make_gemv(*DECODERS[ggml_type], n_tok, span, rows, glu)


def _parts_type(ggml_type: T):
    return types.Tuple(tuple(types.Array(from_dtype(np.dtype(dt)), 1, "C")
                             for _, _, _, dt in LAYOUTS[ggml_type]))


def _aligned16(a) -> bool:
    ptr = getattr(a, "device_ctypes_pointer", None)
    return ptr is None or (ptr.value or 0) % 16 == 0


def _launch(w: PackedWeight, x, y0, y1, y2, n0: int, n1: int, out_rows: int, glu: int,
            stream, accumulate: bool):
    n_tok, K = x.shape
    assert w.cols == K and x.dtype == np.float32 and x.is_c_contiguous() and _aligned16(x)
    for y in (y0, y1, y2):
        assert y.dtype == np.float32 and y.is_c_contiguous() and y.shape[0] == n_tok
    span = span_for(K)
    per_block = rows_per_block(w.ggml_type, n_tok) // (2 if glu else 1) * BLOCK // span
    kernel = gemv_kernel(w.ggml_type, n_tok, span, glu)
    launch(kernel, (out_rows + per_block - 1) // per_block, BLOCK, stream,
           w.parts, x, y0, y1, y2, np.int32(n0), np.int32(n1), np.int32(w.rows), np.int32(accumulate))


def gemv(w: PackedWeight, x, y, stream, accumulate: bool = False):
    """y (T, N) float32 = W x, or y += W x with accumulate; x (T, K) float32, T in 1..8."""
    assert y.shape == (x.shape[0], w.rows), (w.rows, w.cols, x.shape, y.shape)
    _launch(w, x, y, y, y, w.rows, 0, w.rows, NO_GLU, stream, accumulate)


def gemv_split(w: PackedWeight, x, ys, stream):
    """Rows of W stacked from several matrices (fused Q|K|V): ys[i] (T, N_i) = W[rows of i] x;
    one to three outputs whose N_i sum to W's rows."""
    assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows
    y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
    n0, n1 = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0
    _launch(w, x, y0, y1, y2, n0, n1, w.rows, NO_GLU, stream, False)


def glu_fits(w: PackedWeight, n_tok: int) -> bool:
    """Whether gemv_glu runs for this weight and token count (an even number of rows per group)."""
    return n_tok <= MAX_T and rows_per_block(w.ggml_type, n_tok) % 2 == 0


def gemv_glu(w: PackedWeight, x, y, act: int, stream):
    """Gate|up stacked (2F, K): y (T, F) = act(W[:F] x) * W[F:] x, act SILU or GELU (tanh)."""
    assert act in (SILU, GELU) and w.rows % 2 == 0 and y.shape == (x.shape[0], w.rows // 2)
    assert glu_fits(w, x.shape[0]), "gemv_glu: odd rows per group for this type and T"
    _launch(w, x, y, y, y, w.rows // 2, 0, w.rows // 2, act, stream, False)


_F32_2D = types.Array(types.float32, 2, "C")
_I32 = types.int32
# Registers: 70-96 for T = 1 (four rows: Q8_0, Q4_0, Q4_1, Q4_K, F16, F32) and the rest up to ~110
# (two rows at T <= 2, eight tokens in flight at T = 8).
BUILD_SIGNATURES = [
    (gemv_kernel(t, n, span, glu),
     types.void(_parts_type(t), _F32_2D, _F32_2D, _F32_2D, _F32_2D, _I32, _I32, _I32, _I32),
     {"max_registers": 112})
    for t in DECODERS
    for n, span, glu in ((1, 32, NO_GLU), (1, 64, NO_GLU), (1, BLOCK, NO_GLU), (2, BLOCK, NO_GLU),
                         (3, BLOCK, NO_GLU), (8, 32, NO_GLU), (8, BLOCK, NO_GLU), (1, 32, SILU),
                         (1, BLOCK, GELU), (2, 64, SILU))
]
