"""Attention over the paged fp16 KV cache at head dims past the decode kernels' (HEAD_DIMS: Gemma
4's global layers, 512), for decode steps: one warp a query row, its keys split over n_splits
blocks, then (n_splits > 1) a merge kernel. It takes prompt chunks too, as one split, but models
send those to attention_fa2 (blocks in output-dim slices at 512). One sequence. Query row (t, h) at
pos[t] sees keys k <= pos[t] with pos[t] - k < window; rows at pos < 0 (padding) see none and
write zeros. Everything that moves per step is read from `pos` on the device, so a captured graph
stays valid as the context grows. Numpy reference: attention.attention_ref.
Legend: T query rows, H heads, Hkv KV heads (g = H / Hkv a group), D head dim, S splits.
"""

from functools import lru_cache

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.attention import attention_wide_tiled
from impnb.kernels.attention.attention_decode import NEG
from impnb.kernels.attention.attention_wide_parts import wide_parts
from impnb.kernels.attention.kv_cache import PAGE_SIZES
from impnb.kernels.common.warp import WARP, warp_max, warp_sum
from impnb.launch import launch

HEAD_DIMS = (512,)  # the head dims models route here (the kernel takes any multiple of 64 up to 512)
MAX_SPLITS = 128
MIN_KEYS = 32  # keys a decode split takes at least
MERGE_WARPS = 4  # warps of a merge block: MERGE_WARPS * 32 threads, one a split for the weights
MERGE_UNROLL = 4  # splits a merge lane has in flight
assert MAX_SPLITS <= MERGE_WARPS * WARP
_ZERO = np.float32(0)


@lru_cache(maxsize=None)
def attention_kernel(D: int):
    """The split kernel for head dim D."""
    assert D % 64 == 0 and D <= 512, D
    WPL = D // 64  # u32 words (fp16 pairs) of K and of V a lane reads per key
    DPL = 2 * WPL  # dims a lane owns (attention_wide_parts)

    row_word, key_range, load_q, finish = wide_parts(D)

    # grid (S, T * Hkv), block (32, g): warp j of block (s, y = t * Hkv + kh) owns query row
    # (t, h = kh * g + j) and split s of its keys. Per key the lane dots its DPL dims of q (in
    # registers, pre-scaled by scale * log2 e) with K, the warp's butterfly sums the score into
    # every lane, and an online softmax (base 2) weighs V into the lane's DPL accumulators. A
    # warp's load of word w of a row takes 128 contiguous bytes (lane-strided words: one L1
    # wavefront, where words of a lane side by side took 8). The g warps of a block read the
    # same K/V rows (L1); a lane's K and V words of the next key are loaded before the current
    # key's dot and update (one memory round trip a key otherwise). No shared memory.
    # S = 1: out[t, h] = acc / l; else partials[s, t, h] = (acc, m, l) for attention_merge.
    # k_words, v_words: the pools (n_pages, page_size, Hkv, D / 2) as flat u32; 1 << shift a page.
    def kernel(q, k_words, v_words, block_table, pos, out, partials, scale, window, shift, Hkv):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        split = cuda.blockIdx.x
        n_splits = cuda.gridDim.x
        t = cuda.blockIdx.y // Hkv
        kh = cuda.blockIdx.y - t * Hkv
        lane = cuda.threadIdx.x
        h = kh * cuda.blockDim.y + cuda.threadIdx.y
        k0, k1 = key_range(pos, t, window, split, n_splits)
        mask = (1 << shift) - 1
        qr = cuda.local.array(DPL, types.float32)  # this lane's dims of the query row, times scale * log2 e
        acc = cuda.local.array(DPL, types.float32)
        load_q(q, t, h, lane, scale, qr, acc)
        m = NEG
        l = _ZERO
        kc = cuda.local.array(WPL, types.uint32)  # the current key's K, V words, then the next's
        vc = cuda.local.array(WPL, types.uint32)
        kn = cuda.local.array(WPL, types.uint32)
        vn = cuda.local.array(WPL, types.uint32)
        if k0 < k1:
            r = row_word(block_table, k0, shift, mask, Hkv, kh, lane)
            for w in range(WPL):
                kn[w] = k_words[r + WARP * w]
                vn[w] = v_words[r + WARP * w]
        for key in range(k0, k1):
            for w in range(WPL):
                kc[w] = kn[w]
                vc[w] = vn[w]
            if key + 1 < k1:  # -- the next key's words on their way --
                r = row_word(block_table, key + 1, shift, mask, Hkv, kh, lane)
                for w in range(WPL):
                    kn[w] = k_words[r + WARP * w]
                    vn[w] = v_words[r + WARP * w]
            # -- score: the lane's partial dot, summed over the warp --
            s = _ZERO
            for w in range(WPL):
                s += qr[2 * w] * qi.f16_to_f32(kc[w] & qi.HALF) + qr[2 * w + 1] * qi.f16_to_f32(kc[w] >> 16)
            s = warp_sum(s)
            # -- online softmax: rescale the accumulators, add p * V --
            m_new = max(m, s)
            a = ptx.ex2_approx_ftz(m - m_new)
            p = ptx.ex2_approx_ftz(s - m_new)
            l = l * a + p
            for w in range(WPL):
                acc[2 * w] = acc[2 * w] * a + p * qi.f16_to_f32(vc[w] & qi.HALF)
                acc[2 * w + 1] = acc[2 * w + 1] * a + p * qi.f16_to_f32(vc[w] >> 16)
            m = m_new
        finish(out, partials, acc, m, l, split, n_splits, t, h, lane)

    kernel.__name__ = f"_attention_wide_d{D}_kernel"
    return cuda.jit(kernel)


# grid (T * H, D / 32), block (32, MERGE_WARPS): block (r, c) merges dims 32 c .. 32 c + 31 of query
# row (t, h) = divmod(r, H) over the S splits of partials (acc, m, l). Thread i < S first takes
# split i's weight 2^(m_i - max m) (block max and sum through shared memory); then lane j of warp
# w sums the weighted acc of dim 32 c + j over splits w, w + MERGE_WARPS, .. (MERGE_UNROLL loads
# in flight), and warp 0 adds the warps' sums. shared: wts f32[MAX_SPLITS], red f32[WARPS, 32].
@cuda.jit
def _attention_merge_kernel(partials, out):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    S = partials.shape[0]
    H = out.shape[1]
    D = out.shape[2]
    t = cuda.blockIdx.x // H
    h = cuda.blockIdx.x - t * H
    lane = cuda.threadIdx.x
    warp = cuda.threadIdx.y
    tid = warp * WARP + lane
    wts = cuda.shared.array(MAX_SPLITS, types.float32)
    red = cuda.shared.array((MERGE_WARPS, WARP), types.float32)
    # -- each split's weight: its max against the block's, then the denominator --
    m_i = partials[tid, t, h, D] if tid < S else NEG
    mx = warp_max(m_i)
    if lane == 0:
        red[warp, 0] = mx
    cuda.syncthreads()
    for w in range(MERGE_WARPS):
        mx = max(mx, red[w, 0])
    w_i = ptx.ex2_approx_ftz(m_i - mx) if tid < S else _ZERO
    wts[tid] = w_i
    den = warp_sum(w_i * partials[tid, t, h, D + 1] if tid < S else _ZERO)
    cuda.syncthreads()
    if lane == 0:
        red[warp, 1] = den
    cuda.syncthreads()
    den = _ZERO
    for w in range(MERGE_WARPS):
        den += red[w, 1]
    cuda.syncthreads()  # red is reused below
    # -- the weighted sum of dim d over the warp's splits --
    d = cuda.blockIdx.y * WARP + lane
    acc = cuda.local.array(MERGE_UNROLL, types.float32)
    for u in range(MERGE_UNROLL):
        acc[u] = _ZERO
    for s0 in range(warp, S, MERGE_WARPS * MERGE_UNROLL):
        for u in range(MERGE_UNROLL):
            s = s0 + u * MERGE_WARPS
            if s < S:
                acc[u] += wts[s] * partials[s, t, h, d]
    total = _ZERO
    for u in range(MERGE_UNROLL):
        total += acc[u]
    red[warp, lane] = total
    cuda.syncthreads()
    if warp == 0:
        num = _ZERO
        for w in range(MERGE_WARPS):
            num += red[w, lane]
        out[t, h, d] = num * (np.float32(1) / den) if den > _ZERO else _ZERO


def num_splits(ctx_bucket: int, n_head_kv: int, T: int, window: int | None = None, n_sm: int = 132) -> int:
    """Decode splits for contexts up to ctx_bucket (or its window): about two blocks an SM, at
    least MIN_KEYS keys a split, at most MAX_SPLITS."""
    keys = min(ctx_bucket, window + T - 1) if window else ctx_bucket
    return max(1, min(-(-2 * n_sm // (T * n_head_kv)), keys // MIN_KEYS, MAX_SPLITS))


def partials_shape(n_splits: int, T: int, n_head: int, head_dim: int) -> tuple:
    """(S, T, H, D + 2) float32 scratch: acc, then m and l."""
    return n_splits, T, n_head, head_dim + 2


def attention_wide(q, k_pool, v_pool, block_table, pos, out, partials, n_splits: int, scale: float,
                   window: int | None, stream, tiled: bool = False) -> None:
    """out (T, H, D) = attention of q (T, H, D) float32 at pos (T,) int32 over the paged fp16 cache
    k_pool, v_pool (n_pages, page_size, Hkv, D) through block_table (max_pages,) or (1, max_pages)
    int32, the queries' own K/V already written; partials (partials_shape, at least n_splits
    splits) float32 scratch, unread when n_splits is 1; tiled: the split kernel of
    attention_wide_tiled (K/V widened once a block) where it takes the head grouping."""
    T, H, D = q.shape
    Hkv = k_pool.shape[2]
    if block_table.ndim == 1:
        block_table = block_table.reshape(1, block_table.size)
    for a, dt, name in ((q, np.float32, "q"), (out, np.float32, "out"), (k_pool, np.float16, "k_pool"),
                        (v_pool, np.float16, "v_pool"), (block_table, np.int32, "block_table"),
                        (pos, np.int32, "pos"), (partials, np.float32, "partials")):
        assert a.dtype == dt and a.is_c_contiguous(), f"{name}: C-contiguous {np.dtype(dt)}"
    assert out.shape == q.shape and pos.shape == (T,) and block_table.shape[0] == 1
    assert k_pool.shape[3] == D and v_pool.shape == k_pool.shape and k_pool.shape[1] in PAGE_SIZES
    assert H % Hkv == 0 and H // Hkv <= 32 and 1 <= n_splits <= MAX_SPLITS
    assert window is None or window > 0, "window must be None or positive"
    assert n_splits == 1 or (partials.shape[0] >= n_splits and partials.shape[1:] == (T, H, D + 2)), partials.shape
    if T == 0:
        return
    g = H // Hkv
    kernel = attention_wide_tiled.tiled_kernel(D, g) if tiled and attention_wide_tiled.takes(g) else attention_kernel(D)
    launch(kernel, (n_splits, T * Hkv), (WARP, g), stream, q,
           k_pool.view(np.uint32).reshape(-1), v_pool.view(np.uint32).reshape(-1), block_table, pos, out, partials,
           np.float32(scale), np.int32(window or 0), np.int32(k_pool.shape[1].bit_length() - 1), np.int32(Hkv))
    if n_splits > 1:
        merge_splits(partials, out, n_splits, stream)


def merge_splits(partials, out, n_splits: int, stream) -> None:
    """out (T, H, D) = the merge of the first n_splits parts of partials (S, T, H, D + 2): each
    split's unnormalised output, then its rows' max m (log2 units) and sum l."""
    T, H, D = out.shape
    launch(_attention_merge_kernel, (T * H, D // WARP), (WARP, MERGE_WARPS), stream, partials[:n_splits], out)


_Q = types.float32[:, :, ::1]
_POOL = types.uint32[::1]
_PART = types.float32[:, :, :, ::1]
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    return [
        (attention_kernel(D), (_Q, _POOL, _POOL, types.int32[:, ::1], types.int32[::1], _Q, _PART, types.float32,
                               types.int32, types.int32, types.int32), {"max_registers": 128})
        for D in HEAD_DIMS
    ] + [
        (attention_wide_tiled.tiled_kernel(D, 8), (_Q, _POOL, _POOL, types.int32[:, ::1], types.int32[::1], _Q, _PART,
                                                   types.float32, types.int32, types.int32, types.int32),
         {"max_registers": 128})
        for D in HEAD_DIMS  # Gemma 4's 16 heads on 2 KV heads
    ] + [(_attention_merge_kernel, (_PART, _Q), {"max_registers": 64})]
