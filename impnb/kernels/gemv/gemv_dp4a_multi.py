"""The multi-token dp4a GEMV for a batched decode step of T = 2..8 rows: y[t, n] (+)= sum_k W[n, k]
x̂[t, k], as llama.cpp's mmvq with several columns, x̂ the int8 activations quant_x.py writes once.

Each thread loads a weight chunk of R rows once and applies it to all T tokens; token by token,
x̂ of the chunk's 32 columns (8 words and 4 scales) is loaded once and met with the R rows in
dp4a, so x̂ is read once per R rows, and only one token's x̂ is live at a time (R x T sums, R
row-chunks and one token's x̂ in registers). gemv_dp4a.py's T > 1 kernel loads every token's x̂
before the rows' dots instead, which holds T x 12 registers more and so runs few rows a group.
Three epilogues: plain (y, or y += with accumulate), stacked rows split into up to three outputs
(Q|K|V) and gate|up through its activation (GLU). Which variant runs for a shape and T is a
measured table (gpu/gemv_dispatch.py, written by scripts/bench_gemv_rows.py).
Numpy reference: gemv_dp4a.gemv_dp4a_ref (the same products).
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, int32, types, uint32

from impnb import tuning
from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.prefetch import PREFETCH_OP, chunk_prefetcher
from impnb.kernels.gemv.gemv_dp4a import kernel_args as t1_kernel_args
from impnb.kernels.gemv.gemv_dp4a_units import DOTS, LOADS, block_reduce, chunk_loaders, dot_of, prepare_of, x_order_of
from impnb.kernels.gemv.gemv_units import DECODERS, GLU_ACTS, NO_GLU, SILU
from impnb.kernels.gemv.gemv_variants import BLOCK, Variant
from impnb.kernels.gemv.quant_x import GROUP, QuantX, store_group_lanes
from impnb.launch import launch

MIN_T, MAX_T = 2, 8
VARIANT_ROWS = (2, 4, 8)
# spans within a warp (groups of 8 or 16 lanes, a row's chunks over fewer threads: a short row's
# every lane busy): the grouped kernel at a token a tile
GROUP_SPANS = (8, 16)


def unrolled(f, n):
    """Device function g(*a) calling f(*a, 0), ..., f(*a, n - 1) in turn, each with its t a
    constant (a loop over t with a long body stays rolled, and acc[r, t] then goes to the stack);
    one flat body, as a chain of nested inlined calls compiles many times slower."""
    args = "cur, c8, xq, xd, xs, k0, k1, xw, xf, acc, xr"
    body = "".join(f"    f({args}, {t})\n" for t in range(n))
    scope = {"f": f}
    exec(f"def g({args}):\n{body}", scope)
    return cuda.jit(device=True, inline=True)(scope["g"])


def _make(ggml_type, n_tok, span, rows, glu, cols, depth, grouped=False, quant=False, l2=False, early=False,
          tile_x=False, x_flat=False):
    _, _, col = DECODERS[ggml_type]
    load = LOADS[ggml_type]
    # grouped at T = 1 too: x̂ in the multi-token order (Q4_K's one-token dot takes it)
    dot = dot_of(T.Q4_K, 1) if n_tok == 1 and ggml_type == T.Q4_K else dot_of(ggml_type, max(n_tok, 2))
    prepare = prepare_of(ggml_type, max(n_tok, 2))
    x_order = x_order_of(ggml_type)
    act = GLU_ACTS[glu]
    groups = BLOCK // span  # row groups a block
    pairs = rows // 2  # GLU: gate rows a group, then the same up rows
    out_rows = pairs if glu else rows
    cpr = cols // 32  # chunks a row
    K4 = cols // 4  # x̂ words a token
    G16 = cols // GROUP  # x̂ groups (scales, sums) a token
    outs = groups * out_rows * n_tok  # outputs a block

    rows_chunk, chunk_or = chunk_loaders(load, rows, glu, cpr)
    prefetch_chunks = chunk_prefetcher(ggml_type)
    block_out = groups * out_rows  # output rows a block

    @cuda.jit(device=True, inline=True)
    def prefetch_block(parts, n_out, tid):
        # -- into L2: the block's rows, its gate (or plain) rows by thread 0, the up rows by thread 1 --
        rb = max(min(cuda.blockIdx.x * block_out, n_out - block_out), 0)
        n = (min(rb + block_out, n_out) - rb) * cpr
        if tid == 0:
            prefetch_chunks(parts, rb * cpr, n)
        elif glu and tid == 1:
            prefetch_chunks(parts, (rb + n_out) * cpr, n)

    @cuda.jit(device=True, inline=True)
    def token_dots(cur, c8, xq, xd, xs, k0, k1, xw, xf, acc, xr, t):
        # -- acc[r, t] += row r's chunk (loads cur) . x̂[t] (grouped: x̂[xr[t]]): x̂ of the chunk's
        # columns (through L1: the block's groups share it), then the R rows' dots --
        xt = xr[t] if grouped else t
        xw[0, 0], xw[0, 1], xw[0, 2], xw[0, 3] = qi.ldg_u32x4_l1(xq, xt * K4 + (k0 >> 2))
        xw[0, 4], xw[0, 5], xw[0, 6], xw[0, 7] = qi.ldg_u32x4_l1(xq, xt * K4 + (k1 >> 2))
        if x_flat:  # flat offsets at the build's row length: no runtime strides, no negative-index wrap
            xf[0, 0] = qi.as_f32(qi.ldg_u32_l1(xd, xt * G16 + (k0 >> 4)))
            xf[0, 1] = qi.as_f32(qi.ldg_u32_l1(xd, xt * G16 + (k1 >> 4)))
            xf[0, 2] = qi.as_f32(qi.ldg_u32_l1(xs, xt * G16 + (k0 >> 4)))
            xf[0, 3] = qi.as_f32(qi.ldg_u32_l1(xs, xt * G16 + (k1 >> 4)))
        else:
            xf[0, 0] = xd[xt, k0 >> 4]
            xf[0, 1] = xd[xt, k1 >> 4]
            xf[0, 2] = xs[xt, k0 >> 4]
            xf[0, 3] = xs[xt, k1 >> 4]
        x_order(xw, 0)
        for r in range(rows):
            acc[r, t] += dot(prepare(cur[r]), c8, xw, xf, 0)

    tokens_dots = unrolled(token_dots, n_tok)  # t a constant in each call: acc stays in registers

    @cuda.jit(device=True, inline=True)
    def chunk_dots(cur, c, c8, xq, xd, xs, xw, xf, acc, xr):
        tokens_dots(cur, c8, xq, xd, xs, col(c, 0), col(c, 1), xw, xf, acc, xr)

    if depth > 1:
        @cuda.jit(device=True, inline=True)
        def chunk_step(a, cur, c, c8, xq, xd, xs, xw, xf, acc, xr):
            # -- chunk c's dots with the next chunk's loads already out; returns those loads --
            nxt = chunk_or(a, c + span, cur)
            chunk_dots(cur, c, c8, xq, xd, xs, xw, xf, acc, xr)
            return nxt
    else:
        @cuda.jit(device=True, inline=True)
        def chunk_step(a, cur, c, c8, xq, xd, xs, xw, xf, acc, xr):
            # -- chunk c's dots, then the next chunk's loads --
            chunk_dots(cur, c, c8, xq, xd, xs, xw, xf, acc, xr)
            return chunk_or(a, c + span, cur)

    reduce_sums, output_of = block_reduce(rows, n_tok, span, glu, act)

    @cuda.jit(device=True, inline=True)
    def block_sums(a, raws, c0, xq, xd, xs, xr, tid):
        # -- the thread's chunks of its group's rows (the first one's loads raws) against every
        # token, reduced over the block's warps (reduce_sums) --
        acc = cuda.local.array((rows, n_tok), float32)
        for r in range(rows):
            for t in range(n_tok):
                acc[r, t] = 0.0
        xw = cuda.local.array((1, 8), uint32)
        xf = cuda.local.array((1, 4), float32)
        c8 = c0 & 7  # the chunk's place in a 256-superblock: spans are multiples of 8
        # -- main loop over the thread's chunks (one call site: each inlined copy costs compile time) --
        cur = raws
        for c in range(c0, cpr, span):
            cur = chunk_step(a, cur, c, c8, xq, xd, xs, xw, xf, acc, xr)
        return reduce_sums(acc, tid)

    # grid (ceil(N_out / (R_out * G)),), block 128 = 4 warps in G = 128 / span groups of span
    # threads; group gi = G * b + g owns output rows R_out * gi .. +R_out - 1 (R_out = R, or R / 2
    # with GLU: R / 2 gate rows and the same up rows); the last groups start R_out rows before
    # the end and write only rows >= R_out * gi. Thread i of a group takes chunks i, i + span, ...
    # of its R rows (the next chunk's loads out during this one's dots at depth 2). Sums reduce
    # over the warp (a span under 32: its group's lanes) by shuffles, then over the group's warps
    # in shared red (block_reduce).
    # Output row o goes to y0[t, o] below n0, y1[t, o - n0] below n0 + n1, else y2[t, o - n0 - n1].
    @cuda.jit(device=True, inline=True)
    def plain_rows(parts, xq, xd, xs, y0, y1, y2, n0, n1, n_rows, accumulate):
        tid = cuda.threadIdx.x
        group = tid // span
        n_out = n_rows // 2 if glu else n_rows
        row0 = min((cuda.blockIdx.x * groups + group) * out_rows, n_out - out_rows)
        g0 = row0 * cpr
        a = (parts, g0, g0 + (n_out * cpr if glu else 0))
        c0 = tid - group * span
        if l2:  # the block's rows on their way to L2 while the kernel before runs
            prefetch_block(parts, n_out, tid)
        raws = rows_chunk(a, min(c0, cpr - 1))  # W is no kernel's output: loaded before the wait
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        red = block_sums(a, raws, c0, xq, xd, xs, xd, tid)  # (x̂ rows: the tokens themselves)
        # -- epilogue: a thread an output (group g, row r, token t) --
        for o in range(tid, outs, BLOCK):
            g, r, t, s = output_of(red, o)
            gi = cuda.blockIdx.x * groups + g
            row = min(gi * out_rows, n_out - out_rows) + r
            if row >= gi * out_rows:
                if row < n0:
                    if accumulate:
                        s += y0[t, row]
                    y0[t, row] = s
                elif row < n0 + n1:
                    y1[t, row - n0] = s
                else:
                    y2[t, row - n0 - n1] = s

    @cuda.jit
    def _gemv_dp4a_multi_kernel(parts, xq, xd, xs, y0, y1, y2, n0, n1, n_rows, accumulate):
        plain_rows(parts, xq, xd, xs, y0, y1, y2, n0, n1, n_rows, accumulate)

    # Grouped (the routed experts of a batch, moe.moe_group's tiles): grid (ceil(N_out / (R_out *
    # G)), max_tiles), block y = tile i = (e, r0, n) with n <= T; as above over expert e's rows
    # (e * n_rows ..), token t < n being grouped row r0 + t, whose x̂ row is order[r0 + t] // x_div
    # (x_div 0: r0 + t itself); tokens n..T-1 repeat token n - 1 and are not written. Output
    # (row o, token t) goes to y[r0 + t, o].
    # quant (a token a tile, outs a multiple of GROUP): the block's outputs, GROUP a half-warp, in
    # int8 too, into row r0 of (oq, od, os) (quant_x's layout; the down's x̂ without a quantize_x).
    # early: the tiles (and order) come from a kernel before the previous one, which waited for
    # them before it let this one launch (the down after gate|up's grouped GEMV): the tile's
    # metadata and its first W chunk are read before griddepcontrol.wait, x̂ after it.
    # tile_x: grid (max_tiles, ceil(N_out / (R_out * G))), the tile block x.
    @cuda.jit
    def _gemv_dp4a_grouped_kernel(parts, xq, xd, xs, y, n_rows, tiles, n_tiles, order, x_div, oq, od, os):
        if not early:
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished (tiles, x̂)
            ptx.grid_dep_launch()
        i = cuda.blockIdx.x if tile_x else cuda.blockIdx.y
        bx = cuda.blockIdx.y if tile_x else cuda.blockIdx.x  # the block's row groups
        if i >= n_tiles[0]:
            return
        e = tiles[i, 0]
        r0 = tiles[i, 1]
        n = tiles[i, 2]
        tid = cuda.threadIdx.x
        group = tid // span
        n_out = n_rows // 2 if glu else n_rows
        row0 = min((bx * groups + group) * out_rows, n_out - out_rows)
        g0 = (e * n_rows + row0) * cpr
        a = (parts, g0, g0 + (n_out * cpr if glu else 0))
        c0 = tid - group * span
        raws = rows_chunk(a, min(c0, cpr - 1))
        xr = cuda.local.array(n_tok, int32)
        for t in range(n_tok):
            j = r0 + min(t, n - 1)
            xr[t] = order[j] // x_div if x_div > 0 else j
        if early:
            ptx.grid_dep_wait()  # the previous kernel has finished (x̂)
            ptx.grid_dep_launch()
        red = block_sums(a, raws, c0, xq, xd, xs, xr, tid)
        if quant:  # every lane: the half-warp shuffles of store_group_lanes
            o = min(tid, outs - 1)
            g, r, t, s = output_of(red, o)
            live = tid < outs
            if live:
                y[r0, bx * outs + o] = s
            store_group_lanes(s if live else float32(0.0), live, oq, od, os, r0,
                              (bx * outs) // GROUP + (tid >> 5) * 2)
            return
        for o in range(tid, outs, BLOCK):
            g, r, t, s = output_of(red, o)
            gi = bx * groups + g
            row = min(gi * out_rows, n_out - out_rows) + r
            if t < n and row >= gi * out_rows:
                y[r0 + t, row] = s

    return _gemv_dp4a_grouped_kernel if grouped else _gemv_dp4a_multi_kernel


def gemv_dp4a_multi_kernel(ggml_type: T, cols: int, n_tok: int, span: int, rows: int, glu: int = NO_GLU,
                           depth: int = 1, grouped: bool = False, quant: bool = False, l2: bool = False,
                           early: bool = False, tile_x: bool = False):
    """The kernel for one type, row length, T (2..8), row-group span, rows a group (R), epilogue
    (NO_GLU, or SILU / GELU of gate|up stacked rows) and load depth (1, or 2: the next chunk's
    loads during this one's dots); grouped: the routed experts' form (gemv_dp4a_grouped), T
    tokens a tile at most (1..8), at a token a tile also spans of 8 or 16 lanes (GROUP_SPANS); quant:
    its outputs in int8 too (grouped, one token a tile); l2: each block's weight rows prefetched
    into L2 before its wait (not grouped: a grouped block's rows are known only after it); early
    (grouped): the tiles read and the first W chunk loaded before the wait (gemv_dp4a_grouped);
    tile_x (grouped): the tiles along the grid's x, fastest in launch order. x̂'s scales read as
    tuning.X_FLAT says."""
    assert ggml_type in DOTS and (1 if grouped else MIN_T) <= n_tok <= MAX_T
    assert span in (32, 64, BLOCK) and rows in VARIANT_ROWS or span in GROUP_SPANS and grouped and n_tok == 1
    assert span >= 32 or rows in VARIANT_ROWS and rows <= span
    assert cols % 256 == 0 or cols % 32 == 0 and ggml_type not in (T.Q4_K, T.Q5_K, T.Q6_K)
    assert depth in (1, 2) and (not quant or grouped and n_tok == 1)
    assert not (l2 and grouped) and (grouped or not (early or tile_x))
    return _built(T(ggml_type), n_tok, span, rows, glu, cols, depth, grouped, quant, l2, early, tile_x, tuning.X_FLAT)


@lru_cache(maxsize=None)
def _built(*args):
    return _make(*args)


def _launch(w, x: QuantX, y0, y1, y2, n0: int, n1: int, n_out: int, stream, variant: Variant, accumulate: bool,
            glu: int, l2: bool | None = None):
    n_tok = y0.shape[0]
    K = w.cols
    assert w.ggml_type in DOTS and MIN_T <= n_tok <= MAX_T
    assert x.q.shape[1] == K // 4 and x.d.shape[1] == K // GROUP and x.q.shape[0] >= n_tok
    for y in (y0, y1, y2):
        assert y.dtype == np.float32 and y.is_c_contiguous() and y.shape[0] == n_tok
    out_rows = variant.rows // (2 if glu else 1)
    assert out_rows <= n_out, "more rows a group than the weight has"
    per_block = out_rows * (BLOCK // variant.span)
    kernel = gemv_dp4a_multi_kernel(w.ggml_type, K, n_tok, variant.span, variant.rows, glu, variant.unroll,
                                    l2=tuning.L2_PREFETCH_ROWS if l2 is None else l2)
    launch(kernel, ((n_out + per_block - 1) // per_block,), BLOCK, stream, w.parts, x.q[:n_tok], x.d[:n_tok],
           x.s[:n_tok], y0, y1, y2, np.int32(n0), np.int32(n1), np.int32(w.rows), np.int32(accumulate))


def gemv_dp4a_multi(w, x: QuantX, y, stream, variant: Variant, accumulate: bool = False, glu: int = NO_GLU,
                    l2: bool | None = None):
    """y (T, N) float32 = W x̂ (y += W x̂ with accumulate), x̂ of T = y's rows in 2..8 tokens;
    glu (SILU, GELU): W is gate|up stacked (2F, K) and y (T, F) = act(W[:F] x̂) * W[F:] x̂; l2: the
    rows prefetched into L2 before the kernel's wait (default: tuning.L2_PREFETCH_ROWS)."""
    N = y.shape[1]
    assert N == (w.rows // 2 if glu else w.rows) and not (glu and accumulate)
    assert glu == NO_GLU or variant.rows % 2 == 0, "GLU: an even number of rows a group"
    _launch(w, x, y, y, y, N, 0, N, stream, variant, accumulate, glu, l2)


def gemv_dp4a_multi_split(w, x: QuantX, ys, stream, variant: Variant):
    """Rows of W stacked from up to three matrices (Q|K|V): ys[i] (T, N_i) = W[rows of i] x̂."""
    assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows
    y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
    n0, n1 = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0
    _launch(w, x, y0, y1, y2, n0, n1, w.rows, stream, variant, False, NO_GLU)


def gemv_dp4a_grouped(w, n_rows: int, x: QuantX, y, tiles, n_tiles, order, x_div: int, stream, variant: Variant,
                      n_tok: int, glu: int = NO_GLU, y_q: QuantX | None = None, early: bool = False,
                      tile_x: bool = False):
    """The routed experts of a batch grouped by expert (moe.moe_group's order, tiles (max_tiles, 3)
    of at most n_tok rows each, n_tiles): y (S, N) float32 row r0 + j of tile (e, r0, n), j < n, =
    W_e x̂[order[r0 + j] // x_div] (x_div 0: x̂[r0 + j]), or with glu (SILU, GELU) y (S, F) =
    act(gate_e x̂) * up_e x̂ for gate|up stacked per expert. w: E experts of n_rows rows stacked,
    (E * n_rows, K); x̂ (quant_x.quantize_x) of the tokens (x_div = k) or of the grouped rows. y_q
    (where writes_int8): y's int8 form too, quantize_x's of y bit for bit. early: tiles, n_tiles and
    order were written before the kernel before this one, which waits for its own inputs before it
    lets this one launch (programmatic launch), so this kernel reads them and its first W chunk
    before its wait: only x̂ is that kernel's output. tile_x (a token a tile): the tiles fastest in
    launch order, for tiles in slot order (router_batch's OWN), where one expert's tiles lie apart
    and so read its rows at about the same time."""
    N = n_rows // 2 if glu else n_rows
    K = w.cols
    assert w.ggml_type in DOTS and w.rows % n_rows == 0 and 1 <= n_tok <= MAX_T and x_div >= 0
    assert y.dtype == np.float32 and y.is_c_contiguous() and y.shape == (order.shape[0], N)
    assert x.q.shape[1] == K // 4 and x.d.shape[1] == K // GROUP
    assert glu == NO_GLU or variant.rows % 2 == 0, "GLU: an even number of rows a group"
    for a in (tiles, n_tiles, order):
        assert a.dtype == np.int32 and a.is_c_contiguous()
    out_rows = variant.rows // (2 if glu else 1)
    assert out_rows <= N, "more rows a group than an expert has"
    per_block = out_rows * (BLOCK // variant.span)
    if y_q is not None:
        assert writes_int8(variant, n_tok, n_rows, glu), "int8 output: a token a tile, whole groups a block"
        assert y_q.q.shape == (y.shape[0], N // 4) and y_q.d.shape == y_q.s.shape == (y.shape[0], N // GROUP)
    assert n_tok == 1 or not tile_x
    kernel = gemv_dp4a_multi_kernel(w.ggml_type, K, n_tok, variant.span, variant.rows, glu, variant.unroll, True,
                                    y_q is not None, early=early, tile_x=tile_x)
    oq, od, os_ = y_q or (y.view(np.uint32), y, y)  # unread without y_q
    grid = ((N + per_block - 1) // per_block, tiles.shape[0])
    launch(kernel, grid[::-1] if tile_x else grid, BLOCK, stream, w.parts, x.q, x.d, x.s, y,
           np.int32(n_rows), tiles, n_tiles, order, np.int32(x_div), oq, od, os_)


def writes_int8(variant: Variant, n_tok: int, n_rows: int, glu: int) -> bool:
    """Whether gemv_dp4a_grouped of this variant can write its output's int8 form too: a token a
    tile, and each block's outputs whole groups of quant_x, the last block's too."""
    per_block = variant.rows // (2 if glu else 1) * (BLOCK // variant.span)
    N = n_rows // 2 if glu else n_rows
    return n_tok == 1 and per_block % GROUP == 0 and per_block <= BLOCK and N % per_block == 0


def kernel_args(ggml_type: T) -> tuple:
    """Argument types of the kernel: parts, x̂ q, d, s, y0, y1, y2, n0, n1, W's rows, accumulate."""
    parts, q, d, s = t1_kernel_args(ggml_type)[:4]
    f2 = types.Array(types.float32, 2, "C")
    return (parts, q, d, s, f2, f2, f2, types.int32, types.int32, types.int32, types.int32)


def grouped_kernel_args(ggml_type: T) -> tuple:
    """Argument types of the grouped kernel: parts, x̂ q, d, s, y, n_rows, tiles, n_tiles, order, x_div,
    y's int8 q, d, s."""
    parts, q, d, s = t1_kernel_args(ggml_type)[:4]
    i1, i2 = types.Array(types.int32, 1, "C"), types.Array(types.int32, 2, "C")
    f2 = types.Array(types.float32, 2, "C")
    return (parts, q, d, s, f2, types.int32, i2, i1, i1, types.int32, types.Array(types.uint32, 2, "C"), f2, f2)


# Built at K 4096 in variants the bench sweeps. Registers: 168 at Q4_K T 8 R 4, 149 at Q6_K T 2 R 4
# depth 2; eight rows at T = 8 with depth 2 spill (255 registers: R x T sums and two chunks of
# loads), so the bench's variants keep R x T x depth below that.
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemv_dp4a_multi_kernel(t, 4096, n, 32, r, glu, d), types.void(*kernel_args(t)), {"max_registers": 192})
        for t, n, r, glu, d in ((T.Q4_K, 8, 4, NO_GLU, 1), (T.Q4_K, 4, 4, SILU, 2), (T.Q6_K, 2, 4, NO_GLU, 2),
                                (T.Q8_0, 4, 8, NO_GLU, 1))
    ] + [  # the 30B-A3B's routed experts, grouped, in moe_table's variants: gate|up Q4_K 2 x 768 x 2048,
        # down Q6_K / Q4_K 2048 x 768
        (gemv_dp4a_multi_kernel(t, K, n, 32, r, glu, d, True), types.void(*grouped_kernel_args(t)),
         {"max_registers": 255})
        for t, K, n, r, glu, d in ((T.Q4_K, 2048, 2, 8, SILU, 2), (T.Q4_K, 2048, 2, 8, SILU, 1),
                                   (T.Q6_K, 768, 2, 8, NO_GLU, 1), (T.Q6_K, 768, 4, 4, NO_GLU, 1),
                                   (T.Q4_K, 768, 2, 8, NO_GLU, 2), (T.Q4_K, 2048, 1, 8, SILU, 1),
                                   (T.Q6_K, 768, 1, 8, NO_GLU, 1))
    ] + [(gemv_dp4a_multi_kernel(T.Q4_K, 2048, 1, span, 8, SILU, 1, True, True),  # gate|up with the down's x̂
          types.void(*grouped_kernel_args(T.Q4_K)), {"max_registers": 255}) for span in (32, 16)
    ] + [(gemv_dp4a_multi_kernel(T.Q6_K, 768, 1, 8, 8, NO_GLU, depth, True),  # the down over groups of 8 lanes
          types.void(*grouped_kernel_args(T.Q6_K)), {"max_registers": 255}) for depth in (1, 2)
    ] + [(gemv_dp4a_multi_kernel(T.Q6_K, 768, 1, 8, 8, NO_GLU, 2, True, early=True),  # the down reading tiles early
          types.void(*grouped_kernel_args(T.Q6_K)), {"max_registers": 255})
    ] + [(gemv_dp4a_multi_kernel(T.Q4_K, 2048, 1, 32, 8, SILU, 1, True, True, tile_x=True),  # in slot order
          types.void(*grouped_kernel_args(T.Q4_K)), {"max_registers": 255}),
         (gemv_dp4a_multi_kernel(T.Q6_K, 768, 1, 8, 8, NO_GLU, 2, True, early=True, tile_x=True),
          types.void(*grouped_kernel_args(T.Q6_K)), {"max_registers": 255})
    ] + [(gemv_dp4a_multi_kernel(t, 4096, 8, 32, 4, NO_GLU, 1, l2=True), types.void(*kernel_args(t)),  # prefetching
          {"max_registers": 192, "ptx_contains": (PREFETCH_OP,)}) for t in (T.Q4_K, T.Q6_K)
    ] + [  # x̂'s scales read flat (tuning.X_FLAT): attn_output at 8 rows, gate|up and the Q6_K down grouped
        (_built(T.Q4_K, 8, 32, 2, NO_GLU, 4096, 1, False, False, False, False, False, True),
         types.void(*kernel_args(T.Q4_K)), {"max_registers": 192}),
        (_built(T.Q4_K, 1, 32, 8, SILU, 2048, 1, True, True, False, False, False, True),
         types.void(*grouped_kernel_args(T.Q4_K)), {"max_registers": 255}),
        (_built(T.Q6_K, 1, 8, 8, NO_GLU, 768, 2, True, False, False, True, False, True),
         types.void(*grouped_kernel_args(T.Q6_K)), {"max_registers": 255})
    ]
