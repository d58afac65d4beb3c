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
`<type>_dot` (gemv_dp4a_units.py) on a PackedWeight (repack.py); `choose_dp4a` picks the variant (measured:
gemv_dp4a_variants.py). The routed experts' launcher is gemv_dp4a_experts.py's.
The weights are no kernel's output, so a thread's first chunk is loaded before griddepcontrol.wait:
under programmatic launch those loads overlap the kernel before (docs/EXPERIMENTS.md, 'dp4a GEMV').
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, from_dtype, types, uint32

from impnb import tuning
from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemv.gemv import gemv_ref
from impnb.kernels.gemv.gemv_units import DECODERS, GELU, GLU_ACTS, NO_GLU, SILU  # noqa: F401 (re-exported)
from impnb.kernels.gemv.gemv_dp4a_units import (DOTS, DP4A_TYPES, LOADS, block_reduce, chunk_loaders, dot_of, prepare_of,
                                               q4_k_dot_w, q4_k_dot_w_t1, q4_k_load_w, x_order_of)
from impnb.kernels.gemv.gemv_dp4a_variants import choose_capped
from impnb.kernels.gemv.gemv_tail import ADD, POST_ADD, Residual, make_tail
from impnb.kernels.gemv.gemv_variants import BLOCK, WARPS, Variant
from impnb.kernels.gemv.quant_x import GROUP, QuantX, dequantize_x_ref
from impnb.kernels.common.repack import LAYOUTS, PackedWeight
from impnb.launch import launch

MAX_T = 8


def gemv_dp4a_ref(w: np.ndarray, ggml_type: T, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """Raw GGUF weight bytes (N, row_bytes), x̂ as quant_x.quantize_x_ref's (q, d) -> (T, N) float64."""
    return gemv_ref(w, ggml_type, dequantize_x_ref(xq, xd))


def _make_gemv_dp4a(ggml_type, n_tok, span, rows, glu, experts, cols, depth, max_registers, block_fns=False,
                    tail=0):
    _, _, col = DECODERS[ggml_type]
    load = LOADS[ggml_type]
    dot = dot_of(ggml_type, n_tok)
    prepare = prepare_of(ggml_type, n_tok)
    x_order = x_order_of(ggml_type)
    if ggml_type == T.Q4_K and cols % 1024 == 0 and n_tok == 1 and glu == NO_GLU and not experts and not qi.SIM:
        # the header by shuffles (a warp's chunk loops agree)
        load, dot = q4_k_load_w, q4_k_dot_w_t1 if tuning.NIBBLE_HI16 else q4_k_dot_w
    act = GLU_ACTS[glu]
    wpg = span // 32  # warps per row group
    groups = WARPS // wpg
    pairs = rows // 2  # GLU: output rows a group (gate rows, then the same up rows)
    out_rows = pairs if glu else rows
    cpr = cols // 32  # chunks a row
    K4 = cols // 4  # x̂ words a token

    rows_chunk, chunk_or = chunk_loaders(load, rows, glu, cpr)

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
            x_order(xw, t)
        for r in range(rows):
            wr = prepare(cur[r])
            for t in range(n_tok):
                acc[r, t] += dot(wr, c8, xw, xf, t)

    # one token's sums in chains: the butterfly's lane selects cost its builds registers (69 -> 73)
    reduce_sums, output_of = block_reduce(rows, n_tok, span, glu, act, lanes=n_tok > 1)

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
        red = reduce_sums(acc, tid)
        if tid < groups * out_rows * n_tok:  # a thread an output (group g, row r, token t)
            g, r, t, s = output_of(red, tid)
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

    if tail:
        residual_tail = make_tail(tail)

        # as the plain kernel, y one output; then the residual tail (gemv_tail.py) on x_res, h
        @cuda.jit(**({"max_registers": max_registers} if max_registers and not qi.SIM else {}))
        def _gemv_dp4a_tail_kernel(parts, xq, xd, xs, y, n_rows, x_res, w_post, w_next, h, eps, counter):
            start = group_start(parts, n_rows, 0)
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
            rows_times_x(start, xq, xd, xs, y, n_rows, 0, 0, 0, y)
            residual_tail(y, x_res, w_post, w_next, h, eps, counter)

        return _gemv_dp4a_tail_kernel

    @cuda.jit(**({"max_registers": max_registers} if max_registers and not qi.SIM else {}))
    def _gemv_dp4a_kernel(parts, xq, xd, xs, y, n_rows, accumulate):
        start = group_start(parts, n_rows, 0)  # W is no kernel's output: its first loads go out early
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        rows_times_x(start, xq, xd, xs, y, n_rows, accumulate, 0, 0, y)

    return _gemv_dp4a_kernel


@lru_cache(maxsize=None)
def gemv_dp4a_kernel(ggml_type: T, cols: int, n_tok: int, span: int, rows: int, glu: int = NO_GLU,
                     experts: bool = False, depth: int = 1, max_registers: int | None = None, tail: int = 0):
    """The compiled-on-first-use dp4a kernel for one type, row length (columns), token count,
    row-group span, rows a group and epilogue (NO_GLU, or SILU / GELU: act(gate) * up of gate|up
    stacked rows); `experts`: the routed-expert kernel (one token a slot, see gemv_dp4a_experts);
    `depth`: the loads of this many chunks a thread are in flight (a Variant's unroll, 1..4: each
    chunk's loads issued depth - 1 steps early); `max_registers` caps the registers (T1_CAPPED;
    not the experts kernel's); `tail` (gemv_tail.ADD, POST_ADD): plain rows, then the residual
    tail (gemv_dp4a_residual)."""
    assert ggml_type in DOTS and 1 <= n_tok <= MAX_T and span in (32, 64, BLOCK) and rows in (1, 2, 4, 8)
    assert cols % 256 == 0 or cols % 32 == 0 and ggml_type not in (T.Q4_K, T.Q5_K, T.Q6_K)
    assert glu == NO_GLU or rows % 2 == 0, "GLU needs an even number of rows a group"
    assert not experts or n_tok == 1
    assert not (experts and max_registers), "the routed-experts kernel takes no register cap"
    assert 1 <= depth <= 4
    assert not tail or (glu == NO_GLU and not experts)
    return _make_gemv_dp4a(T(ggml_type), n_tok, span, rows, glu, experts, cols, depth, max_registers, tail=tail)


@lru_cache(maxsize=None)
def dp4a_block_fns(ggml_type: T, cols: int, n_tok: int, span: int, rows: int, depth: int):
    """The plain kernel's device functions for a kernel that runs its blocks among others
    (router_fold.py): group_start(parts, n_rows, 0), whose loads may go out before the wait, then
    rows_times_x(start, xq, xd, xs, y, n_rows, accumulate, 0, 0, res); both read
    cuda.blockIdx.x as the GEMV's block."""
    assert ggml_type in DOTS and 1 <= n_tok <= MAX_T and span in (32, 64, BLOCK) and rows in (1, 2, 4, 8)
    return _make_gemv_dp4a(T(ggml_type), n_tok, span, rows, NO_GLU, False, cols, depth, None, block_fns=True)


def gemv_dp4a(w: PackedWeight, x: QuantX, y, stream, accumulate: bool = False, variant: Variant | None = None,
              glu: int = NO_GLU, cap: int | None = None):
    """y (T, N) float32 = W x̂, or y += W x̂ with accumulate; x̂ (quant_x.quantize_x) of T in 1..8
    tokens (its first T rows, T = y's rows); glu (SILU, GELU): W is gate|up stacked (2F, K) and
    y (T, F) = act(W[:F] x̂) * W[F:] x̂; `variant` (and its register cap `cap`) overrides
    `choose_capped`."""
    n_tok, N = y.shape
    K = w.cols
    assert w.ggml_type in DOTS and N == (w.rows // 2 if glu else w.rows) and 1 <= n_tok <= MAX_T
    assert x.q.shape[1] == K // 4 and x.d.shape[1] == K // GROUP and x.q.shape[0] >= n_tok
    assert y.dtype == np.float32 and y.is_c_contiguous()
    v, cap = (variant, cap) if variant else choose_capped(w.ggml_type, n_tok, K, glu, N)
    launch(gemv_dp4a_kernel(w.ggml_type, K, n_tok, v.span, v.rows, glu, False, v.unroll, cap), _grid(v, N, glu),
           BLOCK, stream, w.parts, x.q[:n_tok], x.d[:n_tok], x.s[:n_tok], y, np.int32(w.rows), np.int32(accumulate))


def _grid(v: Variant, N: int, glu: int) -> tuple:
    """The 1-D grid of a dp4a GEMV of N outputs in variant v: BLOCK / v.span groups a block, each of
    v.rows output rows (GLU: half as many, gate and up)."""
    out_rows = v.rows // (2 if glu else 1)
    assert out_rows <= N, "more rows a group than the weight has"
    per_block = out_rows * (BLOCK // v.span)
    return ((N + per_block - 1) // per_block,)


def gemv_dp4a_residual(w: PackedWeight, x: QuantX, y, res: Residual, stream, variant: Variant | None = None,
                       cap: int | None = None):
    """y (T, N) float32 = W x̂ as gemv_dp4a (T tokens of x̂), then the grid's last block applies
    res to y: res.x += y (or RMSNorm(y) * res.w_post), res.h = RMSNorm(res.x) * res.w_next
    (gemv_tail.py; gemv_residual's tail on the dp4a GEMV)."""
    n_tok, N = y.shape
    K = w.cols
    assert w.ggml_type in DOTS and N == w.rows and 1 <= n_tok <= MAX_T
    assert x.q.shape[1] == K // 4 and x.d.shape[1] == K // GROUP and x.q.shape[0] >= n_tok
    assert y.dtype == np.float32 and y.is_c_contiguous()
    v, cap = (variant, cap) if variant else choose_capped(w.ggml_type, n_tok, K, NO_GLU, N)
    launch(gemv_dp4a_kernel(w.ggml_type, K, n_tok, v.span, v.rows, NO_GLU, False, v.unroll, cap, tail=res.mode),
           _grid(v, N, NO_GLU), BLOCK, stream, w.parts, x.q[:n_tok], x.d[:n_tok], x.s[:n_tok], y, np.int32(w.rows),
           *res.args(y))


def tail_kernel_args(ggml_type: T) -> tuple:
    """Argument types of gemv_dp4a_residual's kernel: gemv_dp4a's but accumulate, then the tail's
    x, w_post, w_next, h, eps, counter."""
    f1, f2 = types.Array(types.float32, 1, "C"), types.Array(types.float32, 2, "C")
    return (*kernel_args(ggml_type)[:6], f2, f1, f1, f2, types.float32, types.Array(types.uint32, 1, "C"))


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
# choose_capped picks (with its cap where it has one), and FP4's at K 2048.
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemv_dp4a_kernel(t, K, n, v.span, v.rows, NO_GLU, False, v.unroll, cap), types.void(*kernel_args(t)),
         {"max_registers": cap or (160 if v.unroll > 1 else 128)})
        for t in DP4A_TYPES for K in (4096, 16384) for n in (1, 2, 8)
        for v, cap in (choose_capped(t, n, K, NO_GLU, 8192),)
        if K == 4096 or n == 1
    ] + [  # gate|up with SiLU (llama, qwen3)
        (gemv_dp4a_kernel(t, 4096, n, v.span, v.rows, SILU, False, v.unroll, cap), types.void(*kernel_args(t)),
         {"max_registers": cap or 128})
        for t in (T.Q4_K, T.Q8_0) for n in (1, 8) for v, cap in (choose_capped(t, n, 4096, SILU, 8192),)
    ] + [  # the residual tail (gemv_dp4a_residual): Gemma 4's attn_output (2816 x 4096 and 8192) and
        # down (2816 x 2112) with their post-norms, a plain add at two tokens
        (gemv_dp4a_kernel(t, K, n, v.span, v.rows, NO_GLU, False, v.unroll, cap, tail=mode),
         types.void(*tail_kernel_args(t)), {"max_registers": cap or 128})
        for t, n, K, mode in ((T.Q4_K, 1, 8192, POST_ADD), (T.Q8_0, 1, 2112, POST_ADD), (T.NVFP4, 1, 4096, POST_ADD),
                              (T.NVFP4, 1, 2112, POST_ADD), (T.Q4_K, 2, 4096, ADD))
        for v, cap in (choose_capped(t, n, K, NO_GLU, 2816),)
    ] + [  # FP4's short rows (T1_SHORT: Qwen3-30B-A3B's Q|K|V, 5120 x 2048)
        (gemv_dp4a_kernel(t, 2048, 1, v.span, v.rows, NO_GLU, False, v.unroll, cap), types.void(*kernel_args(t)),
         {"max_registers": cap or 128})
        for t in (T.NVFP4, T.MXFP4) for v, cap in (choose_capped(t, 1, 2048, NO_GLU, 5120),)
    ]
