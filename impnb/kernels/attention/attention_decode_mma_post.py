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


def values(D: int) -> int:
    """A lane's columns of a staged row at head dim D (4 a chunk c = 4 lane + 128 j): the length of
    its norm weights qn, kn."""
    return 4 * -(-D // 128)


def make_post(D: int, W: int, paired: bool = False):
    """(rotation, norm_weights, post_rows, fresh_scores) device functions for head dim D and W warps a
    block; paired: a warp's rows two at a time, both rows' loads out together (more registers: for
    blocks that own an SM)."""
    NPR = D // 32         # a lane's columns of a row (d = lane + 32 m)
    NPAIR = pairs(D)
    NCH = -(-D // 128)    # a lane's 4-column chunks of a row (c = 4 lane + 128 j)
    NXV = values(D)       # their values

    @cuda.jit(device=True, inline=True)
    def rotation(hn, inv_freq, lane, cs, sn):
        # cos, sin of the fresh key's position hn (0 for padding) at this lane's pairs
        for j in range(NPAIR):
            cs[j], sn[j] = cos_sin(max(hn, 0), inv_freq, min(lane + 32 * j, inv_freq.shape[1] - 1))

    @cuda.jit(device=True, inline=True)
    def norm_weights(q_norm, k_norm, use_norm, lane, qn, kn):
        # this lane's columns c = 4 lane + 128 j of the QK-norm weights (no kernel's output: read
        # before the wait)
        for j in range(NCH):
            c = min(4 * lane + 128 * j, D - 4)
            for e in range(4):
                qn[4 * j + e] = q_norm[c + e] if use_norm else float32(1)
                kn[4 * j + e] = k_norm[c + e] if use_norm else float32(1)

    @cuda.jit(device=True, inline=True)
    def whole(vcol, G, r):
        # row r comes whole (q, k_new or v_new), not from split-K partials
        return vcol == NO_PARTS or (r > G and vcol < 0)

    @cuda.jit(device=True, inline=True)
    def row_loads(q, k_new, v_new, parts, vcol, b, kh, G, r, c, s0, ch):
        # columns c .. c + 3 of post row r (query head kh G + r for r < G, then the fresh K, V of
        # head kh) into ch: whole, in ch[0]; else splits s0 .. s0 + PART_CHUNK - 1 of parts (an (S,
        # B, N) split-K GEMM's partial products, columns [Q | K | V], V's from vcol or, with vcol <
        # 0, in v_new; past S the last split again, unadded)
        H = q.shape[2]
        Hkv = k_new.shape[2]
        if whole(vcol, G, r):
            if r < G:
                ch[0, 0], ch[0, 1], ch[0, 2], ch[0, 3] = qi.ldg_f32x4(q, ((b * H) + kh * G + r) * D + c)
            else:
                ch[0, 0], ch[0, 1], ch[0, 2], ch[0, 3] = qi.ldg_f32x4(k_new if r == G else v_new,
                                                                    (b * Hkv + kh) * D + c)
            return
        S, B, N = parts.shape
        col = (kh * G + r) * D + c if r < G else (H + kh) * D + c if r == G else vcol + kh * D + c
        for j in range(PART_CHUNK):
            ch[j, 0], ch[j, 1], ch[j, 2], ch[j, 3] = qi.ldg_f32x4(parts, (min(s0 + j, S - 1) * B + b) * N + col)

    @cuda.jit(device=True, inline=True)
    def row_adds(parts, vcol, G, r, s0, ch, xv, j0):
        # the loads of row_loads(r, s0) into xv[j0 .. j0 + 3]: whole, as they came; else added in
        # split order onto what the splits before s0 left there
        if whole(vcol, G, r):
            for e in range(4):
                xv[j0 + e] = ch[0, e]
            return
        S = parts.shape[0]
        if s0 == 0:
            for e in range(4):
                xv[j0 + e] = float32(0)
        for j in range(PART_CHUNK):
            if s0 + j < S:
                for e in range(4):
                    xv[j0 + e] += ch[j, e]

    @cuda.jit(device=True, inline=True)
    def row_pair(q, k_new, v_new, parts, vcol, b, kh, G, r, r2, c, xv, xv2, j0):
        # columns c .. c + 3 of rows r and r2 (r2 < 0: none) into xv, xv2 at j0, every load of
        # both rows' split chunk out before the first add
        n_s = 1 if whole(vcol, G, r) else parts.shape[0]
        n_s2 = 0 if r2 < 0 else 1 if whole(vcol, G, r2) else parts.shape[0]
        for s0 in range(0, max(n_s, n_s2), PART_CHUNK):
            ch = cuda.local.array((PART_CHUNK, 4), float32)
            ch2 = cuda.local.array((PART_CHUNK, 4), float32)
            if s0 < n_s:
                row_loads(q, k_new, v_new, parts, vcol, b, kh, G, r, c, s0, ch)
            if s0 < n_s2:
                row_loads(q, k_new, v_new, parts, vcol, b, kh, G, r2, c, s0, ch2)
            if s0 < n_s:
                row_adds(parts, vcol, G, r, s0, ch, xv, j0)
            if s0 < n_s2:
                row_adds(parts, vcol, G, r2, s0, ch2, xv2, j0)

    @cuda.jit(device=True, inline=True)
    def finish_row(xv, r, G, qn, kn, eps, use_norm, neox, half, cs, sn, xr, page_n, off_n, writer, k_pool, v_pool,
                   kh, lane):
        # row r's columns (xv) normalized where use_norm (r <= G) and rotated (q and k), into xr;
        # K and V rounded to fp16 there, and written to the cache by the writer
        if use_norm and r <= G:
            acc = float32(0)
            for j in range(NCH):
                if 4 * lane + 128 * j < D:
                    for e in range(4):
                        acc += xv[4 * j + e] * xv[4 * j + e]
            inv = float32(1) / math.sqrt(warp_sum(acc) / float32(D) + eps)
            for j in range(NCH):
                for e in range(4):
                    xv[4 * j + e] = xv[4 * j + e] * inv * (qn[4 * j + e] if r < G else kn[4 * j + e])
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
    def post_rows(q, k_new, v_new, parts, vcol, inv_freq, neox, qn, kn, eps, use_norm, cs, sn, xr, b, kh,
                  G, page_n, off_n, writer, k_pool, v_pool, lane, warp):
        # qkv_post's math for the block's rows (warp w: rows w, w + W, ...; paired, two of them at
        # a time, their loads out together): query head kh G + r (r < G), then the fresh K (r = G) and V
        # (r = G + 1) of head kh (row_loads'); q and k normalized where use_norm (qn, kn: this
        # lane's norm weights, norm_weights') and rotated, into xr (G + 2, >= D); K and V rounded
        # to fp16 there, and written to the cache by the writer
        half = inv_freq.shape[1]
        for r in range(warp, G + 2, 2 * W if paired else W):
            r2 = r + W if paired and r + W < G + 2 else -1
            xv = cuda.local.array(NXV, float32)
            xv2 = cuda.local.array(NXV, float32)
            for j in range(NCH):
                c = 4 * lane + 128 * j
                if c < D:
                    row_pair(q, k_new, v_new, parts, vcol, b, kh, G, r, r2, c, xv, xv2, 4 * j)
            finish_row(xv, r, G, qn, kn, eps, use_norm, neox, half, cs, sn, xr, page_n, off_n, writer, k_pool,
                       v_pool, kh, lane)
            if r2 >= 0:
                finish_row(xv2, r2, G, qn, kn, eps, use_norm, neox, half, cs, sn, xr, page_n, off_n, writer, k_pool,
                           v_pool, kh, lane)

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

    return rotation, norm_weights, post_rows, fresh_scores


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
