"""attention_wide's split kernel with the block's K/V widened once: tiles of TILE keys in float32 in
shared memory, read by every warp of the block (the query heads of one KV head).

attention_wide's own kernel has each of a block's g warps widen the same fp16 K and V words to
float32 (32 conversions a key a lane at head dim 512) and sum each key's score over the warp on
its own (5 shuffles a key): ~300 instructions a key a warp, which bound it, not memory. Here warp
w widens keys w, w + g, .. of a tile into shared memory once, the tile's raw words for the next
tile are loaded before the current tile is scored, and each warp scores the tile's keys with one
transposing butterfly (9 shuffles for 8 keys, every lane left with one key's score, then 8
broadcasts) and one online-softmax update a tile. Same arguments, outputs and partials as
attention_wide.attention_kernel; the merge is attention_wide's. Legend as attention_wide.py.
"""

from functools import lru_cache

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.attention.attention_decode import NEG
from impnb.kernels.attention.attention_wide_parts import wide_parts
from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.warp import WARP, shfl_idx, warp_sums_lanes

TILE = 8  # keys a tile: the transposing butterfly leaves lane l with key (l >> 2) & 7's score
_ZERO = np.float32(0)


MAX_WARPS = 16  # a block's warps at most: at 128 registers a thread, 16 warps fill an SM's 64K


def takes(g: int) -> bool:
    """Whether a block of g warps (query heads a KV head) splits a tile's keys evenly and fits an
    SM's registers (attention_wide falls back to its own kernel otherwise)."""
    return 1 <= g <= MAX_WARPS and (TILE % g == 0 or g % TILE == 0)


@lru_cache(maxsize=None)
def tiled_kernel(D: int, g: int):
    """The tiled split kernel for head dim D and g query heads a KV head (takes(g))."""
    assert D % 64 == 0 and D <= 512 and takes(g), (D, g)
    WPL = D // 64  # u32 words of K and of V a lane reads a key: word l + 32 w of the row
    DPL = 2 * WPL  # dims a lane owns: 2 (l + 32 w) + 0, 1
    KPW = max(1, TILE // g)  # keys of a tile a converting warp widens
    RAW = KPW * WPL  # raw words of K (and of V) a lane holds for the next tile

    row_word, key_range, load_q, finish = wide_parts(D)

    @cuda.jit(device=True, inline=True)
    def load_raw(kr, vr, k_words, v_words, block_table, key0, k1, shift, mask, Hkv, kh, warp, lane):
        # -- this warp's keys of the tile at key0 (warp w: keys w * KPW ..), raw; zeros past k1 --
        for u in range(KPW):
            key = key0 + warp * KPW + u
            if warp * KPW < TILE and key < k1:
                r = row_word(block_table, key, shift, mask, Hkv, kh, lane)
                for w in range(WPL):
                    kr[u * WPL + w] = k_words[r + WARP * w]
                    vr[u * WPL + w] = v_words[r + WARP * w]
            else:
                for w in range(WPL):
                    kr[u * WPL + w] = 0
                    vr[u * WPL + w] = 0

    # grid (S, T * Hkv), block (32, g): warp j of block (s, y = t * Hkv + kh) owns query row
    # (t, h = kh * g + j) and split s of its keys, as attention_wide's kernel. Per tile: the
    # block's barrier (the tile before is read), the raw words widened into ks / vs (f32
    # [TILE, D]), the barrier, the next tile's raw words on their way, then each warp's scores
    # (its lanes' partial dots of the TILE keys, the transposing butterfly, the broadcasts) and
    # its online-softmax update (base 2) over the tile, keys past k1 weighed 0.
    # k_words, v_words: the pools (n_pages, page_size, Hkv, D / 2) as flat u32; 1 << shift a page.
    def kernel(q, k_words, v_words, block_table, pos, out, partials, scale, window, shift, Hkv):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        ks = cuda.shared.array((TILE, D), types.float32)
        vs = cuda.shared.array((TILE, D), types.float32)
        split = cuda.blockIdx.x
        n_splits = cuda.gridDim.x
        t = cuda.blockIdx.y // Hkv
        kh = cuda.blockIdx.y - t * Hkv
        lane = cuda.threadIdx.x
        warp = cuda.threadIdx.y
        h = kh * g + warp
        k0, k1 = key_range(pos, t, window, split, n_splits)
        mask = (1 << shift) - 1
        qr = cuda.local.array(DPL, types.float32)
        acc = cuda.local.array(DPL, types.float32)
        load_q(q, t, h, lane, scale, qr, acc)
        m = NEG
        l = _ZERO
        kr = cuda.local.array(RAW, types.uint32)
        vr = cuda.local.array(RAW, types.uint32)
        sc = cuda.local.array(TILE, types.float32)
        load_raw(kr, vr, k_words, v_words, block_table, k0, k1, shift, mask, Hkv, kh, warp, lane)
        for key0 in range(k0, k1, TILE):
            cuda.syncthreads()  # -- the tile before is read: widen this one --
            if warp * KPW < TILE:
                for u in range(KPW):
                    j = warp * KPW + u
                    for w in range(WPL):
                        d = 2 * (lane + WARP * w)
                        ks[j, d] = qi.f16_to_f32(kr[u * WPL + w] & qi.HALF)
                        ks[j, d + 1] = qi.f16_to_f32(kr[u * WPL + w] >> 16)
                        vs[j, d] = qi.f16_to_f32(vr[u * WPL + w] & qi.HALF)
                        vs[j, d + 1] = qi.f16_to_f32(vr[u * WPL + w] >> 16)
            cuda.syncthreads()
            load_raw(kr, vr, k_words, v_words, block_table, key0 + TILE, k1, shift, mask, Hkv, kh, warp, lane)
            # -- the lane's partial dots, then their warp sums at once (warp_sums_lanes): lane l
            # holds key (l >> 2)'s score --
            for j in range(TILE):
                s = _ZERO
                for w in range(WPL):
                    d = 2 * (lane + WARP * w)
                    s += qr[2 * w] * ks[j, d] + qr[2 * w + 1] * ks[j, d + 1]
                sc[j] = s
            total = warp_sums_lanes(sc, TILE)
            # -- every lane gets the TILE scores (key j from lane 4 * j's group), keys past k1 out --
            m_new = m
            for j in range(TILE):
                src = ((j >> 2) & 1) * 16 + ((j >> 1) & 1) * 8 + (j & 1) * 4
                v = shfl_idx(total, src)
                sc[j] = v if key0 + j < k1 else NEG
                m_new = max(m_new, sc[j])
            a = ptx.ex2_approx_ftz(m - m_new)
            l *= a
            for i in range(DPL):
                acc[i] *= a
            for j in range(TILE):
                p = ptx.ex2_approx_ftz(sc[j] - m_new)  # keys past k1: 2^-inf, 0
                l += p
                for w in range(WPL):
                    d = 2 * (lane + WARP * w)
                    acc[2 * w] += p * vs[j, d]
                    acc[2 * w + 1] += p * vs[j, d + 1]
            m = m_new
        finish(out, partials, acc, m, l, split, n_splits, t, h, lane)

    kernel.__name__ = f"_attention_wide_tiled_d{D}_g{g}_kernel"
    return cuda.jit(kernel)
