"""Quantized GEMV on dp4a for decode: y[t, n] (+)= sum_k W[n, k] x̂[t, k], x̂ the int8 form of x
(quant_x.py: 16 columns a scale), as llama.cpp's mmvq does with its q8_1 activations.

The weights' quants (unsigned nibbles, 5 and 6 bits, or Q8_0's signed bytes) meet x̂'s bytes in
dp4a, four products a lane instruction summed exactly in int32; per 16 columns the integer sum is
scaled once in float32 (weight scale x x̂ scale), and a weight's constant term (Q4_1's m, a K-quant's
min, the -8 / -16 / -32 offsets) multiplies x̂'s group sum s. Against gemv.py this costs the x
rounding (|x̂ - x| <= amax/254 a group) and saves most of the per-weight instructions.
Numpy reference: `gemv_dp4a_ref` (gemv_ref of the dequantized x̂).

One kernel per type, T (1..8), row-group span and rows a group, built on the type's
`<type>_load` (quant_blocks*.py) and a `<type>_dot` below on a PackedWeight (repack.py).
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, from_dtype, types, uint32

from impnb.kernels import ptx
from impnb.kernels import quant_intrinsics as qi
from impnb.kernels.gemv import gemv_ref, tuple_of
from impnb.kernels.gemv_units import DECODERS, GELU, GLU_ACTS, NO_GLU, SILU  # noqa: F401 (re-exported)
from impnb.kernels.gemv_variants import BLOCK, WARPS, Variant, span_for
from impnb.kernels.quant_blocks_k import k_scales
from impnb.kernels.quant_x import GROUP, QuantX, dequantize_x_ref
from impnb.kernels.repack import LAYOUTS, PackedWeight
from impnb.launch import launch

MAX_T = 8


def gemv_dp4a_ref(w: np.ndarray, ggml_type: T, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """Raw GGUF weight bytes (N, row_bytes), x̂ as quant_x.quantize_x_ref's (q, d) -> (T, N) float64."""
    return gemv_ref(w, ggml_type, dequantize_x_ref(xq, xd))


# -- dot units: `<type>_dot(raw, c, xw, xf, t)` = the chunk's 32 weights (raw from `<type>_load`)
#    times token t's x̂: xw[t, 0:4] the int8 words at the half-0 columns col(c, 0)..+16, xw[t, 4:8]
#    at col(c, 1)..+16; xf[t] = (d0, d1, s0, s1) their scales and group sums --

@cuda.jit(device=True, inline=True)
def _dot_u(q0, q1, q2, q3, xw, t, o):
    """sum of 16 unsigned bytes (4 words) times the 16 int8 of xw[t, o:o+4], int32."""
    i = qi.dp4a_us(q0, xw[t, o], 0)
    i = qi.dp4a_us(q1, xw[t, o + 1], i)
    i = qi.dp4a_us(q2, xw[t, o + 2], i)
    return float32(qi.dp4a_us(q3, xw[t, o + 3], i))


@cuda.jit(device=True, inline=True)
def _nibbles(q, xw, t):
    """(low nibbles . half 0, high nibbles . half 1) of the 4 quant words q."""
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
    return raw[1] * ((xf[t, 0] * lo + xf[t, 1] * hi) - float32(8.0) * (xf[t, 2] + xf[t, 3]))


@cuda.jit(device=True, inline=True)
def q4_1_dot(raw, c, xw, xf, t):
    lo, hi = _nibbles(raw[0], xw, t)  # weight d q + m
    d = qi.f16_to_f32(raw[1] & qi.HALF)
    m = qi.f16_to_f32(raw[1] >> 16)
    return d * (xf[t, 0] * lo + xf[t, 1] * hi) + m * (xf[t, 2] + xf[t, 3])


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
    return d * ((xf[t, 0] * lo + xf[t, 1] * hi) - float32(16.0) * (xf[t, 2] + xf[t, 3]))


@cuda.jit(device=True, inline=True)
def _k_dot(hdr, c, lo, hi, xf, t):
    # weight d sc q - dmin mn, (sc, mn) of the chunk's two sub-blocks
    sc0, mn0, sc1, mn1 = k_scales(hdr, c)
    d = qi.f16_to_f32(hdr[0] & qi.HALF)
    dmin = qi.f16_to_f32(hdr[0] >> 16)
    return d * (sc0 * xf[t, 0] * lo + sc1 * xf[t, 1] * hi) - dmin * (mn0 * xf[t, 2] + mn1 * xf[t, 3])


@cuda.jit(device=True, inline=True)
def q4_k_dot(raw, c, xw, xf, t):
    lo, hi = _nibbles(raw[0], xw, t)
    return _k_dot(raw[1], c, lo, hi, xf, t)


@cuda.jit(device=True, inline=True)
def _q5_k_word(q, qh, hb, h):
    return (qi.shr32(q, 4 * h) & qi.LO4) | ((qi.shr32(qh, hb + h) & qi.LO1) << 4)


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
    return d * (s0 * (xf[t, 0] * lo - float32(32.0) * xf[t, 2]) + s1 * (xf[t, 1] * hi - float32(32.0) * xf[t, 3]))


DOTS = {T.Q8_0: q8_0_dot, T.Q4_0: q4_0_dot, T.Q4_1: q4_1_dot, T.Q5_0: q5_0_dot,
        T.Q4_K: q4_k_dot, T.Q5_K: q5_k_dot, T.Q6_K: q6_k_dot}
DP4A_TYPES = tuple(DOTS)


def _make_gemv_dp4a(ggml_type, n_tok, span, rows, glu, experts):
    load, _, col = DECODERS[ggml_type]
    dot = DOTS[ggml_type]
    act = GLU_ACTS[glu]
    wpg = span // 32  # warps per row group
    groups = WARPS // wpg
    pairs = rows // 2  # GLU: output rows a group (gate rows, then the same up rows)
    out_rows = pairs if glu else rows

    @cuda.jit(device=True, inline=True)
    def row_chunk(a, c, r):
        # -- chunk c of the group's row r of the matrix at row w0 (past the last row: the last,
        # computed and dropped); GLU groups hold gate rows o.. and up rows F + o.. --
        parts, gi, n_rows, cpr, w0 = a
        if glu:
            F = n_rows // 2
            row = min(gi * pairs + r % pairs, F - 1) + (F if r >= pairs else 0)
        else:
            row = min(gi * rows + r, n_rows - 1)
        return load(parts, (w0 + row) * cpr + c)

    rows_chunk = tuple_of(row_chunk, rows)

    # grid (ceil(N / (R * G)),), block 128 = 4 warps in G = 128/span groups of `span` threads;
    # group gi = G*b + g owns rows R*gi .. +R-1; its thread i takes chunks i, i+span, ... of those
    # rows: the R chunks' 16-byte loads, then x̂ of the chunk's columns for every token (through
    # L1: the block's groups share it), then R x T dots. Sums reduce over the warp by shuffles,
    # then over the group's warps in shared memory; GLU: y[t, o] = act(gate row o) * up row o.
    # Token t reads x̂ row xr + t and writes y row yr + t; W's rows start at w0.
    @cuda.jit(device=True, inline=True)
    def rows_times_x(parts, xq, xd, xs, y, n_rows, accumulate, w0, xr, yr):
        K4 = xq.shape[1]  # x̂ words a token
        cpr = K4 // 8  # chunks a row
        tid = cuda.threadIdx.x
        group = tid // span
        gi = cuda.blockIdx.x * groups + group
        acc = cuda.local.array((rows, n_tok), float32)
        for r in range(rows):
            for t in range(n_tok):
                acc[r, t] = 0.0
        xw = cuda.local.array((n_tok, 8), uint32)
        xf = cuda.local.array((n_tok, 4), float32)
        a = (parts, gi, n_rows, cpr, w0)
        for c in range(tid - group * span, cpr, span):
            raws = rows_chunk(a, c)
            k0 = col(c, 0)
            k1 = col(c, 1)
            for t in range(n_tok):
                xw[t, 0], xw[t, 1], xw[t, 2], xw[t, 3] = qi.ldg_u32x4_l1(xq, (xr + t) * K4 + k0 // 4)
                xw[t, 4], xw[t, 5], xw[t, 6], xw[t, 7] = qi.ldg_u32x4_l1(xq, (xr + t) * K4 + k1 // 4)
                xf[t, 0] = xd[xr + t, k0 // GROUP]
                xf[t, 1] = xd[xr + t, k1 // GROUP]
                xf[t, 2] = xs[xr + t, k0 // GROUP]
                xf[t, 3] = xs[xr + t, k1 // GROUP]
            for r in range(rows):
                for t in range(n_tok):
                    acc[r, t] += dot(raws[r], c, xw, xf, t)
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
            row = (cuda.blockIdx.x * groups + g) * out_rows + r
            if row < (n_rows // 2 if glu else n_rows):
                if accumulate:
                    s += y[yr + t, row]
                y[yr + t, row] = s

    if experts:
        # grid (ceil(N_out / (R_out * G)), S): blockIdx.y is slot s; W is E stacked (n_rows, K)
        # experts, x̂ row s // x_div the slot's input, y row s its output
        @cuda.jit
        def _gemv_dp4a_experts_kernel(parts, xq, xd, xs, y, n_rows, experts, x_div, accumulate):
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
            s = cuda.blockIdx.y
            rows_times_x(parts, xq, xd, xs, y, n_rows, accumulate, experts[s] * n_rows, s // x_div, s)

        return _gemv_dp4a_experts_kernel

    @cuda.jit
    def _gemv_dp4a_kernel(parts, xq, xd, xs, y, n_rows, accumulate):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        rows_times_x(parts, xq, xd, xs, y, n_rows, accumulate, 0, 0, 0)

    return _gemv_dp4a_kernel


@lru_cache(maxsize=None)
def gemv_dp4a_kernel(ggml_type: T, n_tok: int, span: int, rows: int, glu: int = NO_GLU, experts: bool = False):
    """The compiled-on-first-use dp4a kernel for one type, token count, row-group span, rows a
    group and epilogue (NO_GLU, or SILU / GELU: act(gate) * up of gate|up stacked rows);
    `experts`: the routed-expert kernel (one token a slot, see gemv_dp4a_experts)."""
    assert ggml_type in DOTS and 1 <= n_tok <= MAX_T and span in (32, 64, BLOCK) and rows in (1, 2, 4, 8)
    assert glu == NO_GLU or rows % 2 == 0, "GLU needs an even number of rows a group"
    assert not experts or n_tok == 1
    return _make_gemv_dp4a(T(ggml_type), n_tok, span, rows, glu, experts)


# Measured on the H100 (2026-11-25, scripts/bench_gemv.py --dp4a, 4096x14336 and 14336x4096,
# % of 2.97 TB/s per launch): eight rows a group for the 4/5-bit types (Q4_0 64-72%, Q4_1 65-72%,
# Q5_K 65-67%, Q4_K 61-64%), four for Q6_K (63-73%); Q8_0 four rows over four warps (83%).
EIGHT_ROW_TYPES = (T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K)


def choose_dp4a(ggml_type: T, n_tok: int, cols: int, glu: int = NO_GLU) -> Variant:
    """The variant for a weight of `cols` columns times T tokens: 8 or 4 rows a group at T = 1 (by
    type, measured), 2 at T = 2, 1 past that (2 with GLU: a gate and an up row); groups of two
    warps, four for Q8_0, fewer when a row has too few chunks to keep them busy."""
    if n_tok == 1:
        rows = 8 if ggml_type in EIGHT_ROW_TYPES else 4
    else:
        rows = 2 if n_tok == 2 or glu else 1
    span = BLOCK if ggml_type == T.Q8_0 and n_tok == 1 else 64
    return Variant(min(span, span_for(cols)), 1, rows)


def gemv_dp4a(w: PackedWeight, x: QuantX, y, stream, accumulate: bool = False, variant: Variant | None = None,
              glu: int = NO_GLU):
    """y (T, N) float32 = W x̂, or y += W x̂ with accumulate; x̂ (quant_x.quantize_x) of T in 1..8
    tokens (its first T rows, T = y's rows); glu (SILU, GELU): W is gate|up stacked (2F, K) and
    y (T, F) = act(W[:F] x̂) * W[F:] x̂; `variant` overrides `choose_dp4a`."""
    n_tok, N = y.shape
    K = w.cols
    assert w.ggml_type in DOTS and N == (w.rows // 2 if glu else w.rows) and 1 <= n_tok <= MAX_T
    assert x.q.shape[1] == K // 4 and x.d.shape[1] == K // GROUP and x.q.shape[0] >= n_tok
    assert y.dtype == np.float32 and y.is_c_contiguous()
    v = variant or choose_dp4a(w.ggml_type, n_tok, K, glu)
    per_block = v.rows // (2 if glu else 1) * (BLOCK // v.span)
    launch(gemv_dp4a_kernel(w.ggml_type, n_tok, v.span, v.rows, glu), ((N + per_block - 1) // per_block,), BLOCK,
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
    v = variant or choose_dp4a(w.ggml_type, 1, K, glu)
    per_block = v.rows // (2 if glu else 1) * (BLOCK // v.span)
    launch(gemv_dp4a_kernel(w.ggml_type, 1, v.span, v.rows, glu, True), ((out_rows + per_block - 1) // per_block, S),
           BLOCK, stream, w.parts, x.q, x.d, x.s, y, np.int32(n_rows), experts, np.int32(x_div), np.int32(0))


def kernel_args(ggml_type: T, experts: bool = False) -> tuple:
    """Argument types of a gemv_dp4a kernel: parts, x̂ q, d, s, y, W's rows (an expert's with
    experts, then the slots' experts and x_div), accumulate."""
    parts = types.Tuple(tuple(types.Array(from_dtype(np.dtype(dt)), 1, "C") for _, _, _, dt in LAYOUTS[ggml_type]))
    f2 = types.Array(types.float32, 2, "C")
    routed = (types.Array(types.int32, 1, "C"), types.int32) if experts else ()
    return (parts, types.Array(types.uint32, 2, "C"), f2, f2, f2, types.int32, *routed, types.int32)


# Registers: 54-96, and up to ~145 at eight rows a group (the 4/5-bit types' T = 1 choice: 3
# blocks an SM, measured fastest all the same).
BUILD_SIGNATURES = [
    (gemv_dp4a_kernel(t, n, span, rows), types.void(*kernel_args(t)), {"max_registers": 160 if rows == 8 else 128})
    for t in DP4A_TYPES for n, span, rows in ((1, 64, 8), (1, BLOCK, 4), (1, 32, 4), (2, 64, 2), (8, 64, 1))
] + [  # gate|up with SiLU (llama, qwen3)
    (gemv_dp4a_kernel(t, n, 64, rows, SILU), types.void(*kernel_args(t)), {"max_registers": 160})
    for t in (T.Q4_K, T.Q8_0) for n, rows in ((1, 8), (8, 2))
] + [  # qwen3moe's routed gate|up experts
    (gemv_dp4a_kernel(t, 1, 64, rows, SILU, True), types.void(*kernel_args(t, True)), {"max_registers": 160})
    for t, rows in ((T.Q4_K, 8), (T.Q8_0, 4))
]
