"""The routed experts' down projection at decode on dp4a, with their weighted sum fused in (the
dp4a twin of gemv_moe.py):

  out[t, n] (+)= sum_j weights[t, j] * (W_e x̂[t * k + j])[n]      e = experts[t * k + j], j < k

x̂ the int8 form of act's rows (quant_x.py's groups of 16 columns), made by the kernel itself: a
thread quantizes the 32 columns of the chunk it multiplies, so no quantize_x launch comes first.
With a tail (gemv_tail.quant_tail; out is the residual stream, added into) the grid's last block
then writes the next layer's input, RMSNorm(out) * w_next, in int8 for its dp4a Q|K|V.
Reference: `down_sum_dp4a_ref` (gemv_moe's of the dequantized x̂).
Legend: T tokens, k experts a token, D output rows of an expert, F its input width (cols).
"""

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.warp import warp_sums_lanes
from impnb.kernels.gemv.gemv import F32_2D, aligned16, tuple_of
from impnb.kernels.gemv.gemv_dp4a import kernel_args as dp4a_args
from impnb.kernels.gemv.gemv_dp4a_units import DOTS, LOADS, dot_of, prepare_of, x_order_of
from impnb.kernels.gemv.gemv_tail import quant_tail
from impnb.kernels.gemv.gemv_units import DECODERS
from impnb.kernels.moe.moe import MAX_K
from impnb.kernels.gemv.quant_x import GROUP, QuantX, dequantize_x_ref, quantize16, quantize_x_ref
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch

# output rows a block: 8 decodes about 10% faster than 4 on Qwen3-30B-A3B; 16 exceeds the
# register bound.
ROWS = 8
SUM_SHIFT = 5 - (ROWS.bit_length() - 1)  # warp_sums_lanes leaves row i's sum in lanes i << SUM_SHIFT ..
assert ROWS & (ROWS - 1) == 0 and ROWS <= 32
MAX_WARPS = 16  # 512 threads: at up to 128 registers (asserted at build) a block fits an SM
MAX_BLOCK = 32 * MAX_WARPS
EARLY_BLOCK = 256  # early builds' largest block (their registers are not capped)


def down_sum_dp4a_ref(wd: np.ndarray, act: np.ndarray, experts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """wd (E, D, F) float64 dequantized experts, act (T * k, F) float32, experts (T * k,),
    weights (T, k) -> (T, D) float64: the weighted sum of the experts' outputs on x̂ of act."""
    n_tok, k = weights.shape
    xq, xd, _ = quantize_x_ref(act)
    y = np.einsum("sdf,sf->sd", wd[experts], dequantize_x_ref(xq, xd))
    return (weights[:, :, None].astype(np.float64) * y.reshape(n_tok, k, -1)).sum(axis=1)


@cuda.jit(device=True, inline=True)
def _quantize16(act, i, xw, xf, o):
    """xw[0, 4o:4o+4] = the 16 floats act.flat[i:i+16] in int8 (quant_x's rounding), xf[0, o] its
    scale and xf[0, 2 + o] the sum of its dequantized values."""
    v = cuda.local.array(GROUP, float32)
    for j in range(4):
        v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3] = qi.ldg_f32x4(act, i + 4 * j)
    xw[0, 4 * o], xw[0, 4 * o + 1], xw[0, 4 * o + 2], xw[0, 4 * o + 3], xf[0, o], xf[0, 2 + o] = quantize16(v)


@lru_cache(maxsize=None)
def down_sum_dp4a_kernel(ggml_type: T, cols: int, tail: bool = False):
    """The kernel for one weight type and expert input width F = cols (built in: a row's chunks
    and a row's distance are constants); tail: then gemv_tail.quant_tail (its arguments after the
    kernel's own)."""
    load, dot, prepare = LOADS[T(ggml_type)], dot_of(T(ggml_type), 1), prepare_of(T(ggml_type), 1)  # a token a slot
    x_order = x_order_of(T(ggml_type))
    col = DECODERS[T(ggml_type)][2]
    cpr = cols // 32  # chunks a row

    @cuda.jit(device=True, inline=True)
    def row_chunk(parts, g, r):
        return load(parts, g, r * cpr)  # row r's chunk: r * cpr chunks on (a build-time constant)

    rows_chunk = tuple_of(row_chunk, ROWS)

    early = MAX_K * cpr <= EARLY_BLOCK  # one (slot, chunk) a thread, in a block of at most 256

    # grid (T * ceil(D / ROWS),), block 32 * ceil(k * cpr / 32) (at most 512): block b is token
    # t = b // ceil(D / ROWS), rows ROWS * (b mod ceil(D / ROWS)) .. +ROWS-1, the last block of a
    # token starting ROWS rows before D (its rows before its own not written). Thread p takes
    # (slot j, chunk c) = divmod(p, cpr), and p + blockDim, ...: the ROWS chunks' 16-byte loads
    # first, then x̂ of the chunk's 32 columns of act row t * k + j, then ROWS dots scaled by
    # weights[t, j]. Per row a warp sum, then thread r sums the warps in order and stores (or,
    # accumulate, adds) out[t, row r].
    # early (F <= 1024): the experts, the weights and W are no output of the kernel before (they
    # are the router's, two launches back or more, complete before that kernel passed its own wait
    # and let this one start), so a thread reads its (slot, chunk) and issues its W loads before
    # griddepcontrol.wait, overlapping the gate|up GEMV's tail. Those registers held across the
    # wait (up to 168) are why early builds are bounded to 256 threads. With those loads after the
    # wait instead, Qwen3-30B-A3B decoded 2.8% slower (docs/EXPERIMENTS.md, 'MoE decode').
    @cuda.jit(device=True, inline=True)
    def down_sum(parts, act, out, experts, weights, accumulate):
        D = out.shape[1]
        k = weights.shape[1]
        nb = (D + ROWS - 1) // ROWS
        t = cuda.blockIdx.x // nb
        first = (cuda.blockIdx.x - t * nb) * ROWS
        row0 = min(first, D - ROWS)
        tid = cuda.threadIdx.x
        acc = cuda.local.array(ROWS, float32)
        for r in range(ROWS):
            acc[r] = 0.0
        xw = cuda.local.array((1, 8), uint32)
        xf = cuda.local.array((1, 4), float32)
        if early:
            p = min(tid, k * cpr - 1)  # past the last (slot, chunk): loaded, not used
            j = p // cpr
            wj = weights[t, j]
            raws = rows_chunk(parts, (experts[t * k + j] * D + row0) * cpr + p - j * cpr)
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel (act's) has finished
            ptx.grid_dep_launch()
            if tid < k * cpr:  # x̂ of act row t * k + j's chunk c, then the ROWS dots
                c = p - j * cpr
                _quantize16(act, (t * k + j) * cols + col(c, 0), xw, xf, 0)
                _quantize16(act, (t * k + j) * cols + col(c, 1), xw, xf, 1)
                x_order(xw, 0)
                for r in range(ROWS):
                    acc[r] += wj * dot(prepare(raws[r]), c, xw, xf, 0)
        else:
            ptx.grid_dep_wait()
            ptx.grid_dep_launch()
            for p in range(tid, k * cpr, cuda.blockDim.x):
                j = p // cpr
                c = p - j * cpr
                s = t * k + j
                e = experts[s]
                wj = weights[t, j]
                _quantize16(act, s * cols + col(c, 0), xw, xf, 0)  # act's loads beside e's
                _quantize16(act, s * cols + col(c, 1), xw, xf, 1)
                x_order(xw, 0)
                raws = rows_chunk(parts, (e * D + row0) * cpr + c)  # chunk c of the expert's row row0 on
                for r in range(ROWS):
                    acc[r] += wj * dot(prepare(raws[r]), c, xw, xf, 0)
        red = cuda.shared.array((MAX_WARPS, ROWS), float32)
        lane = tid & 31
        warp = tid >> 5
        v = warp_sums_lanes(acc, ROWS)  # the ROWS sums at once: lane i holds row i >> SUM_SHIFT's
        if lane & ((1 << SUM_SHIFT) - 1) == 0:
            red[warp, lane >> SUM_SHIFT] = v
        cuda.syncthreads()
        if tid < ROWS and row0 + tid >= first:
            tot = float32(0.0)
            for i in range(cuda.blockDim.x >> 5):
                tot += red[i, tid]
            if accumulate:
                tot += out[t, row0 + tid]
            out[t, row0 + tid] = tot

    if tail:
        @cuda.jit
        def _down_sum_dp4a_tail_kernel(parts, act, out, experts, weights, accumulate, w_next, eps, q, d, s,
                                       counter):
            down_sum(parts, act, out, experts, weights, accumulate)
            quant_tail(out, w_next, eps, q, d, s, counter)

        return _down_sum_dp4a_tail_kernel

    @cuda.jit
    def _down_sum_dp4a_kernel(parts, act, out, experts, weights, accumulate):
        down_sum(parts, act, out, experts, weights, accumulate)

    return _down_sum_dp4a_kernel


def kernel_args(ggml_type: T, tail: bool = False) -> tuple:
    """parts, act, out, experts, weights, accumulate; with tail then w_next, eps, q, d, s, counter."""
    own = (dp4a_args(ggml_type)[0], F32_2D, F32_2D, types.Array(types.int32, 1, "C"), F32_2D, types.int32)
    if not tail:
        return own
    return own + (types.Array(types.float32, 1, "C"), types.float32, types.Array(types.uint32, 2, "C"),
                  F32_2D, F32_2D, types.Array(types.uint32, 1, "C"))


class NextInput(NamedTuple):
    """What experts_down_sum_dp4a's tail writes: RMSNorm(out) * w_next (w_next (D,) float32) in
    int8 into xq; counter (1,) uint32, zero between uses."""
    w_next: object
    eps: float
    xq: QuantX
    counter: object


def experts_down_sum_dp4a(w: PackedWeight, n_rows: int, act, out, experts, weights, stream,
                          accumulate: bool = False, next_input: NextInput | None = None):
    """As gemv_moe.experts_down_sum, on dp4a (w of a gemv_dp4a type, D >= ROWS, F a multiple of 32
    (256 for K-quants)): out (T, D) float32 = sum_j weights[t, j] W_e x̂[t * k + j], or out += that
    with accumulate; w: E experts of n_rows = D rows stacked, (E * D, F); act (T * k, F) float32;
    experts (T * k,) int32; weights (T, k) float32. Under programmatic launch, with F <= 1024,
    experts and weights are read before the wait: they must not come from the kernel just before.
    next_input (out the residual stream, accumulate on): the last block also writes the next
    layer's int8 input there (gemv_tail.quant_tail)."""
    n_tok, D = out.shape
    k = weights.shape[1]
    S, F = act.shape
    assert w.ggml_type in DOTS and F % GROUP == 0 and D >= ROWS
    assert 1 <= k <= MAX_K and S == n_tok * k and experts.shape == (S,) and weights.shape == (n_tok, k)
    assert w.cols == F and w.rows % n_rows == 0 and n_rows == D, (w.rows, w.cols, n_rows, act.shape, out.shape)
    assert act.dtype == np.float32 and act.is_c_contiguous() and aligned16(act)
    assert out.dtype == np.float32 and out.is_c_contiguous()
    assert experts.dtype == np.int32 and weights.dtype == np.float32 and weights.is_c_contiguous()
    block = min(32 * -(-(k * (F // 32)) // 32), MAX_BLOCK)
    grid = n_tok * -(-D // ROWS)
    if next_input is None:
        launch(down_sum_dp4a_kernel(w.ggml_type, F), grid, block, stream, w.parts, act, out, experts, weights,
               np.int32(accumulate))
        return
    xq = next_input.xq
    assert accumulate and D % GROUP == 0 and next_input.w_next.shape == (D,) and next_input.w_next.dtype == np.float32
    assert xq.q.shape == (n_tok, D // 4) and xq.d.shape == xq.s.shape == (n_tok, D // GROUP)
    assert next_input.counter.dtype == np.uint32 and next_input.counter.shape == (1,)
    launch(down_sum_dp4a_kernel(w.ggml_type, F, True), grid, block, stream, w.parts, act, out, experts, weights,
           np.int32(accumulate), next_input.w_next, np.float32(next_input.eps), xq.q, xq.d, xq.s, next_input.counter)


# Registers (sm_90a): see tests/test_kernel_build.py. Built at Qwen3-30B-A3B's F 768 (early, blocks
# of up to 256 threads) and at F 2304 (blocks of up to 512).
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(down_sum_dp4a_kernel(t, F), types.void(*kernel_args(t)), {"max_registers": bound})
                        for t in DOTS for F, bound in ((768, 192), (2304, 128))] + [
        # Gemma-4-26B-A4B's experts (704 columns: Q5_0 and Q8_0, the K-quants' fallbacks)
        (down_sum_dp4a_kernel(t, 704), types.void(*kernel_args(t)), {"max_registers": 192}) for t in (T.Q5_0, T.Q8_0)] + [
        # with the next layer's int8 input written by the last block (DOWN_QUANT_TAIL), Qwen3-30B-A3B's
        (down_sum_dp4a_kernel(t, 768, True), types.void(*kernel_args(t, True)), {"max_registers": 192})
        for t in (T.NVFP4, T.MXFP4, T.Q8_0, T.Q6_K, T.Q4_K)]
