"""After the Q|K|V GEMV, one kernel: per-head QK-norm (qwen3, gemma3), RoPE, and the fp16 write
of K and V into the paged cache; q stays float32 in place for attention.

Same math as rms_norm's warp kernel, _rope_kernel and _kv_write_kernel in turn (their numpy
twins rms_norm_ref, rope_ref, kv_write_ref are this kernel's reference).
"""

import math

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.kernels.attention.kv_cache import PAGE_SIZES
from impnb.kernels.common.warp import warp_sum, warp_sync
from impnb.kernels.attention.rope import SIN_COS_STACK, cos_sin, rotate_row_pair
from impnb.launch import launch

MAX_D = 256
LANE_COLS = MAX_D // 32  # a lane's columns of a head (its kernel: one warp a head)
HALF_D = MAX_D // 2
HEADS = 4  # heads (warps) a block: the row's rotation is worked out once for them


# grid (R, ceil((H + 2 Hkv) / HEADS)), block (32, HEADS): warp y takes head j = HEADS x + y of
# row t = blockIdx.x, a q head (j < H), a k head, or a v head (j >= H + 2 Hkv: none); row t is a
# token of sequence t // rows_per_seq, whose pages block_table's row lists. q and k heads are
# normalized when use_norm (x / rms(x) * w), rotated over their first 2 * inv_freq.shape[1] dims
# (NeoX pairs (i, i + n_rot/2) or adjacent pairs), and q is written back in place, k and v go to
# the cache as fp16. pos < 0 (padding) writes nothing.
# Before griddepcontrol.wait the block reads what the kernel before it cannot have written: pos
# and the block table (written before the step, or by kernels two launches back or more, which
# completed before the kernel before this one passed its own wait and let this one start), the
# norm weight, and works out the row's rotation once for its warps (a prompt chunk's row has
# H + 2 Hkv heads); lane l keeps columns l + 32 m.
# shared: cs, sn f32[MAX_D / 2] (the row's rotation), xs f32[HEADS, MAX_D] (a warp's head, normalized).
@cuda.jit
def _qkv_post_kernel(q, k, v, pos, inv_freq, neox, q_norm, k_norm, eps, use_norm, block_table,
                     rows_per_seq, k_pool, v_pool):
    t = cuda.blockIdx.x
    lane = cuda.threadIdx.x
    y = cuda.threadIdx.y
    j = cuda.blockIdx.y * HEADS + y
    H = q.shape[1]
    Hkv = k.shape[1]
    D = q.shape[2]
    half = inv_freq.shape[1]
    p = pos[t]
    page_size = k_pool.shape[1]
    page = block_table[t // rows_per_seq, p // page_size] if p >= 0 else -1
    off = p % page_size
    is_q = j < H
    cs = cuda.shared.array(HALF_D, types.float32)
    sn = cuda.shared.array(HALF_D, types.float32)
    for i in range(32 * y + lane, half, 32 * HEADS):
        cs[i], sn[i] = cos_sin(p, inv_freq, i)
    wv = cuda.local.array(LANE_COLS, types.float32)
    if j < H + Hkv:
        for m in range(LANE_COLS):
            d = lane + 32 * m
            wv[m] = (q_norm[d] if is_q else k_norm[d]) if use_norm and d < D else np.float32(1)
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    cuda.syncthreads()  # the rotation is in shared memory (every warp passes here)
    if j >= H + 2 * Hkv:
        return
    if j >= H + Hkv:  # a v head: straight to the cache, its loads all before its stores (v, v_pool may alias)
        h = j - H - Hkv
        if page >= 0:
            Dv = v.shape[2]
            vv = cuda.local.array(LANE_COLS, types.float32)
            for m in range(LANE_COLS):
                d = lane + 32 * m
                if d < Dv:
                    vv[m] = v[t, h, d]
            for m in range(LANE_COLS):
                d = lane + 32 * m
                if d < Dv:
                    v_pool[page, off, h, d] = types.float16(vv[m])
        return
    h = j if is_q else j - H
    xs = cuda.shared.array((HEADS, MAX_D), types.float32)
    acc = np.float32(0)
    for m in range(LANE_COLS):
        d = lane + 32 * m
        if d < D:
            x = q[t, h, d] if is_q else k[t, h, d]
            xs[y, d] = x
            acc += x * x
    if use_norm:
        inv = np.float32(1) / np.float32(math.sqrt(warp_sum(acc) / np.float32(D) + eps))
        for m in range(LANE_COLS):
            d = lane + 32 * m
            if d < D:
                xs[y, d] = xs[y, d] * inv * wv[m]
    warp_sync()
    for i in range(lane, half, 32):
        rotate_row_pair(xs, y, i, half, neox, cs[i], sn[i])
    warp_sync()
    for d in range(lane, D, 32):
        if is_q:
            q[t, h, d] = xs[y, d]
        elif page >= 0:
            k_pool[page, off, h, d] = types.float16(xs[y, d])


def qkv_post(q, k, v, pos, inv_freq, neox: bool, q_norm, k_norm, eps: float, block_table,
             k_pool, v_pool, stream) -> None:
    """q (R, H, D), k (R, Hkv, D), v (R, Hkv, Dv) float32, rows at pos (R,) int32: QK-norm with
    q_norm, k_norm (D,) float32 when given (else None), RoPE by inv_freq (rope_inv_freq), q in
    place, K and V to k_pool, v_pool (n_pages, page_size, Hkv, D) fp16 through block_table
    (B, max_pages) int32: the rows are B sequences' R / B tokens each, sequence by sequence.
    One sequence may pass block_table (max_pages,)."""
    R, H, D = q.shape
    Hkv = k.shape[1]
    if block_table.ndim == 1:
        block_table = block_table.reshape(1, block_table.size)
    for a, name in ((q, "q"), (k, "k"), (v, "v")):
        assert a.dtype == np.float32 and a.ndim == 3 and a.is_c_contiguous(), f"{name}: (R, H, D) float32"
    assert k.shape == (R, Hkv, D) and v.shape[:2] == (R, Hkv) and D <= MAX_D
    assert pos.dtype == np.int32 and pos.shape == (R,) and block_table.dtype == np.int32
    assert R % block_table.shape[0] == 0, f"{R} rows are not a whole number a sequence of {block_table.shape[0]}"
    assert k_pool.shape[1] in PAGE_SIZES and k_pool.shape[2:] == (Hkv, D)
    assert v_pool.shape[2:] == (Hkv, v.shape[2]) and v.shape[2] <= MAX_D and 2 * inv_freq.shape[1] <= D
    use_norm = q_norm is not None
    if use_norm:
        assert q_norm.shape == (D,) and k_norm.shape == (D,)
    else:
        q_norm = k_norm = inv_freq[0]  # unread
    if R:
        launch(_qkv_post_kernel, (R, -(-(H + 2 * Hkv) // HEADS)), (32, HEADS), stream, q, k, v, pos, inv_freq,
               np.int32(bool(neox)), q_norm, k_norm, np.float32(eps), np.int32(use_norm),
               block_table, np.int32(R // block_table.shape[0]), k_pool, v_pool)


_F3 = types.float32[:, :, ::1]
_F1 = types.float32[::1]
_H4 = types.float16[:, :, :, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_qkv_post_kernel, (_F3, _F3, _F3, types.int32[::1], types.float32[:, ::1], types.int32, _F1,
                            _F1, types.float32, types.int32, types.int32[:, ::1], types.int32, _H4, _H4),
         {"max_registers": 64, "ptx_contains": ("cvt.rn.f16.f32",), "stack_bytes": SIN_COS_STACK}),
    ]
