"""attn_output's dp4a GEMV with the qwen3moe router folded in: one decode launch for two.

The router reads h = RMSNorm(x') * wn of x' = x + W_o a, the residual after attn_output (a the
attention output). Its logits are linear in x and a but for the norm's scale:
    W_r h = (Wx x + Wa a) / rms(x'),   Wx = W_r diag(wn) (E, D),   Wa = Wx W_o (E, H Dv)
(fold_ref, once at load, in fp16: see Fold), and x and a are both final before the kernel starts.
So E blocks beside the GEMV's make z = Wx x + Wa a (the x half before griddepcontrol.wait), and
the grid's last block, once x' is whole, takes 1 / rms(x'), writes h in int8 for the dp4a
experts (quant_x.store_group) and weighs at that scale (moe.weigh) the experts that the last of
the router blocks chose on z (moe.route_block; z's order is z / rms(x')'s but for rounding). The
GEMV writes x' = x + W_o â out of place (y): the router's blocks read x while it runs, so the
caller alternates two residual buffers.
Numpy reference: router_fold_ref.
"""

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, types, uint32

from impnb import tuning
from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemv.gemv_dp4a import MAX_T, NO_GLU, dp4a_block_fns, gemv_dp4a_ref
from impnb.kernels.gemv.gemv_dp4a import kernel_args as dp4a_args
from impnb.kernels.gemv.gemv_dp4a_units import DOTS
from impnb.kernels.gemv.gemv_dp4a_variants import choose_measured
from impnb.kernels.gemv.gemv_tail import last_block, last_of
from impnb.kernels.gemv.gemv_variants import BLOCK, Variant
from impnb.kernels.moe.moe import MAX_EXPERTS, MAX_K, route_block, weigh
from impnb.kernels.common.warp import block_sum, shfl_idx
from impnb.kernels.gemv.quant_x import GROUP, WORDS, QuantX, scale4, store_group
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch


# The folded weights are fp16 (half of fp32's bytes: 1.5 MB a layer on Qwen3-30B-A3B, read before
# the wait beside decode attention). Their rounding (2^-11 of a weight) is far under that of the
# int8 â attn_output's half reads (2^-8 of a group's largest); the sums stay fp32. fp16 decodes
# about 0.7% faster than fp32 on Qwen3-30B-A3B (docs/EXPERIMENTS.md, 'MoE decode').
class Fold(NamedTuple):
    wx: object  # (E, D) float16: W_r diag(wn)
    wa: object  # (E, H Dv) float16: Wx W_o


def fold_ref(w_r: np.ndarray, wn: np.ndarray, w_o: np.ndarray) -> Fold:
    """The folded router weights (numpy float16, rounded from float32 products; see Fold) from
    W_r (E, D), the norm weight wn (D,) and attn_output's W_o (D, H Dv) dequantized."""
    wx = np.asarray(w_r, np.float32) * np.asarray(wn, np.float32)
    return Fold(wx.astype(np.float16), (wx @ np.asarray(w_o, np.float32)).astype(np.float16))


def router_fold_ref(w_o: np.ndarray, ggml_type: T, aq: tuple, a: np.ndarray, x: np.ndarray, fold: Fold) -> tuple:
    """The kernel's two sums in float64: x' = x + W_o â (gemv_dp4a_ref of the raw GGUF rows w_o
    and aq = (q, d), a's int8 form) and z = Wx x + Wa a. The experts, weights and h follow from
    them as route_ref of z / rms(x') and RMSNorm(x') * wn."""
    y = x.astype(np.float64) + gemv_dp4a_ref(w_o, ggml_type, *aq)
    z = x.astype(np.float64) @ fold.wx.T.astype(np.float64) + a.astype(np.float64) @ fold.wa.T.astype(np.float64)
    return y, z


# The GEMV half's dp4a variant at T = 1 and K < LONG_K, by type (choose_measured; impnb/tuning);
# elsewhere choose_dp4a's. Its blocks issue their first weight loads after griddepcontrol.wait, not
# before as gemv_dp4a's do: under programmatic launch those loads would crowd decode attention,
# the kernel before.
FOLD_T1 = {t: Variant(*v) for t, v in tuning.FOLD_T1.items()}


@lru_cache(maxsize=None)
def fold_kernel(ggml_type: T, cols: int, n_tok: int, v: Variant):
    """The kernel for attn_output's type, row length (H Dv), T and dp4a variant."""
    group_start, rows_times_x = dp4a_block_fns(T(ggml_type), cols, n_tok, v.span, v.rows, v.unroll)
    a_steps = -(-cols // (8 * BLOCK))  # 8-half steps of a row of Wa a thread
    wr_len = 4 * a_steps  # its words (half pairs)

    @cuda.jit(device=True, inline=True)
    def halves8(u0, u1, u2, u3, w):
        # -- the 8 halves of 4 words into floats w[0:8] --
        qi.halves2(u0, w, 0)
        qi.halves2(u1, w, 2)
        qi.halves2(u2, w, 4)
        qi.halves2(u3, w, 6)

    @cuda.jit(device=True, inline=True)
    def dot8(w, v, t, c):
        # -- w[0:8] . v[t, c:c+8] --
        v0, v1, v2, v3 = qi.ldg_f32x4(v, t * v.shape[1] + c)
        v4, v5, v6, v7 = qi.ldg_f32x4(v, t * v.shape[1] + c + 4)
        return ((w[0] * v0 + w[1] * v1) + (w[2] * v2 + w[3] * v3)) + ((w[4] * v4 + w[5] * v5) + (w[6] * v6 + w[7] * v7))

    @cuda.jit(device=True, inline=True)
    def router_row(x, a, wx, wa, z, e):
        # -- z[t, e] = Wx[e] . x[t] + Wa[e] . a[t] for every token (Wx, Wa fp16 as half-pair words);
        # x and Wa are no output of the kernel before (x is the layer's input, three launches back):
        # the x half and the loads of the thread's part of Wa[e] go before the wait --
        tid = cuda.threadIdx.x
        D = x.shape[1]
        wr = cuda.local.array(wr_len, uint32)
        for i in range(a_steps):  # past the row's end: zeros (no branch around a's loads below)
            c = 8 * (tid + BLOCK * i)
            w_at = (e * cols + min(c, cols - 8)) // 2  # words: half pairs
            wr[4 * i], wr[4 * i + 1], wr[4 * i + 2], wr[4 * i + 3] = qi.ldg_u32x4(wa, w_at)
            if c >= cols:
                for j in range(4):
                    wr[4 * i + j] = 0
        w8 = cuda.local.array(8, float32)
        acc = cuda.local.array(n_tok, float32)
        for t in range(n_tok):
            acc[t] = 0.0
        for c in range(8 * tid, D, 8 * BLOCK):
            u0, u1, u2, u3 = qi.ldg_u32x4(wx, (e * D + c) // 2)
            halves8(u0, u1, u2, u3, w8)
            for t in range(n_tok):
                acc[t] += dot8(w8, x, t, c)
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel (a's) has finished
        ptx.grid_dep_launch()
        for i in range(a_steps):
            halves8(wr[4 * i], wr[4 * i + 1], wr[4 * i + 2], wr[4 * i + 3], w8)
            for t in range(n_tok):
                acc[t] += dot8(w8, a, t, min(8 * (tid + BLOCK * i), cols - 8))
        red = cuda.shared.array(32, float32)
        for t in range(n_tok):
            total = block_sum(acc[t], red)
            if tid == 0:
                z[t, e] = total

    @cuda.jit(device=True, inline=True)
    def fold_tail(y, wn, eps, z, k, normalize, weights, q, d, s):
        # -- the last block: per token 1 / rms(x'), h's int8 groups (a thread a group), the
        # weights of the router's choices at that scale; x' and z through L2 (other blocks
        # wrote them). A thread's first group stays in registers from the sum of squares on. --
        tid = cuda.threadIdx.x
        D = y.shape[1]
        red = cuda.shared.array(32, float32)
        v = cuda.local.array(GROUP, float32)
        for t in range(n_tok):
            # the choices' logits, left in weights by the router's last block (weighed below)
            mine = ptx.ld_global_cg_f32(weights, t * k + min(tid & 31, k - 1))
            ss = float32(0.0)
            if tid < D // GROUP:
                for j in range(WORDS):
                    c = GROUP * tid + 4 * j
                    v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3] = ptx.ld_global_cg_v4_f32(y, t * D + c)
                for j in range(GROUP):
                    ss += v[j] * v[j]
            for c in range(GROUP * BLOCK + 4 * tid, D, 4 * BLOCK):  # D past BLOCK groups
                y0, y1, y2, y3 = ptx.ld_global_cg_v4_f32(y, t * D + c)
                ss += (y0 * y0 + y1 * y1) + (y2 * y2 + y3 * y3)
            inv = float32(1.0) / math.sqrt(block_sum(ss, red) / float32(D) + eps)
            for g in range(tid, D // GROUP, BLOCK):
                for j in range(WORDS):
                    c = GROUP * g + 4 * j
                    if g != tid:
                        v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3] = ptx.ld_global_cg_v4_f32(y, t * D + c)
                    scale4(v, j, inv, wn, c)
                store_group(v, q, d, s, t, g)
            if tid < 32:
                mine = mine * inv
                weigh(mine, shfl_idx(mine, 0), t, z.shape[1], k, normalize, z, inv, weights)

    # grid (GEMV blocks + E,), block BLOCK: the dp4a GEMV's blocks (y = x + W_o â), then a block
    # a router row, the last of those to finish choosing each token's experts on z (the order of
    # z / rms(x') but for rounding: the scale is positive); the last block of all runs fold_tail.
    # counter: the grid's ticket, then the router blocks'.
    @cuda.jit
    def _router_fold_kernel(parts, xq, xd, xs, y, n_rows, x, a, wx, wa, z, wn, eps, k, normalize, experts,
                            weights, counter, q, d, s):
        E = wx.shape[0]
        n_gemv = cuda.gridDim.x - E
        if cuda.blockIdx.x < n_gemv:
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
            start = group_start(parts, n_rows, 0)  # after the wait: see FOLD_T1
            rows_times_x(start, xq, xd, xs, y, n_rows, 1, 0, 0, x)
        else:
            router_row(x, a, wx, wa, z, cuda.blockIdx.x - n_gemv)
            if last_of(counter[1:], uint32(E)):
                keys = cuda.shared.array(MAX_EXPERTS, uint32)
                vals = cuda.shared.array(MAX_K, float32)
                for t in range(n_tok):
                    route_block(z, t, E, k, normalize, experts, weights, keys, vals, 1)
        if last_block(counter[:1]):
            fold_tail(y, wn, eps, z, k, normalize, weights, q, d, s)

    return _router_fold_kernel


def router_fold(w: PackedWeight, aq: QuantX, a, x, y, fold: Fold, norm: tuple, z, k: int, normalize: bool,
                experts, weights, counter, hq: QuantX, stream) -> None:
    """attn_output then the router in one launch: y (T, D) = x + W â (â = aq, the int8 form of a
    (T, H Dv) float32 that decode attention writes beside it); z (T, E) = Wx x + Wa a (fold's
    float16 weights, fp32 sums; K a multiple of 8); then
    experts (T, k) int32 and weights (T, k) float32 = moe.route_ref of the logits z / rms(y) with
    `normalize`, and hq = the int8 form of RMSNorm(y) * wn (norm = (wn, eps)) for the dp4a experts.
    y must not be x. counter (2,) uint32, zero between uses."""
    n_tok, D = x.shape
    E, K = fold.wa.shape
    wn, eps = norm
    assert w.ggml_type in DOTS and w.rows == D and w.cols == K and 1 <= n_tok <= MAX_T
    assert y.shape == x.shape and a.shape == (n_tok, K) and fold.wx.shape == (E, D) and z.shape == (n_tok, E)
    assert y is not x, "y is written while x is read"
    assert D % GROUP == 0 and K % 8 == 0 and wn.shape == (D,) and E <= MAX_EXPERTS and 1 <= k <= min(MAX_K, E)
    assert aq.q.shape[1] == K // 4 and aq.q.shape[0] >= n_tok and hq.q.shape[1] == D // 4 and hq.q.shape[0] >= n_tok
    assert experts.shape == weights.shape == (n_tok, k) and experts.dtype == np.int32
    assert counter.dtype == np.uint32 and counter.shape == (2,)
    for arr in (x, y, a, z, wn, weights):
        assert arr.dtype == np.float32 and arr.is_c_contiguous()
    assert fold.wx.dtype == fold.wa.dtype == np.float16 and fold.wx.is_c_contiguous() and fold.wa.is_c_contiguous()
    v = choose_measured(FOLD_T1, w.ggml_type, n_tok, K, NO_GLU, D)
    per_block = v.rows * (BLOCK // v.span)
    launch(fold_kernel(w.ggml_type, K, n_tok, v), (-(-D // per_block) + E,), BLOCK, stream,
           w.parts, aq.q[:n_tok], aq.d[:n_tok], aq.s[:n_tok], y, np.int32(D), x, a,
           fold.wx.view(np.uint32), fold.wa.view(np.uint32), z, wn,
           np.float32(eps), np.int32(k), np.int32(normalize), experts, weights, counter,
           hq.q[:n_tok], hq.d[:n_tok], hq.s[:n_tok])


def kernel_args(ggml_type: T) -> tuple:
    """parts, xq, xd, xs, y, n_rows (gemv_dp4a's, less accumulate), x, a, wx, wa, z, wn, eps, k,
    normalize, experts, weights, counter, q, d, s."""
    f2 = types.Array(types.float32, 2, "C")
    i32 = types.int32
    u2 = types.Array(types.uint32, 2, "C")  # Wx, Wa: fp16 pairs
    return (*dp4a_args(ggml_type)[:6], f2, f2, u2, u2, f2, types.Array(types.float32, 1, "C"), types.float32,
            i32, i32, types.Array(types.int32, 2, "C"), f2, types.Array(types.uint32, 1, "C"),
            types.Array(types.uint32, 2, "C"), f2, f2)


# Built at Qwen3-30B-A3B's attn_output (2048 x 4096) for T 1 and 8: 84 registers (Q4_K, T 1) to 132
# (the dp4a blocks' own at 8 rows a group: 125-127).
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(fold_kernel(t, 4096, n, choose_measured(FOLD_T1, t, n, 4096, NO_GLU, 2048)),
                          types.void(*kernel_args(t)),
                         {"max_registers": 136})
                        for t in (T.Q4_K, T.Q8_0, T.Q6_K, T.MXFP4, T.NVFP4) for n in (1, 8)]
