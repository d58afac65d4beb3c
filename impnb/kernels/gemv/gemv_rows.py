"""A row group of the decode GEMV: the device functions gemv.py's kernels are made of (the
group's rows of W times x, reduced and stored), for one weight type's chunk decoder
(gemv_units.DECODERS), token count, span, unroll, rows per group, GLU, pre-norm and gate (each
output row's dot products times sigmoid of a logit another kernel wrote)."""

import math
from typing import NamedTuple

from numba import cuda, float32

from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemv.gemv_units import GLU_ACTS
from impnb.kernels.gemv.gemv_variants import BLOCK, WARPS


def tuple_of(f, n):
    """Device function g(a, c) = (f(a, c, 0), ..., f(a, c, n-1)) for n in 1, 2, 4, 8."""
    if n == 1:
        @cuda.jit(device=True, inline=True)
        def g(a, c):
            return (f(a, c, 0),)
    elif n == 2:
        @cuda.jit(device=True, inline=True)
        def g(a, c):
            return f(a, c, 0), f(a, c, 1)
    elif n == 4:
        @cuda.jit(device=True, inline=True)
        def g(a, c):
            return f(a, c, 0), f(a, c, 1), f(a, c, 2), f(a, c, 3)
    else:
        assert n == 8

        @cuda.jit(device=True, inline=True)
        def g(a, c):
            return (f(a, c, 0), f(a, c, 1), f(a, c, 2), f(a, c, 3),
                    f(a, c, 4), f(a, c, 5), f(a, c, 6), f(a, c, 7))
    return g


class RowGroup(NamedTuple):
    """row_group's device functions: group_at(parts, n_rows, w0, K, bx) -> at, the block's group;
    first_loads(at) -> first, one_step's loads (else 0); rows_times_x(at, first, x, y0, y1, y2,
    n0, n1, n_rows, accumulate, xo, yo, wn, eps, gate, gate_col), the group's rows times x stored
    into y (gate, gate_col read where gated alone)."""
    group_at: object
    first_loads: object
    rows_times_x: object


def row_group(load, unit, col, n_tok, span, unroll, rows, glu, normed, one_step, gated=False) -> RowGroup:
    """The device functions of a row group for a decoder (load, unit, col) and these settings
    (gemv.gemv_kernel's)."""
    wpg = span // 32  # warps per row group
    groups = WARPS // wpg
    act = GLU_ACTS[glu]

    @cuda.jit(device=True, inline=True)
    def rms_scale(sq, K, eps):
        # -- normed: 1 / sqrt(mean of x² + eps), else 1 --
        if normed:
            return float32(1.0) / math.sqrt(sq / float32(K) + eps)
        return float32(1.0)

    @cuda.jit(device=True, inline=True)
    def gate_scale(scale, gate, gate_col, t):
        # -- gated: scale times sigmoid(gate[t, gate_col]), output row t's gate (as sigmoid_gate
        # takes it: 1 / (1 + exp(-g))); else scale --
        if gated:
            return scale / (float32(1.0) + math.exp(-gate[t, gate_col]))
        return scale

    # grid (ceil(N_out / (R_out * G)),), block 128 = 4 warps in G = 128/span groups of `span`
    # threads, R = `rows` weight rows per group. Group gi = G*b + g owns rows R*gi .. +R-1 (past
    # the last: clamped, computed and dropped), or with GLU the R/2 gate rows o = R/2*gi .. and
    # their up rows F + o; its thread i takes chunks i, i+span, ... of those rows in steps of U =
    # `unroll` chunks: the 16-byte quant loads of all R rows x U chunks first (chunk indices past
    # the row's end clamped to its last chunk, loaded and skipped), then per chunk 32 weights in
    # two halves of 16, each half FMAed against x[t, k..k+16] (float4 loads through L1) for every
    # token t. Partial sums acc[r, t] are reduced over the warp by shuffles, then (span > 32) over
    # the group's warps in shared memory red[4, R, T]; `store` writes a group's rows for one token.
    # one_step (a thread's chunks fit one step): that step's loads precede griddepcontrol.wait
    # (weights are no kernel's output, so they overlap the kernel before under programmatic launch).
    @cuda.jit(device=True, inline=True)
    def x4(x, i, wn, k, ss, t):
        # -- x[i .. i + 4]; normed: times wn[k .. k + 4], their squares summed into ss[t] --
        x0, x1, x2, x3 = qi.ldg_f32x4(x, i)
        if normed:
            ss[t] += (x0 * x0 + x1 * x1) + (x2 * x2 + x3 * x3)
            w0, w1, w2, w3 = qi.ldg_f32x4(wn, k)
            return x0 * w0, x1 * w1, x2 * w2, x3 * w3
        return x0, x1, x2, x3

    @cuda.jit(device=True, inline=True)
    def half_chunk(raws, c, h, x, xo, K, acc, wa, wb, wn, ss):
        # -- R <= 2: decode 16 weights of each row, FMA against every token --
        # weights are a * u[i] + b: dot = a * sum(u x) + b * sum(x)
        aa, ba = unit(raws[0], c, h, wa)
        if rows == 2:
            ab, bb = unit(raws[1], c, h, wb)
        k = col(c, h)
        for t in range(n_tok):
            pa = float32(0.0)
            pb = float32(0.0)
            sx = float32(0.0)
            for v in range(4):
                x0, x1, x2, x3 = x4(x, xo + t * K + k + 4 * v, wn, k + 4 * v, ss, t)
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
    def half_chunk_x1(raws, c, h, x, xo, acc, w, wn, ss):
        # -- T = 1, R >= 4: x[k..k+16] and its sum in registers, then each row decoded and FMAed --
        k = col(c, h)
        xv = cuda.local.array(16, float32)
        sx = float32(0.0)
        for v in range(4):
            x0, x1, x2, x3 = x4(x, xo + k + 4 * v, wn, k + 4 * v, ss, 0)
            xv[4 * v] = x0
            xv[4 * v + 1] = x1
            xv[4 * v + 2] = x2
            xv[4 * v + 3] = x3
            sx += (x0 + x1) + (x2 + x3)
        for r in range(rows):
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

    @cuda.jit(device=True, inline=True)
    def row_chunk(a, c, r):
        # -- chunk c of the group's row r; a = (parts, w0, gi, n_rows, chunks per row) --
        parts, w0, gi, n_rows, cpr = a
        return load(parts, (w0 + weight_row(gi, r, n_rows)) * cpr + c)

    rows_chunk = tuple_of(row_chunk, rows)

    @cuda.jit(device=True, inline=True)
    def step_chunk(a, c0, u):
        # -- chunk c0 + u * span of every row, clamped to the row's last chunk --
        return rows_chunk(a, min(c0 + u * span, a[4] - 1))

    step_loads = tuple_of(step_chunk, unroll)

    @cuda.jit(device=True, inline=True)
    def group_at(parts, n_rows, w0, K, bx):
        # -- (a, c1): the group's rows (W's from w0) as row_chunk's a, the thread's first chunk;
        # bx the GEMV's block (cuda.blockIdx.x but in gemv_pair) --
        group = cuda.threadIdx.x // span
        return (parts, w0, bx * groups + group, n_rows, K // 32), cuda.threadIdx.x - group * span

    @cuda.jit(device=True, inline=True)
    def step_dots(raws, c0, cpr, x, xo, K, acc, wa, wb, wn, ss):
        # -- decode the step's U chunks of every row (raws from step_loads) against x --
        for u in range(unroll):
            c = c0 + u * span
            if c < cpr:
                if rows >= 4:
                    half_chunk_x1(raws[u], c, 0, x, xo, acc, wa, wn, ss)
                    half_chunk_x1(raws[u], c, 1, x, xo, acc, wa, wn, ss)
                else:
                    half_chunk(raws[u], c, 0, x, xo, K, acc, wa, wb, wn, ss)
                    half_chunk(raws[u], c, 1, x, xo, K, acc, wa, wb, wn, ss)

    if one_step:  # K <= 32 x span x U: a thread's one step, its loads issued by the kernel (first_loads)
        @cuda.jit(device=True, inline=True)
        def first_loads(at):
            return step_loads(at[0], at[1])

        @cuda.jit(device=True, inline=True)
        def steps(at, first, cpr, x, xo, K, acc, wa, wb, wn, ss):
            if at[1] < cpr:
                step_dots(first, at[1], cpr, x, xo, K, acc, wa, wb, wn, ss)
    else:  # load U chunks of every row, then decode them, step after step
        @cuda.jit(device=True, inline=True)
        def first_loads(at):
            return 0

        @cuda.jit(device=True, inline=True)
        def steps(at, first, cpr, x, xo, K, acc, wa, wb, wn, ss):
            a, c1 = at
            for c0 in range(c1, cpr, span * unroll):
                step_dots(step_loads(a, c0), c0, cpr, x, xo, K, acc, wa, wb, wn, ss)

    @cuda.jit(device=True, inline=True)
    def rows_times_x(at, first, x, y0, y1, y2, n0, n1, n_rows, accumulate, xo, yo, wn, eps, gate, gate_col):
        # -- the group's rows (at: group_at's; first: first_loads') times x (from flat offset xo)
        # into y rows yo + t; normed: times RMSNorm(x[t]) * wn, the group summing x[t]² into ss[t];
        # gated: y row yo + t's dot products times sigmoid(gate[yo + t, gate_col]) --
        gi = at[0][2]
        K = x.shape[1]
        cpr = K // 32
        tid = cuda.threadIdx.x
        acc = cuda.local.array((rows, n_tok), float32)
        for r in range(rows):
            for t in range(n_tok):
                acc[r, t] = 0.0
        ss = cuda.local.array(n_tok, float32)
        for t in range(n_tok):
            ss[t] = 0.0
        wa = cuda.local.array(16, float32)
        wb = cuda.local.array(16, float32)
        steps(at, first, cpr, x, xo, K, acc, wa, wb, wn, ss)
        # -- reduce over the warp, then over the group's warps; one thread stores a (group, t) --
        scratch = cuda.shared.array(BLOCK, float32)
        red = cuda.shared.array((WARPS, rows, n_tok), float32)
        red_ss = cuda.shared.array((WARPS, n_tok), float32)
        tot = cuda.local.array(rows, float32)
        lane = tid & 31
        warp = tid >> 5
        for r in range(rows):
            for t in range(n_tok):
                acc[r, t] = qi.warp_sum(acc[r, t], scratch)
                if wpg > 1 and lane == 0:
                    red[warp, r, t] = acc[r, t]
        if normed:
            for t in range(n_tok):
                ss[t] = qi.warp_sum(ss[t], scratch)
                if wpg > 1 and lane == 0:
                    red_ss[warp, t] = ss[t]
        if wpg == 1:
            if lane == 0:
                for t in range(n_tok):
                    scale = gate_scale(rms_scale(ss[t], K, eps), gate, gate_col, yo + t)
                    for r in range(rows):
                        tot[r] = acc[r, t] * scale
                    store(y0, y1, y2, n0, n1, n_rows, gi, yo + t, tot, accumulate)
        else:
            cuda.syncthreads()
            if tid < groups * n_tok:
                g = tid // n_tok
                t = tid - g * n_tok
                sq = float32(0.0)
                for i in range(wpg):
                    sq += red_ss[g * wpg + i, t]
                scale = gate_scale(rms_scale(sq, K, eps), gate, gate_col, yo + t)
                for r in range(rows):
                    s = float32(0.0)
                    for i in range(wpg):
                        s += red[g * wpg + i, r, t]
                    tot[r] = s * scale
                store(y0, y1, y2, n0, n1, n_rows, gi - tid // span + g, yo + t, tot, accumulate)

    return RowGroup(group_at, first_loads, rows_times_x)
