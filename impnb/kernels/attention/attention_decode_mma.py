"""Batched decode attention on tensor cores: one query token of each of B sequences over the paged
fp16 KV cache, the G = H / Hkv query heads of a KV head as the rows of one m16 tile, S = Q·Kᵀ and
O += P·V on mma.sync m16n8k16 (Q and P rounded to fp16, fp32 sums), the softmax online in fp32.

The split kernel (attention_decode) forms each score on the FMA units, a key's dims spread over a
lane group and summed by shuffles, row by row; here a warp's 16-key tile takes 2 D / 8 mma for
all G rows at once, and the step is a stream of K and V tiles.

Work: grid (S, Hkv, B), block W warps (WARPS; WIDE_WARPS where each block owns an SM: ring_plan).
Block (s, kh, b) owns query heads kh G .. kh G + G - 1 of sequence b and split s of the 16-key tiles
its token sees (keys lo .. hi: hi = pos[b, 0], lo = hi - window + 1 or 0; S even shares of the
tiles), warp w every W-th tile of the share, each
through its own cp.async ring in shared memory (STAGES deep, deeper where fewer blocks share an
SM: ring_stages), so no block barrier runs in the loop; a tile's page number is read a step before
its copies go out. Keys outside lo .. hi are zero-filled and their scores masked. The warps'
(m, l, O) merge through shared memory at the end: with S = 1 the rows go to out, else each
split's unnormalised O, its rows' max m (log2 units) and sum l to partials (S, B, H, D + 2), which
attention_wide.merge_splits adds (an empty split writes m = NEG, l = 0, weight 0).

With post, qkv_post runs in front, in place of its launch: the cache holds keys up to pos - 1, so
before griddepcontrol.wait a block reads pos and the block table and sends its warps' first tiles
(no kernel of this step writes them) and works out the fresh key's rotation; after it, the warps
normalize and rotate the block's G query rows and the fresh K row and round K and V to fp16 in
shared memory (the last split writing them to the cache; 9 KB more a block at D 128, which every
ring layout leaves room for), Q's fragments come from there, and the fresh key joins the merge as
one more part: score q·k of the fp16 operands as an mma sums them, sum 1, row V. q is left as the
GEMM wrote it. Q|K|V may come as a split-K GEMM's partial products, added here in split order
(attention_decode_mma_post.py).

Fragment layouts as attention_fa2's (lane (g, c) = (lane >> 2, lane & 3)): Q's A fragments built
once from global memory (with post: from the staged rows; rows past G zero), K's B fragments by ldmatrix from the swizzled tile
rows, P's A fragments straight from the S accumulators, V's B fragments by ldmatrix .trans.
Numpy reference: attention.attention_ref.
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32, types, uint32

from impnb.kernels.attention import attention_wide
from impnb.kernels.attention.attention_fa2 import swz
from impnb.kernels.attention.kv_cache import PAGE_SIZES
from impnb.kernels.attention.attention_decode_mma_post import Post, make_post, post_args
from impnb.kernels.attention.attention_decode_mma_post import pairs as post_pairs
from impnb.kernels.attention.attention_decode_mma_post import values as post_values
from impnb.kernels.attention.rope import SIN_COS_STACK
from impnb.kernels.common import ptx
from impnb.kernels.common.warp import mma_lane, quad_max, quad_sum, warp_sync
from impnb.kernels.gemv.quant_x import GROUP, QuantX, store_group
from impnb.launch import launch

HEAD_DIMS = (64, 128)
MAX_GROUP = 16            # query heads a KV head (one m16 tile)
WARPS = 4
THREADS = 32 * WARPS
BN = 16                   # keys a warp's tile
STAGES = {64: 4, 128: 2}  # a warp's ring depth at three blocks an SM
# ring depths a launch may take (ring_stages): at head dim 128 four where a block owns an SM (the
# one depth past STAGES that measured faster: docs/EXPERIMENTS.md, "ncu's view against the graph's")
STAGE_CHOICES = {64: (4,), 128: (2, 4)}
# A block of few sequences' batch that owns an SM: WIDE_WARPS warps, each its ring WIDE_STAGES[D]
# deep (the deepest that fits an SM), so each warp's serial chain of tiles is half as long
WIDE_WARPS = 8
WIDE_STAGES = {64: 4, 128: 3}
SM_SHARED = 228 * 1024    # shared memory of an SM (sm_90), 1 KB of it reserved a block
SHARED_SM_REGISTERS = 168  # a thread's registers at most in blocks of WARPS warps: three blocks an SM
MAX_SPLITS = attention_wide.MAX_SPLITS
SPLIT_MIN_KEYS = 256      # keys a split at the least
LOG2E = math.log2(math.e)
NEG = np.float32(-1e30)   # finite "minus infinity": empty parts merge with weight 0
SMEM_ALIGN = ptx.SMEM_ALIGN


def ring_bytes(D: int, stages: int | None = None, warps: int = WARPS) -> int:
    """Dynamic shared memory of a block of `warps` warps: each warp's ring of K and V tiles
    (fp16), stages deep (STAGES[D] by default), which the merge reuses for the warps' rows."""
    return warps * (stages or STAGES[D]) * 2 * BN * 2 * D


def ring_stages(D: int, blocks: int, n_sm: int = 132) -> int:
    """The deepest ring of STAGE_CHOICES[D] whose blocks, `blocks` of them spread over n_sm SMs,
    fit an SM's shared memory together: a block that owns an SM keeps more of its warps' next tiles
    in flight (few sequences or KV heads: a batch of 8-16)."""
    per_sm = -(-blocks // n_sm)
    fits = [st for st in STAGE_CHOICES[D] if per_sm * (ring_bytes(D, st) + 1024) <= SM_SHARED]
    return max(fits, default=STAGES[D])


def ring_plan(D: int, blocks: int, n_sm: int = 132, warps: int = WARPS) -> tuple[int, int]:
    """(each warp's ring depth, warps a block) for a launch of `blocks` blocks: `warps` (WIDE_WARPS
    where tuning.BATCH_MMA_WARPS asks for it) at WIDE_STAGES deep where every block owns an SM,
    else WARPS at ring_stages' depth."""
    if warps == WIDE_WARPS and blocks <= n_sm:
        return WIDE_STAGES[D], WIDE_WARPS
    return ring_stages(D, blocks, n_sm), WARPS


@lru_cache(maxsize=None)
def mma_kernel(D: int, page: int, capped: bool, stages: int | None = None, quant: bool = False, warps: int = WARPS,
               post: bool = False):
    """The kernel of head dim D and page size `page`, `warps` warps a block, each warp's ring
    `stages` deep (STAGES[D] by default); capped: scores through softcap · tanh(s / softcap); quant:
    in one split, the output rows in int8 too (quant_x's groups, for the dp4a GEMV of attn_output
    after it); post: qkv_post in front (the module's docstring, "With post")."""
    W = warps                  # warps a block
    NT = 32 * W                # threads a block
    ROWB = 2 * D               # bytes of a K or V row
    TILE = BN * ROWB           # bytes of a K (or V) tile
    STAGE = 2 * TILE           # K tile, then V tile
    NST = stages or STAGES[D]
    PENDING = NST - 2          # groups left in flight when a tile is read
    CH = D // 8                # 16-byte chunks of a row
    LOADS = BN * CH // 32      # chunks a lane issues a tile, of K and of V each
    KK = D // 16               # k steps of S = Q·Kᵀ
    NO = D // 8                # O n-tiles
    NQF = 4 * KK               # Q's A fragment registers a lane
    N_O = 4 * NO               # O accumulators a lane
    PSH = page.bit_length() - 1
    DP = D + 8                 # a staged row's stride in shared memory (float32): the 8 rows g of an
    # mma fragment's lanes on 2-way rather than 8-way bank conflicts
    MERGE = W * 16 * DP        # float32 words of the warps' O rows in the merge (then m, l)
    EW = MERGE + 2 * W * 16    # then each warp's weight of each row,
    DEN = EW + W * 16          # each row's sum,
    MX = DEN + 16              # its max
    EF = MX + 16               # and the fresh key's weight
    OUTQ = EF + 16             # quant: the block's output rows, then in int8 a thread a group
    assert BN <= page and page == 1 << PSH and OUTQ + MAX_GROUP * D <= ring_bytes(D, NST, W) // 4
    assert D % GROUP == 0
    NPAIR = post_pairs(D)      # post: a lane's rotation pairs
    NXV = post_values(D)       # post: a lane's columns of a row (its QK-norm weights)
    XR = MAX_GROUP + 2         # post: staged rows, the G query heads', then the fresh K's and V's

    @cuda.jit(device=True, inline=True)
    def page_of(table, b, k0, lo):
        # the page of the tile at k0: a tile's 16 keys lie in one page, and every tile holds a
        # live key (the first one lo, the last one hi), which its clamped keys land on
        return table[b, max(k0, lo) >> PSH]

    @cuda.jit(device=True, inline=True)
    def issue(ring, k_pool, v_pool, pg, kh, Hkv, k0, lo, hi, stage, lane):
        # keys k0 .. k0 + 15 of page pg (K and V of head kh) -> stage `stage` of this warp's ring
        # at `ring`; a key outside lo .. hi reads nothing (zeros) from a live key's row
        for i in range(LOADS):
            idx = lane + 32 * i
            r = idx // CH
            ch = idx - r * CH
            key = k0 + r
            live = min(max(key, lo), hi)
            n = 16 if lo <= key and key <= hi else 0
            src = ((pg * page + (live & (page - 1))) * Hkv + kh) * D + 8 * ch
            dst = ring + stage * STAGE + swz(r, ch, ROWB)
            ptx.cp_async_16_zfill(dst, k_pool, src, n)
            ptx.cp_async_16_zfill(dst + TILE, v_pool, src, n)
        ptx.cp_async_commit()

    rotation, norm_weights, post_rows, fresh_scores = make_post(D, W, paired=W == WIDE_WARPS)

    # grid (S, Hkv, B), block NT threads (W warps); see the module's docstring
    def kernel(q, k_pool, v_pool, table, pos, out, partials, qscale, window, softcap, xq, xd, xs,
               k_new, v_new, parts, vcol, inv_freq, neox, q_norm, k_norm, eps, use_norm):
        if not post:
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
            ptx.grid_dep_launch()
        split = cuda.blockIdx.x
        kh = cuda.blockIdx.y
        b = cuda.blockIdx.z
        S = cuda.gridDim.x
        H = q.shape[2]
        Hkv = k_pool.shape[2]
        G = H // Hkv
        tid, lane, warp, g, c = mma_lane()
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        ring = ptx.smem_addr(smem, 0) + warp * (NST * STAGE)

        # -- the keys, this split's tiles and this warp's: tiles t0 + warp + W i, i < n_mine; with
        # post the cache holds keys .. hn - 1 and the fresh key hn joins at the merge --
        hn = int32(pos[b, 0])
        hi = hn - 1 if post else hn
        lo = int32(max(0, hn - window + 1) if window > 0 else 0)
        j0 = lo // BN
        n_tiles = hi // BN - j0 + 1 if hi >= lo else 0
        per = (n_tiles + S - 1) // S
        t0 = j0 + split * per
        n_split = max(0, min(per, n_tiles - split * per))
        n_mine = (n_split - warp + W - 1) // W if n_split > warp else 0
        for i in range(NST - 1):  # a group each, empty past n_mine: wait_group counts groups
            if i < n_mine:
                k0 = (t0 + warp + W * i) * BN
                issue(ring, k_pool, v_pool, page_of(table, b, k0, lo), kh, Hkv, k0, lo, hi, i, lane)
            else:
                ptx.cp_async_commit()
        # the page of the tile the loop issues next, read a step ahead: its copies then wait on no
        # load of the block table
        pg = page_of(table, b, (t0 + warp + W * (NST - 1)) * BN, lo) if NST - 1 < n_mine else 0

        # -- Q's A fragments (rows g, g + 8: heads kh G + row; rows past G zero), times qscale --
        qf = cuda.local.array(NQF, uint32)
        xr = cuda.shared.array((XR if post else 1, DP), float32)
        sf = cuda.shared.array(MAX_GROUP if post else 1, float32)
        fresh = False
        if post:
            # before the wait: the fresh key's rotation and its cache slot (pos, the block table
            # and the cached keys' tiles above are no kernel's of this step)
            cs = cuda.local.array(NPAIR, float32)
            sn = cuda.local.array(NPAIR, float32)
            rotation(hn, inv_freq, lane, cs, sn)
            page_n = table[b, max(hn, 0) >> PSH]
            off_n = max(hn, 0) & (page - 1)
            fresh = split == S - 1 and hn >= 0  # this block merges the fresh key (and writes it)
            qn = cuda.local.array(NXV, float32)
            kn = cuda.local.array(NXV, float32)
            norm_weights(q_norm, k_norm, use_norm, lane, qn, kn)
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished (q, k, v)
            ptx.grid_dep_launch()
            post_rows(q, k_new, v_new, parts, vcol, inv_freq, neox, qn, kn, eps, use_norm, cs, sn, xr, b, kh,
                      G, page_n, off_n, fresh, k_pool, v_pool, lane, warp)
            cuda.syncthreads()  # the rows are staged
            fresh_scores(xr, sf, G, qscale, capped, float32(softcap * LOG2E), lane, warp)
        for kk in range(KK):  # Q's rows from post's staged rows, else as the GEMM wrote them
            for u in range(4):
                row = g + 8 * (u & 1)
                d = 16 * kk + 8 * (u >> 1) + 2 * c
                qf[4 * kk + u] = 0
                if row < G:
                    if post:
                        q0, q1 = xr[row, d], xr[row, d + 1]
                    else:
                        q0, q1 = q[b, 0, kh * G + row, d], q[b, 0, kh * G + row, d + 1]
                    qf[4 * kk + u] = ptx.pack_f16x2(q0 * qscale, q1 * qscale)

        m = cuda.local.array(2, float32)
        lsum = cuda.local.array(2, float32)
        s = cuda.local.array(8, float32)
        o = cuda.local.array(N_O, float32)
        for rh in range(2):
            m[rh] = NEG
            lsum[rh] = float32(0)
        for i in range(N_O):
            o[i] = float32(0)
        # ldmatrix lane offsets within a stage (attention_fa2's): K for k step 0, V for dims 0..15;
        # k step kk (dims 16 dp) XORs kk << 5 (dp << 5) into the chunk bits
        kb = lane & 7
        k_rel = (kb + ((lane >> 4) << 3)) * ROWB + ((((lane >> 3) & 1) ^ kb) << 4)
        v_rel = TILE + (kb + (((lane >> 3) & 1) << 3)) * ROWB + (((lane >> 4) ^ kb) << 4)

        for i in range(n_mine):
            ptx.cp_async_wait_group(PENDING)
            warp_sync()  # every lane's copies of tile i have landed; tile i - 1's stage is free
            if i + NST - 1 < n_mine:
                issue(ring, k_pool, v_pool, pg, kh, Hkv, (t0 + warp + W * (i + NST - 1)) * BN, lo, hi,
                      (i + NST - 1) % NST, lane)
            else:
                ptx.cp_async_commit()  # an empty group keeps wait_group's count
            if i + NST < n_mine:
                pg = page_of(table, b, (t0 + warp + W * (i + NST)) * BN, lo)
            base = ring + (i % NST) * STAGE
            k0 = (t0 + warp + W * i) * BN

            # -- S = Q·Kᵀ over the tile's 16 keys: two n8 tiles --
            for e in range(8):
                s[e] = float32(0)
            for kk in range(KK):
                b0, b1, b2, b3 = ptx.ldmatrix_x4(base + (k_rel ^ (kk << 5)))
                s[0], s[1], s[2], s[3] = ptx.mma_f16(qf[4 * kk], qf[4 * kk + 1], qf[4 * kk + 2], qf[4 * kk + 3],
                                                     b0, b1, s[0], s[1], s[2], s[3])
                s[4], s[5], s[6], s[7] = ptx.mma_f16(qf[4 * kk], qf[4 * kk + 1], qf[4 * kk + 2], qf[4 * kk + 3],
                                                     b2, b3, s[4], s[5], s[6], s[7])
            if capped:
                cap_out = float32(softcap * LOG2E)
                cap_in = float32(1) / cap_out
                for e in range(8):
                    s[e] = cap_out * math.tanh(s[e] * cap_in)
            # s[4 n + 2 rh + e]: row g + 8 rh, key k0 + 8 n + 2 c + e
            if k0 < lo or k0 + BN - 1 > hi:
                for e in range(8):
                    key = k0 + 8 * (e >> 2) + 2 * c + (e & 1)
                    if key < lo or key > hi:
                        s[e] = NEG

            # -- online softmax of rows g and g + 8 --
            for rh in range(2):
                mx = max(max(s[2 * rh], s[2 * rh + 1]), max(s[4 + 2 * rh], s[5 + 2 * rh]))
                mx = max(quad_max(mx), m[rh])
                a = ptx.ex2_approx_ftz(m[rh] - mx)
                m[rh] = mx
                p0 = ptx.ex2_approx_ftz(s[2 * rh] - mx)
                p1 = ptx.ex2_approx_ftz(s[2 * rh + 1] - mx)
                p2 = ptx.ex2_approx_ftz(s[4 + 2 * rh] - mx)
                p3 = ptx.ex2_approx_ftz(s[5 + 2 * rh] - mx)
                s[2 * rh] = p0
                s[2 * rh + 1] = p1
                s[4 + 2 * rh] = p2
                s[5 + 2 * rh] = p3
                lsum[rh] = lsum[rh] * a + (p0 + p1) + (p2 + p3)
                for n in range(NO):
                    o[4 * n + 2 * rh] *= a
                    o[4 * n + 2 * rh + 1] *= a

            # -- O += P·V: P's A fragment from s, V's rows (keys) by ldmatrix .trans --
            pa0 = ptx.pack_f16x2(s[0], s[1])
            pa1 = ptx.pack_f16x2(s[2], s[3])
            pa2 = ptx.pack_f16x2(s[4], s[5])
            pa3 = ptx.pack_f16x2(s[6], s[7])
            for dp in range(NO // 2):
                b0, b1, b2, b3 = ptx.ldmatrix_x4_trans(base + (v_rel ^ (dp << 5)))
                f = 8 * dp
                o[f], o[f + 1], o[f + 2], o[f + 3] = ptx.mma_f16(pa0, pa1, pa2, pa3, b0, b1,
                                                                 o[f], o[f + 1], o[f + 2], o[f + 3])
                o[f + 4], o[f + 5], o[f + 6], o[f + 7] = ptx.mma_f16(pa0, pa1, pa2, pa3, b2, b3,
                                                                     o[f + 4], o[f + 5], o[f + 6], o[f + 7])
        ptx.cp_async_wait_all()

        # -- the warps' rows through shared memory: O[w][row][d], then m[w][row], l[w][row] --
        red = cuda.shared.array(0, float32, alignment=SMEM_ALIGN)
        cuda.syncthreads()  # every warp is done with its ring
        for rh in range(2):
            row = g + 8 * rh
            lrow = quad_sum(lsum[rh])
            if row < G:
                for n in range(NO):
                    red[(warp * 16 + row) * DP + 8 * n + 2 * c] = o[4 * n + 2 * rh]
                    red[(warp * 16 + row) * DP + 8 * n + 2 * c + 1] = o[4 * n + 2 * rh + 1]
                if c == 0:
                    red[MERGE + warp * 16 + row] = m[rh]
                    red[MERGE + W * 16 + warp * 16 + row] = lrow
        cuda.syncthreads()
        if tid < G:  # a thread a row: each warp's weight 2^(m - mx), the sum and the fresh key's weight
            row = tid
            mx = NEG
            for w in range(W):
                mx = max(mx, red[MERGE + w * 16 + row])
            if fresh:
                mx = max(mx, sf[row])
            den = float32(0)
            for w in range(W):
                e = ptx.ex2_approx_ftz(red[MERGE + w * 16 + row] - mx)
                red[EW + w * 16 + row] = e
                den += e * red[MERGE + W * 16 + w * 16 + row]
            ef = float32(0)
            if fresh:
                ef = ptx.ex2_approx_ftz(sf[row] - mx)
                den += ef
            red[DEN + row] = den
            red[MX + row] = mx
            red[EF + row] = ef
        cuda.syncthreads()
        for idx in range(tid, G * D, NT):
            row = idx // D
            d = idx - row * D
            num = float32(0)
            for w in range(W):
                num += red[EW + w * 16 + row] * red[(w * 16 + row) * DP + d]
            if fresh:  # the fresh key: score sf, sum 1, row V
                num += red[EF + row] * xr[G + 1, d]
            den = red[DEN + row]
            mx = red[MX + row]
            h = kh * G + row
            if S == 1:
                val = num / den
                out[b, 0, h, d] = val
                if quant:
                    red[OUTQ + idx] = val
            else:
                partials[split, b, h, d] = num
                if d == 0:
                    partials[split, b, h, D] = mx
                    partials[split, b, h, D + 1] = den
        if quant and S == 1:  # columns kh G D .. (kh + 1) G D - 1 of row b, as quantize_x writes them
            cuda.syncthreads()
            if tid < G * D // GROUP:
                v = cuda.local.array(GROUP, float32)
                for j in range(GROUP):
                    v[j] = red[OUTQ + tid * GROUP + j]
                store_group(v, xq, xd, xs, b, kh * G * D // GROUP + tid)

    kernel.__name__ = (f"_decode_mma_d{D}_p{page}_s{NST}{'' if W == WARPS else f'_w{W}'}{'_softcap' if capped else ''}"
                       f"{'_quant' if quant else ''}{'_post' if post else ''}_kernel")
    if W == WARPS and not ptx.SIM:  # three blocks an SM share its registers
        return cuda.jit(kernel, max_registers=SHARED_SM_REGISTERS)
    return cuda.jit(kernel)


# ---------------------------------------------------------------- host side

def layouts(D: int) -> list[tuple[int, int]]:
    """The (ring depth, warps) pairs a launch at head dim D may take (ring_plan's)."""
    return [(st, WARPS) for st in STAGE_CHOICES[D]] + [(WIDE_STAGES[D], WIDE_WARPS)]


def supports(head_dim: int, n_head: int, n_head_kv: int) -> bool:
    """Whether this kernel takes a model of these heads (fp16 pools, one token a sequence)."""
    return head_dim in HEAD_DIMS and n_head % n_head_kv == 0 and n_head // n_head_kv <= MAX_GROUP


def num_splits(ctx_bucket: int, n_head_kv: int, batch: int, window: int | None = None, n_sm: int = 132) -> int:
    """Splits for a graph serving contexts up to ctx_bucket keys (or its window): none where the
    batch's blocks (a sequence's KV head each) fill every SM once; else about three blocks an SM
    (the rings of D 128 allow three), at most MAX_SPLITS, each of at least SPLIT_MIN_KEYS keys: a
    shorter split saves less than the merge kernel after it costs, even with SMs left idle
    (docs/EXPERIMENTS.md, 'A batch's MoE router in one launch, the router's tail, decode
    attention's splits'; PERFORMANCE.md, 'Batched decode')."""
    keys = min(ctx_bucket, window) if window else ctx_bucket
    blocks = batch * n_head_kv
    if blocks >= n_sm:
        return 1
    return max(1, min(-(-3 * n_sm // blocks), keys // SPLIT_MIN_KEYS, MAX_SPLITS))


def partials_shape(n_splits: int, batch: int, n_head: int, head_dim: int) -> tuple:
    """(S, B, H, D + 2) float32: each split's unnormalised rows, their max m and sum l."""
    return n_splits, batch, n_head, head_dim + 2


def attention_decode_mma(q, k_pool, v_pool, block_table, pos, out, partials, n_splits: int, scale: float,
                         window: int | None, softcap: float | None, stream, stages: int | None = None,
                         xq: QuantX | None = None, warps: int = WARPS, post: Post | None = None) -> None:
    """out (B, 1, H, D) = attention of q (B, 1, H, D) float32, sequence b's token at pos[b, 0], over
    the paged fp16 cache: k_pool, v_pool (n_pages, page_size, Hkv, D) float16 already holding keys
    0 .. pos[b, 0] (with post: 0 .. pos[b, 0] - 1, the kernel adding the fresh one); block_table
    (B, max_pages) int32. partials (partials_shape with >= n_splits
    splits and B) float32 scratch, unread at n_splits 1. The key range is read from pos on the
    device: a captured graph stays valid as the context grows. window None or > 0; softcap None
    or > 0; stages: each warp's ring depth, one of STAGE_CHOICES[D] (STAGES[D] where None), or
    WIDE_STAGES[D] at warps WIDE_WARPS (ring_plan's pairs). xq
    (quant_x.QuantX of B rows, H * D columns; one split, no softcap): out's int8 form is written
    there too, equal to quantize_x's of out as (B, H * D) (one kernel fewer before a dp4a GEMV).
    post (Post, no softcap): qkv_post in front, in place of its launch; q is left as it came."""
    B, T, H, D = q.shape
    P, Hkv = k_pool.shape[1], k_pool.shape[2]
    for a, dt, nd, name in ((q, np.float32, 4, "q"), (out, np.float32, 4, "out"), (k_pool, np.float16, 4, "k_pool"),
                            (v_pool, np.float16, 4, "v_pool"), (block_table, np.int32, 2, "block_table"),
                            (pos, np.int32, 2, "pos"), (partials, np.float32, 4, "partials")):
        assert a.dtype == dt and a.ndim == nd and a.is_c_contiguous(), \
            f"{name}: C-contiguous {np.dtype(dt)} with {nd} dims expected, got {a.dtype} {a.shape}"
    assert T == 1 and out.shape == q.shape and pos.shape == (B, 1) and block_table.shape[0] == B, "shapes"
    assert supports(D, H, Hkv) and k_pool.shape[3] == D and v_pool.shape == k_pool.shape, "heads"
    assert P in PAGE_SIZES and 1 <= n_splits <= MAX_SPLITS, f"page {P}, splits {n_splits}"
    assert partials.shape[0] >= n_splits and partials.shape[1:] == (B, H, D + 2), "partials shape"
    assert window is None or window > 0, "window must be None or positive"
    assert softcap is None or softcap > 0, "softcap must be None or positive"
    stages = stages or STAGES[D]
    assert (stages, warps) in layouts(D), f"ring of {stages} stages at {warps} warps, head dim {D}"
    if xq is not None:
        assert n_splits == 1 and not softcap, "int8 output: one split, no softcap"
        assert xq.q.shape == (B, H * D // 4) and xq.d.shape == xq.s.shape == (B, H * D // GROUP), "xq shapes"
    flat = out.reshape(B, H * D)
    q8, xd, xs = xq or (flat.view(np.uint32), flat, flat)  # unread without xq
    assert post is None or not softcap, "qkv_post in front: no softcap"
    tail = post_args(post, q, out)
    launch(mma_kernel(D, P, bool(softcap), stages, xq is not None, warps, post is not None), (n_splits, Hkv, B),
           32 * warps, stream, q, k_pool, v_pool, block_table, pos, out, partials, np.float32(scale * LOG2E),
           np.int32(window or 0), np.float32(softcap or 0.0), q8, xd, xs, *tail,
           shared_bytes=ring_bytes(D, stages, warps))
    if n_splits > 1:
        attention_wide.merge_splits(partials[:n_splits], out.reshape(B, H, D), n_splits, stream)


_Q = types.float32[:, :, :, ::1]
_POOL = types.float16[:, :, :, ::1]
_F2 = types.float32[:, ::1]
_F1 = types.float32[::1]
_SIG = (_Q, _POOL, _POOL, types.int32[:, ::1], types.int32[:, ::1], _Q, types.float32[:, :, :, ::1],
        types.float32, types.int32, types.float32, types.uint32[:, ::1], _F2, _F2,
        _Q, _Q, types.float32[:, :, ::1], types.int32, _F2, types.int32, _F1, _F1, types.float32, types.int32)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py): every
    head dim, page size and ring layout, plain, capped and with the int8 output; qkv_post in front
    (no softcap) with and without it."""
    plain = [(capped, quant, False) for capped in (False, True) for quant in ((False,) if capped else (False, True))]
    fused = [(False, quant, True) for quant in (False, True)]
    return [(mma_kernel(D, P, capped, st, quant, w, post), _SIG,
             {"max_registers": 255, "stack_bytes": SIN_COS_STACK if post else 0})
            for D in HEAD_DIMS for P in PAGE_SIZES for st, w in layouts(D) for capped, quant, post in plain + fused]
