"""qkv_post in front of the batched decode attention on tensor cores (attention_decode_mma.py, its
`post` builds): the fresh key's rotation before the kernel's griddepcontrol.wait; after it the
block's G query rows and the step's fresh K and V rows of its KV head, read whole or added up from
a split-K GEMM's partial products, normalized, rotated and staged in shared memory, the fresh K and
V written to the paged cache, and the fresh key's score of each row. Same math as qkv_post.py,
whose numpy twins are the reference; the host side's Post and its launch arguments (post_args)."""

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

from impnb.kernels.attention.rope import cos_sin, rotate_row_pair
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.warp import warp_sum, warp_sync

PART_CHUNK = 8  # from split-K partials: a lane's splits of loads in flight at once
NO_PARTS = -2   # vcol where q, k and v come whole (no split-K partials)


def pairs(D: int) -> int:
    """A lane's rotation pairs at most at head dim D (i = lane + 32 j): the length of its cs, sn."""
    return (D // 2 + 31) // 32


def make_post(D: int, W: int):
    """(rotation, post_rows, fresh_scores) device functions for head dim D and W warps a block."""
    NPR = D // 32         # a lane's columns of a row (d = lane + 32 m)
    NPAIR = pairs(D)
    NCH = -(-D // 128)    # a lane's 4-column chunks of a row (c = 4 lane + 128 j)
    NXV = 4 * NCH         # their values

    @cuda.jit(device=True, inline=True)
    def rotation(hn, inv_freq, lane, cs, sn):
        # cos, sin of the fresh key's position hn (0 for padding) at this lane's pairs
        for j in range(NPAIR):
            cs[j], sn[j] = cos_sin(max(hn, 0), inv_freq, min(lane + 32 * j, inv_freq.shape[1] - 1))

    @cuda.jit(device=True, inline=True)
    def row_chunk(q, k_new, v_new, parts, vcol, b, kh, G, r, c):
        # columns c .. c + 3 of post row r (query head kh G + r for r < G, then the fresh K, V of
        # head kh): from q, k_new, v_new, or with parts (an (S, B, N) split-K GEMM's partial
        # products, columns [Q | K | V], V's from vcol or, with vcol < 0, in v_new) their sum in
        # split order, every split's load sent before the first add
        H = q.shape[2]
        Hkv = k_new.shape[2]
        if vcol == NO_PARTS or (r > G and vcol < 0):
            if r < G:
                return qi.ldg_f32x4(q, ((b * H) + kh * G + r) * D + c)
            return qi.ldg_f32x4(k_new if r == G else v_new, (b * Hkv + kh) * D + c)
        S, B, N = parts.shape
        col = (kh * G + r) * D + c if r < G else (H + kh) * D + c if r == G else vcol + kh * D + c
        a0 = a1 = a2 = a3 = float32(0)
        for s0 in range(0, S, PART_CHUNK):
            ch = cuda.local.array((PART_CHUNK, 4), float32)
            for j in range(PART_CHUNK):
                ch[j, 0], ch[j, 1], ch[j, 2], ch[j, 3] = qi.ldg_f32x4(parts, (min(s0 + j, S - 1) * B + b) * N + col)
            for j in range(PART_CHUNK):
                if s0 + j < S:
                    a0 += ch[j, 0]
                    a1 += ch[j, 1]
                    a2 += ch[j, 2]
                    a3 += ch[j, 3]
        return a0, a1, a2, a3

    @cuda.jit(device=True, inline=True)
    def post_rows(q, k_new, v_new, parts, vcol, inv_freq, neox, q_norm, k_norm, eps, use_norm, cs, sn, xr, b, kh,
                  G, page_n, off_n, writer, k_pool, v_pool, lane, warp):
        # qkv_post's math for the block's rows (warp w: rows w, w + W, ...): query head kh G + r
        # (r < G), then the fresh K (r = G) and V (r = G + 1) of head kh (row_chunk's); q and k
        # normalized where use_norm and rotated, into xr (G + 2, D); K and V rounded to fp16 there,
        # and written to the cache by the writer
        half = inv_freq.shape[1]
        for r in range(warp, G + 2, W):
            xv = cuda.local.array(NXV, float32)
            acc = float32(0)
            for j in range(NCH):
                c = 4 * lane + 128 * j
                if c < D:
                    xv[4 * j], xv[4 * j + 1], xv[4 * j + 2], xv[4 * j + 3] = row_chunk(q, k_new, v_new, parts, vcol,
                                                                                     b, kh, G, r, c)
                    for e in range(4):
                        acc += xv[4 * j + e] * xv[4 * j + e]
            if use_norm and r <= G:
                inv = float32(1) / math.sqrt(warp_sum(acc) / float32(D) + eps)
                for j in range(NCH):
                    c = 4 * lane + 128 * j
                    if c < D:
                        for e in range(4):
                            xv[4 * j + e] = xv[4 * j + e] * inv * (q_norm[c + e] if r < G else k_norm[c + e])
            for j in range(NCH):
                c = 4 * lane + 128 * j
                if c < D:
                    for e in range(4):
                        xr[r, c + e] = xv[4 * j + e]
            warp_sync()
            if r <= G:
                for j in range(NPAIR):
                    i = lane + 32 * j
                    if i < half:
                        rotate_row_pair(xr, r, i, half, neox, cs[j], sn[j])
                warp_sync()
            if r >= G:
                for mm in range(NPR):
                    d = lane + 32 * mm
                    xr[r, d] = qi.f16_to_f32(qi.f32_to_f16_bits(xr[r, d]))
                    if writer and r == G:
                        k_pool[page_n, off_n, kh, d] = xr[r, d]
                    elif writer:
                        v_pool[page_n, off_n, kh, d] = xr[r, d]
                warp_sync()

    @cuda.jit(device=True, inline=True)
    def fresh_scores(xr, sf, G, qscale, capped, cap_out, lane, warp):
        # the fresh key's score of each staged query row into sf, as the mma forms one: fp16
        # products (q times qscale, K), fp32 sums; with capped, through cap_out · tanh(s / cap_out)
        for r in range(warp, G, W):
            acc = float32(0)
            for mm in range(NPR):
                d = lane + 32 * mm
                acc += qi.f16_to_f32(qi.f32_to_f16_bits(xr[r, d] * qscale)) * xr[G, d]
            acc = warp_sum(acc)
            if capped:
                acc = cap_out * math.tanh(acc * (float32(1) / cap_out))
            if lane == 0:
                sf[r] = acc

    return rotation, post_rows, fresh_scores


@dataclass(frozen=True)
class Post:
    """qkv_post in front of the kernel (qkv_post.py's math): q (B, 1, H, D) is the Q|K|V GEMM's raw
    output, k_new, v_new (B, 1, Hkv, D) float32 the step's fresh K and V rows, normalized where
    q_norm, k_norm (D,) float32 are given, q and k rotated by inv_freq (rope_inv_freq: (2, n_rot
    / 2)) at pos, NeoX or adjacent pairs; the fresh rows are written to the cache at pos. parts:
    where the GEMM left its split-K partial products (S, B, N) float32 unreduced, columns [Q | K |
    V] (q, k_new and the partials' V unread then), the kernel adds them up in split order as its
    reduce would; v_in_parts: V's columns are there (else V comes whole in v_new)."""
    k_new: object
    v_new: object
    inv_freq: object
    neox: bool
    q_norm: object
    k_norm: object
    eps: float
    parts: object = None
    v_in_parts: bool = True


def post_args(post: Post | None, q, out) -> tuple:
    """The kernel's arguments past xs for post (k_new, v_new, parts, vcol, inv_freq, neox, q_norm,
    k_norm, eps, use_norm), checked; without post, arrays of the right types that it never reads."""
    B, _, H, D = q.shape
    flat = out.reshape(B, H * D)
    if post is None:
        f1 = flat.reshape(B * H * D)
        return q, q, out.reshape(1, B, H * D), np.int32(NO_PARTS), flat, np.int32(0), f1, f1, np.float32(0), np.int32(0)
    Hkv = post.k_new.shape[2]
    for a, name in ((post.k_new, "k_new"), (post.v_new, "v_new")):
        assert a.dtype == np.float32 and a.shape == (B, 1, Hkv, D) and a.is_c_contiguous(), \
            f"{name}: (B, 1, Hkv, D) float32"
    inv_freq = post.inv_freq
    assert inv_freq.dtype == np.float32 and inv_freq.ndim == 2 and 2 * inv_freq.shape[1] <= D, "inv_freq"
    use_norm = post.q_norm is not None
    assert not use_norm or post.q_norm.shape == post.k_norm.shape == (D,), "QK-norm weights: (D,)"
    q_norm, k_norm = (post.q_norm, post.k_norm) if use_norm else (inv_freq[0], inv_freq[0])  # unread
    parts, vcol = post.parts, NO_PARTS
    if parts is None:
        parts = out.reshape(1, B, H * D)  # unread
    else:
        N = parts.shape[2]
        assert parts.dtype == np.float32 and parts.ndim == 3 and parts.shape[1] == B and parts.is_c_contiguous()
        assert N == (H + (2 if post.v_in_parts else 1) * Hkv) * D, f"partials of {N} columns: [Q | K | V] expected"
        vcol = (H + Hkv) * D if post.v_in_parts else -1
    return (post.k_new, post.v_new, parts, np.int32(vcol), inv_freq, np.int32(bool(post.neox)), q_norm, k_norm,
            np.float32(post.eps), np.int32(use_norm))
