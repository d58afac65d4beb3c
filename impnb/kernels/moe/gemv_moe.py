"""The routed experts' down projection at decode with their weighted sum fused in:

  out[t, n] (+)= sum_j weights[t, j] * (W_e act[t * k + j])[n]      e = experts[t * k + j], j < k

with accumulate, added into out (the residual stream x: the next layer's GEMVs read RMSNorm(x)
themselves). One kernel for what was the expert GEMV, moe_combine and a residual add.
Reference: moe.combine_ref of gemv.gemv_ref per slot (the sum in slot order j = 0 .. k-1).
Legend: T tokens, k experts a token (<= 8), D output rows of an expert, F its input width.
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, types

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemv.gemv import F32_2D, aligned16, parts_type, tuple_of
from impnb.kernels.gemv.gemv_units import DECODERS
from impnb.kernels.gemv.gemv_variants import FOUR_ROW_TYPES
from impnb.kernels.moe.moe import MAX_K
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch

WARPS = 4
BLOCK = 32 * WARPS
SLOTS = MAX_K // WARPS  # slots a warp: warp w takes j = w and j = w + 4
PARTS = SLOTS * WARPS


def rows_for(ggml_type: T) -> int:
    """Output rows a block, so that a thread's 2 R chunks in flight fit its registers: 4 for the
    4-bit and 8-bit blocks, 2 for the 5/6-bit ones and F16 (16 words a chunk), 1 for F32 (32)."""
    return 1 if ggml_type == T.F32 else 2 if ggml_type == T.F16 else 4 if ggml_type in FOUR_ROW_TYPES else 2


@lru_cache(maxsize=None)
def down_sum_kernel(ggml_type: T):
    """The kernel for one weight type."""
    load, unit, col = DECODERS[T(ggml_type)]
    R = rows_for(T(ggml_type))

    @cuda.jit(device=True, inline=True)
    def slot_chunk(a, c, i):
        # -- chunk c of row r of slot (i // R)'s expert; a = (parts, e0, e1, first row, D, cpr) --
        parts, e0, e1, row0, D, cpr = a
        e = e0 if i < R else e1
        return load(parts, (e * D + min(row0 + i % R, D - 1)) * cpr + c)

    chunks = tuple_of(slot_chunk, SLOTS * R)

    # grid (T * ceil(D / R),), block 128: block b is token t = b // ceil(D / R), rows R * (b mod
    # ceil(D / R)) .. +R-1 (past D: clamped, computed, dropped). Warp w takes the slots j = w and
    # w + 4 (past k: clamped to k - 1, weight 0), lane c the chunks c, c + 32, ... of every row:
    # the 2 R 16-byte loads of a step first, then per slot and half chunk x[s] (float4 loads
    # through L1) times each row. Per (slot, row) a warp sum into shared part[j, r]; thread r sums
    # weights[t, j] * part[j, r] over j in order and stores (accumulate: adds) it to out[t, row].
    @cuda.jit
    def _down_sum_kernel(parts, act, out, experts, weights, accumulate):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        D = out.shape[1]
        F = act.shape[1]
        cpr = F // 32
        k = weights.shape[1]
        nb = (D + R - 1) // R
        t = cuda.blockIdx.x // nb
        row0 = (cuda.blockIdx.x - t * nb) * R
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        s0 = t * k + min(warp, k - 1)
        s1 = t * k + min(warp + WARPS, k - 1)
        acc = cuda.local.array((SLOTS, R), float32)
        for i in range(SLOTS):
            for r in range(R):
                acc[i, r] = 0.0
        xv = cuda.local.array(16, float32)
        wv = cuda.local.array(16, float32)
        a = (parts, experts[s0], experts[s1], row0, D, cpr)
        for c in range(lane, cpr, 32):
            raws = chunks(a, c)
            for i in range(SLOTS):
                xo = (s0 if i == 0 else s1) * F
                for hh in range(2):
                    kc = col(c, hh)
                    sx = float32(0.0)
                    for v in range(4):
                        x0, x1, x2, x3 = qi.ldg_f32x4(act, xo + kc + 4 * v)
                        xv[4 * v] = x0
                        xv[4 * v + 1] = x1
                        xv[4 * v + 2] = x2
                        xv[4 * v + 3] = x3
                        sx += (x0 + x1) + (x2 + x3)
                    for r in range(R):
                        ua, ub = unit(raws[i * R + r], c, hh, wv)
                        p = float32(0.0)
                        for q in range(16):
                            p += wv[q] * xv[q]
                        acc[i, r] += ua * p + ub * sx
        # -- per (slot, row) over the warp, then the weighted sum over the slots in order --
        scratch = cuda.shared.array(BLOCK, float32)
        part = cuda.shared.array((PARTS, R), float32)
        for i in range(SLOTS):
            for r in range(R):
                v = qi.warp_sum(acc[i, r], scratch)
                if lane == 0:
                    part[warp + WARPS * i, r] = v
        cuda.syncthreads()
        if tid < R and row0 + tid < D:
            tot = float32(0.0)
            for j in range(k):
                tot += weights[t, j] * part[j, tid]
            if accumulate:
                tot += out[t, row0 + tid]
            out[t, row0 + tid] = tot

    return _down_sum_kernel


def kernel_args(ggml_type: T) -> tuple:
    """parts, act, out, experts, weights, accumulate."""
    return (parts_type(ggml_type), F32_2D, F32_2D, types.Array(types.int32, 1, "C"), F32_2D, types.int32)


def experts_down_sum(w: PackedWeight, n_rows: int, act, out, experts, weights, stream, accumulate: bool = False):
    """out (T, D) float32 = sum_j weights[t, j] * W_e act[t * k + j] (e = experts[t * k + j]), or
    out += that with accumulate; w: E experts of n_rows = D rows stacked, (E * D, F); act (T * k, F)
    float32; experts (T * k,) int32; weights (T, k) float32."""
    n_tok, D = out.shape
    k = weights.shape[1]
    S, F = act.shape
    assert 1 <= k <= MAX_K and S == n_tok * k and experts.shape == (S,) and weights.shape == (n_tok, k)
    assert w.cols == F and w.rows % n_rows == 0 and n_rows == D, (w.rows, w.cols, n_rows, act.shape, out.shape)
    assert act.dtype == np.float32 and act.is_c_contiguous() and aligned16(act)
    assert out.dtype == np.float32 and out.is_c_contiguous()
    assert experts.dtype == np.int32 and weights.dtype == np.float32 and weights.is_c_contiguous()
    grid = n_tok * -(-D // rows_for(w.ggml_type))
    launch(down_sum_kernel(w.ggml_type), grid, BLOCK, stream, w.parts, act, out, experts, weights,
           np.int32(accumulate))


# Registers (sm_90a): see tests/test_kernel_build.py.
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (down_sum_kernel(t), types.void(*kernel_args(t)), {})
        for t in (T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_K, T.Q5_0, T.Q4_0, T.Q4_1, T.F16, T.F32)
    ]
