"""Quantized GEMV for decode: y[t, n] (+)= sum_k W[n, k] x[t, k], dequant fused, fp32 accumulation.

One kernel per weight type and token count T (1..8), built from the type's chunk decoder in
quant_blocks32.py / quant_blocks_k.py on a PackedWeight (repack.py), its blocks of row groups
(gemv_rows.py) with an entry and epilogue each made here. Numpy reference: `gemv_ref`.
A `normed` kernel reads RMSNorm(x) * wn instead of x (the layer's pre-norm fused: every row group
reads all of x anyway, so it sums x² on the way and scales its dot products at the end); its
reference is gemv_ref of norm.rms_norm_ref(x, wn, eps). A `tail` kernel ends with gemv_tail's
residual update (x += [RMSNorm](y), h = RMSNorm(x) * w_next), run by the grid's last block; a
`route` kernel (the MoE router, normed at decode) ends with that block choosing each token's
experts from y (moe.route_block; reference moe.route_ref), its blocks having written the int8 form
of its input for the dp4a experts where asked (quant_x.make_quantize_block); a `gated` kernel
scales each token's dot products by sigmoid of a logit read from a device buffer (Qwen3.5's shared
expert gate, which the router GEMV writes beside its own logits). Their launchers beside `gemv`:
gemv_stacked.py (split, pair, GLU), gemv_residual.py, gemv_route.py, gemv_experts.py, gemv_gated.py.
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, types

from impnb.kernels.common import ptx
from impnb.kernels.gemv.gemv_rows import row_group, tuple_of  # noqa: F401 (re-exported)
from impnb.kernels.gemv.gemv_tail import last_block, make_tail
from impnb.kernels.gemv.gemv_units import DECODERS, GELU, NO_GLU, SILU  # noqa: F401 (re-exported)
from impnb.kernels.gemv.gemv_variants import (BLOCK, FOUR_ROW_TYPES, SWEEP_TYPES, WARPS, WIDE_K,  # noqa: F401
                                         WIDE_MIN_ROWS, WIDE_TYPES, Variant, choose, rows_per_block,
                                         span_for, sweep)
from impnb.kernels.moe.moe import route_rows
from impnb.kernels.gemv.quant_x import THREADS as QUANT_THREADS, make_quantize_block
from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemv.gemv_args import F32_2D, kernel_args, parts_type  # noqa: F401 (re-exported)
from impnb.launch import launch
from impnb.quants import dequantize

MAX_T = 8


def gemv_ref(w: np.ndarray, ggml_type: T, x: np.ndarray) -> np.ndarray:
    """Raw GGUF weight bytes (N, row_bytes), x (T, K) -> (T, N) float64 = x @ dequant(W).T."""
    wd = dequantize(np.asarray(w).view(np.uint8).reshape(w.shape[0], -1), ggml_type)
    return x.astype(np.float64) @ wd.astype(np.float64).reshape(w.shape[0], -1).T


def _make_gemv(load, unit, col, n_tok, span, unroll, rows, glu, experts, normed, tail, route, one_step,
               block_fn=False, gated=False):
    # grid and block: gemv_rows.row_group's (G = 128 / span groups of R = `rows` rows a block)
    group_at, first_loads, rows_times_x = row_group(load, unit, col, n_tok, span, unroll, rows, glu, normed,
                                                    one_step, gated)
    groups = WARPS // (span // 32)

    if experts:
        # grid (ceil(N_out / (R_out * G)), S): blockIdx.y is slot s = t * k + j of the routed tokens;
        # W is E stacked (n_rows, K) experts, x row s // x_div is the slot's input (x_div = k for
        # the tokens, 1 for per-slot rows), y row s its output.
        @cuda.jit
        def _gemv_experts_kernel(parts, x, y, n_rows, experts, x_div, accumulate):
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
            s = cuda.blockIdx.y
            at = group_at(parts, n_rows, experts[s] * n_rows, x.shape[1], cuda.blockIdx.x)
            rows_times_x(at, first_loads(at), x, y, y, y, n_rows, 0, n_rows, accumulate, (s // x_div) * x.shape[1],
                         s, x, float32(0), x, 0)

        return _gemv_experts_kernel

    if tail:
        residual_tail = make_tail(tail)

        # as _gemv_kernel, y one output; then the residual tail (gemv_tail.py) on x_res, h
        @cuda.jit
        def _gemv_tail_kernel(parts, x, y, n_rows, x_res, w_post, w_next, h, eps, counter):
            at = group_at(parts, n_rows, 0, x.shape[1], cuda.blockIdx.x)
            first = first_loads(at)  # W is no kernel's output: one_step's loads go out before the wait
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
            rows_times_x(at, first, x, y, y, y, n_rows, 0, n_rows, 0, 0, 0, x, float32(0), x, 0)
            residual_tail(y, x_res, w_post, w_next, h, eps, counter)

        return _gemv_tail_kernel

    if route:
        quantize_block = make_quantize_block(normed)
        route_tail = route_rows(n_tok)

        # as _gemv_kernel (normed: of RMSNorm(x) * wn) into y = the logits (T, n_rows) in its
        # first ceil(n_rows / rows a block) blocks; with quant, the blocks after those write the int8
        # form of the same input into q, d, s as quantize_x's blocks (bx, t) would, beside the
        # GEMV rather than after it; then the grid's last block routes the T tokens (route_block)
        # among the first n_routed logits of each row (the rest: rows stacked under the router's,
        # Qwen3.5's shared expert gate)
        @cuda.jit
        def _gemv_route_kernel(parts, x, wn, eps, y, n_rows, n_routed, k, normalize, experts, weights, counter,
                               q, d, s, quant):
            at = group_at(parts, n_rows, 0, x.shape[1], cuda.blockIdx.x)
            first = first_loads(at)  # W is no kernel's output: one_step's loads go out before the wait
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
            n_gemv = (n_rows + rows * groups - 1) // (rows * groups)
            if cuda.blockIdx.x < n_gemv:
                rows_times_x(at, first, x, y, y, y, n_rows, 0, n_rows, 0, 0, 0, wn, eps, x, 0)
            elif quant:
                gx = (d.shape[1] + QUANT_THREADS - 1) // QUANT_THREADS  # quantize_x's blocks a token
                for item in range(cuda.blockIdx.x - n_gemv, gx * x.shape[0], cuda.gridDim.x - n_gemv):
                    quantize_block(x, wn, eps, q, d, s, item % gx, item // gx)
                    cuda.syncthreads()  # its shared sums are free again
            if last_block(counter):
                route_tail(y, n_routed, k, normalize, experts, weights, 0)

        return _gemv_route_kernel

    if normed:
        @cuda.jit(device=True, inline=True)
        def normed_block(parts, x, wn, eps, y0, y1, y2, n0, n1, n_rows, accumulate, bx):
            # -- block bx of the normed GEMV --
            at = group_at(parts, n_rows, 0, x.shape[1], bx)
            first = first_loads(at)  # W is no kernel's output: one_step's loads go out before the wait
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
            rows_times_x(at, first, x, y0, y1, y2, n0, n1, n_rows, accumulate, 0, 0, wn, eps, x, 0)

        if block_fn:
            return normed_block

        @cuda.jit
        def _gemv_norm_kernel(parts, x, wn, eps, y0, y1, y2, n0, n1, n_rows, accumulate):
            normed_block(parts, x, wn, eps, y0, y1, y2, n0, n1, n_rows, accumulate, cuda.blockIdx.x)

        return _gemv_norm_kernel

    if gated:
        # as _gemv_kernel, y one output, each token t's dot products times sigmoid(gate[t, gate_col])
        # (the gate a column of another kernel's output: read after the wait)
        @cuda.jit
        def _gemv_gated_kernel(parts, x, y, n_rows, accumulate, gate, gate_col):
            at = group_at(parts, n_rows, 0, x.shape[1], cuda.blockIdx.x)
            first = first_loads(at)  # W is no kernel's output: one_step's loads go out before the wait
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
            rows_times_x(at, first, x, y, y, y, n_rows, 0, n_rows, accumulate, 0, 0, x, float32(0), gate, gate_col)

        return _gemv_gated_kernel

    @cuda.jit
    def _gemv_kernel(parts, x, y0, y1, y2, n0, n1, n_rows, accumulate):
        at = group_at(parts, n_rows, 0, x.shape[1], cuda.blockIdx.x)
        first = first_loads(at)  # W is no kernel's output: one_step's loads go out before the wait
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        rows_times_x(at, first, x, y0, y1, y2, n0, n1, n_rows, accumulate, 0, 0, x, float32(0), x, 0)

    return _gemv_kernel


@lru_cache(maxsize=None)
def gemv_kernel(ggml_type: T, n_tok: int, span: int = BLOCK, glu: int = NO_GLU, experts: bool = False,
                unroll: int = 1, rows: int | None = None, normed: bool = False, tail: int = 0,
                route: bool = False, one_step: bool = False, block_fn: bool = False, gated: bool = False):
    """The compiled-on-first-use kernel for one type, token count, row-group span and epilogue;
    `experts`: the routed-expert variant (one token per slot, see gemv_experts); `unroll`: chunks
    per row a thread loads before decoding; `rows` per group (default rows_per_block); `normed`:
    x is RMS-normalized on the way (extra arguments wn, eps after x); `tail` (gemv_tail.ADD,
    POST_ADD): one output, then the residual tail; `route`: one output, the router logits, then the
    routing tail (gemv_route; arguments wn, eps after x, read where normed); `gated`: one output,
    each token's dot products times sigmoid(gate[t, gate_col]) (gemv_gated); `one_step`: for
    K <= 32 x span x unroll, a thread's one step of loads issued before griddepcontrol.wait (W is
    no kernel's output), so they overlap the kernel before; `block_fn` (normed only): the device
    function of one block instead, normed_block(parts, x, wn, eps, y0, y1, y2, n0, n1, n_rows,
    accumulate, bx) (gemv_pair's halves)."""
    if not 1 <= n_tok <= MAX_T:
        raise ValueError(f"gemv: T={n_tok} tokens, supported 1..{MAX_T}")
    assert span in (32, 64, BLOCK) and unroll in (1, 2, 4)
    ggml_type = T(ggml_type)
    rows = rows or rows_per_block(ggml_type, n_tok)
    assert rows in (1, 2) or (rows in (4, 8) and n_tok == 1), (rows, n_tok)
    assert glu == NO_GLU or rows % 2 == 0, "GLU needs an even number of rows per group"
    assert not experts or (n_tok == 1 and not normed)
    assert not (tail or route) or (glu == NO_GLU and not experts and not (tail and (normed or route)))
    assert not block_fn or (normed and not (tail or route or experts))
    assert not gated or (glu == NO_GLU and not (experts or normed or tail or route or block_fn))
    return _make_gemv(*DECODERS[ggml_type], n_tok, span, unroll, rows, glu, experts, normed, tail, route,
                      one_step, block_fn, gated)


WIDE_LOADS = (T.F16, T.F32)


def variant_kernel(ggml_type: T, n_tok: int, v: Variant, glu: int = NO_GLU, experts: bool = False,
                   normed: bool = False, tail: int = 0, route: bool = False, cols: int = 0,
                   block_fn: bool = False, gated: bool = False):
    """gemv_kernel in variant v; with cols (K), the one-step kernel where a thread's chunks fit one step
    (quantized types: F16 / F32 chunks would hold 64 / 128 bytes a row in registers across the wait)."""
    one_step = 0 < cols // 32 <= v.span * v.unroll and ggml_type not in WIDE_LOADS
    return gemv_kernel(ggml_type, n_tok, v.span, glu, experts, v.unroll, v.rows, normed, tail, route, one_step,
                       block_fn, gated)


def out_per_block(v: Variant, glu: int) -> int:
    return v.rows // (2 if glu else 1) * (BLOCK // v.span)


def aligned16(a) -> bool:
    ptr = getattr(a, "device_ctypes_pointer", None)
    return ptr is None or (ptr.value or 0) % 16 == 0


def launch_rows(w: PackedWeight, x, y0, y1, y2, n0: int, n1: int, out_rows: int, glu: int,
                stream, accumulate: bool, variant: Variant | None, norm: tuple | None):
    n_tok, K = x.shape
    assert w.cols == K and x.dtype == np.float32 and x.is_c_contiguous() and aligned16(x)
    for y in (y0, y1, y2):
        assert y.dtype == np.float32 and y.is_c_contiguous() and y.shape[0] == n_tok
    v = variant or choose(w.ggml_type, n_tok, K, w.rows)
    grid = (out_rows + out_per_block(v, glu) - 1) // out_per_block(v, glu)
    tail = (y0, y1, y2, np.int32(n0), np.int32(n1), np.int32(w.rows), np.int32(accumulate))
    if norm is None:
        launch(variant_kernel(w.ggml_type, n_tok, v, glu, cols=K), grid, BLOCK, stream, w.parts, x, *tail)
        return
    wn, eps = norm
    assert wn.dtype == np.float32 and wn.shape == (K,) and aligned16(wn)
    launch(variant_kernel(w.ggml_type, n_tok, v, glu, normed=True, cols=K), grid, BLOCK, stream, w.parts, x,
           wn, np.float32(eps), *tail)


def gemv(w: PackedWeight, x, y, stream, accumulate: bool = False, variant: Variant | None = None,
         norm: tuple | None = None):
    """y (T, N) float32 = W x, or y += W x with accumulate; x (T, K) float32, T in 1..8;
    `variant` overrides `choose` (benchmarks, tests); norm (wn (K,) float32, eps): W RMSNorm(x) wn."""
    assert y.shape == (x.shape[0], w.rows), (w.rows, w.cols, x.shape, y.shape)
    launch_rows(w, x, y, y, y, w.rows, 0, w.rows, NO_GLU, stream, accumulate, variant, norm)


# Registers: 70-96 for T = 1 (four rows: Q8_0, Q4_0, Q4_1, Q4_K, F16, F32) and the rest up to ~110
# (two rows at T <= 2, eight tokens in flight at T = 8); the unrolled T = 1 variants up to ~245. The
# build checks take every type at each (T, span, GLU) of EVERY_TYPE (every level of each, and the
# register-heaviest) and one of IN_TURN in turn: every type x level and shape, not every product.
EVERY_TYPE = ((8, 32, NO_GLU), (8, BLOCK, NO_GLU), (3, BLOCK, NO_GLU), (2, 64, SILU), (1, BLOCK, GELU))
IN_TURN = ((1, 32, NO_GLU), (1, 64, NO_GLU), (1, BLOCK, NO_GLU), (2, BLOCK, NO_GLU), (1, 32, SILU))
ONE_STEP_EVERY_TYPE = ((8, 32, NO_GLU), (1, 32, SILU), (1, 64, GELU))
ONE_STEP_IN_TURN = ((1, 32, NO_GLU), (1, 64, NO_GLU))
NORMED_SHAPES = ((1, 32, NO_GLU), (1, 32, SILU), (2, BLOCK, NO_GLU), (2, 64, SILU))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemv_kernel(t, n, span, glu), types.void(*kernel_args(t)), {"max_registers": 112})
        for i, t in enumerate(DECODERS) for n, span, glu in (*EVERY_TYPE, IN_TURN[i % len(IN_TURN)])
    ] + [  # one step a thread (K <= 32 x span: the small models' GEMVs), its loads before the wait
        (gemv_kernel(t, n, span, glu, one_step=True), types.void(*kernel_args(t)), {"max_registers": 112})
        for i, t in enumerate(t for t in DECODERS if t not in WIDE_LOADS)
        for n, span, glu in (*ONE_STEP_EVERY_TYPE, ONE_STEP_IN_TURN[i % len(ONE_STEP_IN_TURN)])
    ] + [  # the variants choose() takes at K >= WIDE_K, and one unrolled variant of the sweep (the
        # rest of the sweep compiles where it runs: bench_gemv.py --sweep)
        (variant_kernel(t, 1, v), types.void(*kernel_args(t)), {})
        for t, v in [(t, choose(t, 1, WIDE_K, rows)) for t in WIDE_TYPES for rows in (1, WIDE_MIN_ROWS)]
        + [(T.Q4_K, Variant(32, 4, 4))]
    ] + [  # normed: the decode shapes of the dense models (Q|K|V and logits, gate|up), every type at
        # each shape, one step or not in turn (each type and each shape both ways)
        (gemv_kernel(t, n, span, glu, normed=True, one_step=bool((i + j) % 2)),
         types.void(*kernel_args(t, normed=True)), {"max_registers": 136})
        for i, t in enumerate((T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K)) for j, (n, span, glu) in enumerate(NORMED_SHAPES)
    ]
