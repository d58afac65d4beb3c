"""The device functions attention_wide's split kernels share (attention_wide.py, attention_wide_tiled.py):
a key's row in the flat pools, a split's keys, the query row in registers, the split's output.

A lane owns word l + 32 w (w < D / 64) of every K / V row, dims 2 (l + 32 w) + 0, 1, so a warp's
load of word w takes 128 contiguous bytes.
"""

from functools import lru_cache

import numpy as np
from numba import cuda
from numba.types import uint64

from impnb.kernels.attention.attention_decode import LOG2E
from impnb.kernels.common.warp import WARP

_ZERO = np.float32(0)


@lru_cache(maxsize=None)
def wide_parts(D: int) -> tuple:
    """(row_word, key_range, load_q, finish) for head dim D."""
    WPL = D // 64  # u32 words of K and of V a lane reads a key

    @cuda.jit(device=True, inline=True)
    def row_word(block_table, key, shift, mask, Hkv, kh, lane):
        # -- the flat u32 index of lane's first word in key's row of KV head kh (unsigned: no
        # negative-index wrap in the address) --
        page = block_table[0, key >> shift]
        return uint64(((page << shift) + (key & mask)) * Hkv + kh) * uint64(D // 2) + uint64(lane)

    @cuda.jit(device=True, inline=True)
    def key_range(pos, t, window, split, n_splits):
        # -- keys [k0, k1) of this split for query row t at pos[t]: k <= pos, pos - k < window;
        # none for padding rows (pos < 0) --
        qp = pos[t]
        lo = max(0, qp - window + 1) if window > 0 else 0
        hi = qp + 1 if qp >= 0 else 0
        chunk = (hi - lo + n_splits - 1) // n_splits
        k0 = lo + split * chunk
        return k0, min(hi, k0 + chunk)

    @cuda.jit(device=True, inline=True)
    def load_q(q, t, h, lane, scale, qr, acc):
        # -- the lane's dims of query row (t, h) times scale * log2 e into qr; acc zeroed --
        c = scale * LOG2E
        for w in range(WPL):
            qr[2 * w] = q[t, h, 2 * (lane + WARP * w)] * c
            qr[2 * w + 1] = q[t, h, 2 * (lane + WARP * w) + 1] * c
            acc[2 * w] = _ZERO
            acc[2 * w + 1] = _ZERO

    @cuda.jit(device=True, inline=True)
    def finish(out, partials, acc, m, l, split, n_splits, t, h, lane):
        # -- one split: out[t, h] = acc / l; else partials[split, t, h] = (acc, m, l) --
        if n_splits == 1:
            inv = np.float32(1) / l if l > _ZERO else _ZERO
            for w in range(WPL):
                out[t, h, 2 * (lane + WARP * w)] = acc[2 * w] * inv
                out[t, h, 2 * (lane + WARP * w) + 1] = acc[2 * w + 1] * inv
            return
        for w in range(WPL):
            partials[split, t, h, 2 * (lane + WARP * w)] = acc[2 * w]
            partials[split, t, h, 2 * (lane + WARP * w) + 1] = acc[2 * w + 1]
        if lane == 0:
            partials[split, t, h, D] = m
            partials[split, t, h, D + 1] = l

    return row_word, key_range, load_q, finish
