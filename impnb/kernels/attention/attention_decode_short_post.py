"""The fused qkv_post in front of the short decode attention kernel (attention_decode_short.py,
its `post` variants): the block's query row and the step's K rows normalized, rotated and staged in
shared memory, and the step's K/V rows written to the paged cache. Same math as qkv_post.py,
whose numpy twins are the reference."""

import math

import numpy as np
from numba import cuda

from impnb.kernels.attention.rope import cos_sin
from impnb.kernels.common import ptx
from impnb.kernels.common.warp import warp_sum

_ZERO = np.float32(0)


def make_post(D: int, NW: int, QS: int):
    """(post_rows, write_fresh) device functions for head dim D, NW warps a block, and the query
    row's shared layout of QS floats a 32-dim slice."""
    NT = NW * 32
    WPR = D // 2             # u32 words per K or V row

    @cuda.jit(device=True, inline=True)
    def post_rows(q, k_new, v_new, pos, inv_freq, neox, q_norm, k_norm, eps, use_norm, scale,
                  b, t, h, kh, qs, kfw, vfw, xs, tid):
        # -- qkv_post's math for the block: its q row and the step's K rows of head kh (warp w
        # takes row w of [q, k of token 0, ..]) normalized when use_norm, rotated, q pre-scaled
        # into qs, K and the step's V rows as fp16 pairs into kfw, vfw --
        T = q.shape[1]
        lane = tid % 32
        warp = tid // 32
        x0 = warp * D
        half = inv_freq.shape[1]
        for base in range(0, 1 + T, NW):
            r = base + warp
            live = r <= T
            is_q = r == 0
            tt = min(max(r - 1, 0), T - 1)
            p = pos[b, t] if is_q else pos[b, tt]
            if live:
                acc = _ZERO
                for d in range(lane, D, 32):
                    x = q[b, t, h, d] if is_q else k_new[b, tt, kh, d]
                    xs[x0 + d] = x
                    acc += x * x
                if use_norm:
                    inv = np.float32(1) / np.float32(math.sqrt(warp_sum(acc) / np.float32(D) + eps))
                    for d in range(lane, D, 32):
                        xs[x0 + d] = xs[x0 + d] * inv * (q_norm[d] if is_q else k_norm[d])
            cuda.syncthreads()
            if live:
                for i in range(lane, half, 32):
                    cs, sn = cos_sin(p, inv_freq, i)
                    i0 = x0 + (i if neox else 2 * i)
                    i1 = x0 + (i + half if neox else 2 * i + 1)
                    a = xs[i0]
                    c = xs[i1]
                    xs[i0] = a * cs - c * sn
                    xs[i1] = c * cs + a * sn
            cuda.syncthreads()
            if live:
                if is_q:
                    for d in range(lane, D, 32):
                        qs[(d // 32) * QS + d % 32] = xs[x0 + d] * scale
                else:
                    for i in range(lane, WPR, 32):
                        kfw[tt * WPR + i] = ptx.pack_f16x2(xs[x0 + 2 * i], xs[x0 + 2 * i + 1])
            cuda.syncthreads()
        for i in range(tid, T * WPR, NT):
            tt = i // WPR
            d = 2 * (i - tt * WPR)
            vfw[i] = ptx.pack_f16x2(v_new[b, tt, kh, d], v_new[b, tt, kh, d + 1])
        cuda.syncthreads()

    @cuda.jit(device=True, inline=True)
    def write_fresh(k_words, v_words, kfw, vfw, block_table, pos, b, kh, shift, T, tid):
        # -- the step's K and V rows of head kh into the paged cache (pos < 0: padding) --
        for i in range(tid, T * WPR, NT):
            tt = i // WPR
            p = pos[b, tt]
            if p >= 0:
                page = block_table[b, p >> shift]
                off = p & ((1 << shift) - 1)
                k_words[page, off, kh, i - tt * WPR] = kfw[i]
                v_words[page, off, kh, i - tt * WPR] = vfw[i]

    return post_rows, write_fresh
