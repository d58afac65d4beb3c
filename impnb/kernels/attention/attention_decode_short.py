"""Decode attention for short contexts: one block, or one thread-block cluster, reads all the keys
of one query row.

At the contexts of a chat turn (tens to a few hundred keys) the split kernel of attention_decode
is latency-bound: its cp.async ring, split bookkeeping and cross-split merge cost more than the
few KB of K/V it reads. Here a block owns one query row and its warps take turns over the keys,
KI = 32 / (D/32) keys a warp at a time: each warp runs its own online softmax with no barrier
in the loop, the next turn's K and V already in its registers, and the warps merge once at the
end. With a cluster of S blocks a row (sm_90) each block takes 1/S of the keys and block 0
merges the parts through distributed shared memory: no global round trip, no atomics.
Same arguments and semantics as attention_decode (B sequences, T <= 8 queries, GQA,
window, softcap; the live length read from `pos`), for contexts up to MAX_KEYS.
Numpy reference: attention.attention_ref.
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.attention.attention_decode_short_post import make_post
from impnb.kernels.attention.attention_decode import HEAD_DIMS, LOG2E, MAX_T, NEG, row_group, unpack_halves
from impnb.kernels.attention.kv_cache import PAGE_SIZES
from impnb.kernels.common.warp import SIMULATOR, shfl_idx, shfl_xor, warp_sum
from impnb.kernels.gemv.quant_x import GROUP, QuantX, store_group
from impnb.kernels.attention.rope import SIN_COS_STACK
from impnb.launch import launch

WARPS = (4, 8, 16)       # block sizes built (warps)
SPLITS = (1, 2, 4, 8)    # blocks a query row (a thread-block cluster when > 1)
MAX_KEYS = 4096          # keys a row sees at most; longer contexts take the split kernel
MAX_PAGES = MAX_KEYS // min(PAGE_SIZES) + 1
QS = 36                  # floats per 32-dim slice of the query row in shared (4 pad: no bank conflict)
SEEN = np.float32(-5e29)  # scores above this are of keys the row sees (the others are NEG)
SMEM_ALIGN = ptx.SMEM_ALIGN  # a global, so numba types it as a literal
_ZERO = np.float32(0)


def turn_keys(D: int) -> int:
    """Keys a warp scores at a time: each key's K row takes D/32 lanes (64 bytes each)."""
    return 32 // (D // 32)


def _make_kernel(D: int, NW: int, capped: bool, post: bool, S: int, quant: bool = False):
    NT = NW * 32
    LPK = D // 32            # score lanes per key: 32 dims each
    KI = 32 // LPK           # keys a warp turn
    LPV = D // 8             # PV lanes per key: 8 dims each
    KPV = 32 // LPV          # PV key slots per warp
    KPS = KI // KPV          # keys per slot per turn (4)
    BK = NW * KI             # keys a block turn
    WPR = D // 2             # u32 words per K or V row
    WACC = NW * D            # floats of the warps' outputs in shared
    QW = LPK * QS            # floats of the query row in shared
    FW = MAX_T * WPR if post else 4  # u32 words of the step's K rows (and of its V rows) in shared
    CW = D + 2 if S > 1 else 1       # floats of the block's part for the cluster merge
    OW = D if quant else 1           # floats of the output row in shared (quant)
    KEY_OFFS = tuple(1 << i for i in range(int(math.log2(LPK))))        # lanes of one key
    TURN_OFFS = tuple(LPK << i for i in range(int(math.log2(KI))))      # keys of one turn
    SLOT_OFFS = tuple(LPV << i for i in range(int(math.log2(KPV))))     # PV key slots
    assert KPS == 4 and NT >= D and S in SPLITS

    if KPV > 1:
        @cuda.jit(device=True, inline=True)
        def merge_slots(acc):
            # -- the warp's key slots summed by shuffles (they share the warp's running max) --
            for off in SLOT_OFFS:
                for i in range(8):
                    acc[i] += shfl_xor(acc[i], off)
    else:
        @cuda.jit(device=True, inline=True)
        def merge_slots(acc):
            pass  # one key slot per warp

    @cuda.jit(device=True, inline=True)
    def row_of(pages, key, p0, shift, Hkv, kh):
        # -- u32 index of key's row of KV head kh in the pools --
        page = pages[(key >> shift) - p0]
        return (((page << shift) + (key & ((1 << shift) - 1))) * Hkv + kh) * WPR

    @cuda.jit(device=True, inline=True)
    def fresh_k(kr, kfw, key, hi, fresh, dl):
        # -- post: this lane's 16 words of key's K row from kfw if it is one of the step's --
        if key >= fresh and key < hi:
            src = (key - fresh) * WPR + dl * 16
            for i in range(4):
                w0, w1, w2, w3 = ptx.ld_shared_v4_u32(ptx.smem_addr(kfw, src + 4 * i))
                kr[4 * i] = w0
                kr[4 * i + 1] = w1
                kr[4 * i + 2] = w2
                kr[4 * i + 3] = w3

    @cuda.jit(device=True, inline=True)
    def fresh_v_words(vfw, key, fresh, dv):
        # -- post: this lane's 4 words of the step's key's V row, from vfw --
        return ptx.ld_shared_v4_u32(ptx.smem_addr(vfw, (key - fresh) * WPR + dv * 4))

    @cuda.jit(device=True, inline=True)
    def fresh_v(vr, vfw, key0, hi, fresh, dv):
        # -- post: this lane's 4 words of the V rows of keys key0 .. key0 + KPS - 1 of the step --
        for u in range(KPS):
            key = key0 + u
            if key >= fresh and key < hi:
                w0, w1, w2, w3 = fresh_v_words(vfw, key, fresh, dv)
                vr[4 * u] = w0
                vr[4 * u + 1] = w1
                vr[4 * u + 2] = w2
                vr[4 * u + 3] = w3

    @cuda.jit(device=True, inline=True)
    def load_k(kr, k_words, kfw, pages, key, hi, fresh, p0, shift, Hkv, kh, dl):
        # -- this lane's 32 dims (16 words) of key's K row; zeros past hi; post: the step's
        # keys (from fresh on) from kfw --
        if key < hi:
            if post and key >= fresh:
                fresh_k(kr, kfw, key, hi, fresh, dl)
            else:
                src = row_of(pages, key, p0, shift, Hkv, kh) + dl * 16
                for i in range(4):
                    w0, w1, w2, w3 = ptx.ld_global_v4_u32(k_words, src + 4 * i)
                    kr[4 * i] = w0
                    kr[4 * i + 1] = w1
                    kr[4 * i + 2] = w2
                    kr[4 * i + 3] = w3
        else:
            for i in range(16):
                kr[i] = 0

    @cuda.jit(device=True, inline=True)
    def load_v(vr, v_words, vfw, pages, key0, hi, fresh, p0, shift, Hkv, kh, dv):
        # -- this lane's 8 dims (4 words) of the V rows of its slot's KPS keys from key0, as load_k --
        for u in range(KPS):
            key = key0 + u
            if key < hi:
                if post and key >= fresh:
                    w0, w1, w2, w3 = fresh_v_words(vfw, key, fresh, dv)
                else:
                    w0, w1, w2, w3 = ptx.ld_global_v4_u32(
                        v_words, row_of(pages, key, p0, shift, Hkv, kh) + dv * 4)
                vr[4 * u] = w0
                vr[4 * u + 1] = w1
                vr[4 * u + 2] = w2
                vr[4 * u + 3] = w3
            else:
                for i in range(4):
                    vr[4 * u + i] = 0

    @cuda.jit(device=True, inline=True)
    def quant_out(ov, xq, xd, xs, row, c0, tid):
        # -- quant: the block's output row (ov) in int8 for the dp4a GEMV after it, as quantize_x
        # writes columns c0 .. c0 + D - 1 of x row `row` (a thread a group of 16) --
        cuda.syncthreads()
        if tid < D // GROUP:
            v = cuda.local.array(GROUP, types.float32)
            for j in range(GROUP):
                v[j] = ov[tid * GROUP + j]
            store_group(v, xq, xd, xs, row, c0 // GROUP + tid)

    post_rows, write_fresh = make_post(D, NW, QS)

    # grid (Hkv * g * T, B), block NT. A block owns query row r = t * g + j (token t, head
    # kh * g + j) and its keys [lo, hi). Warp w takes turns at keys lo + (n * NW + w) * KI + kk,
    # kk < KI: lane (kk, dl) scores its 32 dims of key kk (q pre-scaled in shared), reduced
    # over the key's LPK lanes; the warp's running max m and the lane's share of the sum l are
    # rescaled; lane (slot, dv) adds p * V for its 8 dims over its slot's KPS keys, p fetched from
    # the key's lanes by shuffle. K and V of the next turn load into registers meanwhile. At the
    # end slots merge by shuffles and warps through shared memory.
    # S > 1: a cluster of S blocks (grid z) shares the row, block z taking the z-th of S equal
    # parts of [lo, hi); each leaves its (max, sum, unnormalized row) in shared memory and the
    # cluster's block 0 merges them through distributed shared memory (ld.shared::cluster).
    # Before griddepcontrol.wait only what no kernel of the step writes is read: pos, block_table
    # and the first turn's cache rows of the keys before the step's (pos[b, 0] on); without post
    # the step's rows of that turn are read after it.
    # post: the kernel also does qkv_post's work for the step (see post_rows): q, k_new, v_new
    # come raw from the Q|K|V GEMV, the step's keys are read from shared memory, and the block of
    # row 0 writes them to the cache.
    @cuda.jit(device=True, inline=True)
    def attend(q, k_words, v_words, block_table, pos, out, scale, window, softcap, shift,
               k_new, v_new, inv_freq, neox, q_norm, k_norm, eps, use_norm, xq, xd, xs):
        b = cuda.blockIdx.y
        Hkv = k_words.shape[2]
        g, kh, r0, _ = row_group(q, k_words, 1, cuda.blockIdx.x)
        t = r0 // g
        h = kh * g + r0 - t * g
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32

        split = cuda.blockIdx.z
        pages = cuda.shared.array(MAX_PAGES, types.int32)
        wacc = cuda.shared.array(WACC, types.float32)
        wm = cuda.shared.array(NW, types.float32)
        wl = cuda.shared.array(NW, types.float32)
        qs = cuda.shared.array(QW, types.float32, alignment=SMEM_ALIGN)
        kfw = cuda.shared.array(FW, types.uint32, alignment=SMEM_ALIGN)
        vfw = cuda.shared.array(FW, types.uint32, alignment=SMEM_ALIGN)
        cres = cuda.shared.array(CW, types.float32)
        ov = cuda.shared.array(OW, types.float32)

        # -- the row's key range and its pages --
        qp = pos[b, t]
        hi = qp + 1
        lo = max(qp - window + 1, 0) if window > 0 else 0
        hi = min(hi, lo + MAX_KEYS)
        if S > 1:  # this block's part of the keys
            part = (hi - lo + S - 1) // S
            lo = min(lo + split * part, hi)
            hi = min(lo + part, hi)
        p0 = lo >> shift
        for i in range(tid, ((hi - 1) >> shift) - p0 + 1, NT):
            pages[i] = block_table[b, p0 + i]
        fresh = pos[b, 0]  # keys from here on are the step's (post: in kfw / vfw)
        cuda.syncthreads()

        kk = lane // LPK
        dl = lane - kk * LPK
        slot = lane // LPV
        dv = lane - slot * LPV
        kr = cuda.local.array(16, types.uint32)
        kn = cuda.local.array(16, types.uint32)
        vr = cuda.local.array(16, types.uint32)
        vn = cuda.local.array(16, types.uint32)
        vf = cuda.local.array(8, types.float32)
        acc = cuda.local.array(8, types.float32)
        key0 = lo + warp * KI
        # the cache rows before the step's are no kernel's of the step: read them early
        load_k(kr, k_words, kfw, pages, key0 + kk, min(hi, fresh), fresh, p0, shift, Hkv, kh, dl)
        load_v(vr, v_words, vfw, pages, key0 + slot * KPS, min(hi, fresh), fresh, p0, shift,
               Hkv, kh, dv)
        ptx.grid_dep_wait()  # programmatic launch: q and the newest K/V are the last kernels'
        ptx.grid_dep_launch()
        if post:
            post_rows(q, k_new, v_new, pos, inv_freq, neox, q_norm, k_norm, eps, use_norm, scale,
                      b, t, h, kh, qs, kfw, vfw, wacc, tid)
            if r0 == 0 and split == 0:
                write_fresh(k_words, v_words, kfw, vfw, block_table, pos, b, kh, shift,
                            q.shape[1], tid)
            fresh_k(kr, kfw, key0 + kk, hi, fresh, dl)
            fresh_v(vr, vfw, key0 + slot * KPS, hi, fresh, dv)
        else:
            if tid < D:  # the query row, pre-scaled, as 32-dim slices padded to QS floats
                qs[(tid // 32) * QS + tid % 32] = q[b, t, h, tid] * scale
            cuda.syncthreads()
            if key0 + kk >= fresh:  # the step's rows, written by the kernel just before
                load_k(kr, k_words, kfw, pages, key0 + kk, hi, fresh, p0, shift, Hkv, kh, dl)
            if key0 + slot * KPS + KPS > fresh:
                load_v(vr, v_words, vfw, pages, key0 + slot * KPS, hi, fresh, p0, shift, Hkv, kh, dv)
        for i in range(8):
            acc[i] = _ZERO
        m = NEG
        l = _ZERO
        n_turns = (hi - lo + BK - 1) // BK
        for n in range(n_turns):
            if n + 1 < n_turns:
                load_k(kn, k_words, kfw, pages, key0 + BK + kk, hi, fresh, p0, shift, Hkv, kh, dl)
                load_v(vn, v_words, vfw, pages, key0 + BK + slot * KPS, hi, fresh, p0, shift, Hkv,
                       kh, dv)
            # -- score of key key0 + kk; the turn's max --
            s = _ZERO
            for i in range(8):
                x0, x1, x2, x3 = ptx.ld_shared_v4_u32(ptx.smem_addr(qs, dl * QS + 4 * i))
                s += (qi.as_f32(x0) * qi.f16_to_f32(kr[2 * i] & qi.HALF)
                      + qi.as_f32(x1) * qi.f16_to_f32(kr[2 * i] >> 16)
                      + qi.as_f32(x2) * qi.f16_to_f32(kr[2 * i + 1] & qi.HALF)
                      + qi.as_f32(x3) * qi.f16_to_f32(kr[2 * i + 1] >> 16))
            for off in KEY_OFFS:
                s += shfl_xor(s, off)
            if capped:
                s = softcap * math.tanh(s / softcap)
            s = s * LOG2E if key0 + kk < hi else NEG
            mc = s
            for off in TURN_OFFS:
                mc = max(mc, shfl_xor(mc, off))
            m_new = max(m, mc)
            alpha = ptx.ex2_approx_ftz(m - m_new)
            p = ptx.ex2_approx_ftz(s - m_new) if s > SEEN else _ZERO
            l = l * alpha + (p if dl == 0 else _ZERO)
            m = m_new
            # -- p * V over the slot's keys --
            for i in range(8):
                acc[i] *= alpha
            for u in range(KPS):
                pu = shfl_idx(p, (slot * KPS + u) * LPK)
                unpack_halves(vr[4 * u], vr[4 * u + 1], vr[4 * u + 2], vr[4 * u + 3], vf)
                for i in range(8):
                    acc[i] += pu * vf[i]
            key0 += BK
            for i in range(16):
                kr[i] = kn[i]
                vr[i] = vn[i]

        # -- slots merged by shuffles, warps through shared memory --
        l = warp_sum(l)
        merge_slots(acc)
        if lane < LPV:
            for i in range(8):
                wacc[warp * D + dv * 8 + i] = acc[i]
        if lane == 0:
            wm[warp] = m
            wl[warp] = l
        cuda.syncthreads()
        if tid < D:
            mx = NEG
            for w in range(NW):
                mx = max(mx, wm[w])
            num = _ZERO
            den = _ZERO
            for w in range(NW):
                c = ptx.ex2_approx_ftz(wm[w] - mx)
                num += wacc[w * D + tid] * c
                den += wl[w] * c
            if S == 1:
                out[b, t, h, tid] = num / den
                if quant:
                    ov[tid] = num / den
            else:
                cres[tid] = num
                if tid == 0:
                    cres[D] = mx
                    cres[D + 1] = den
        if S > 1:
            # -- the cluster's parts merged by its block 0 (the others wait until it has read) --
            ptx.cluster_sync()
            if split == 0 and tid < D:
                mx = NEG
                for z in range(S):
                    mx = max(mx, ptx.ld_cluster_f32(ptx.smem_addr(cres, D), z))
                num = _ZERO
                den = _ZERO
                for z in range(S):
                    c = ptx.ex2_approx_ftz(ptx.ld_cluster_f32(ptx.smem_addr(cres, D), z) - mx)
                    num += ptx.ld_cluster_f32(ptx.smem_addr(cres, tid), z) * c
                    den += ptx.ld_cluster_f32(ptx.smem_addr(cres, D + 1), z) * c
                out[b, t, h, tid] = num / den
                if quant:
                    ov[tid] = num / den
            if quant and split == 0:
                quant_out(ov, xq, xd, xs, b * q.shape[1] + t, h * D, tid)
            ptx.cluster_sync()
        elif quant:
            quant_out(ov, xq, xd, xs, b * q.shape[1] + t, h * D, tid)

    if post:
        def short_kernel(q, k_words, v_words, block_table, pos, out, scale, window, softcap, shift,
                         xq, xd, xs, k_new, v_new, inv_freq, neox, q_norm, k_norm, eps, use_norm):
            attend(q, k_words, v_words, block_table, pos, out, scale, window, softcap, shift,
                   k_new, v_new, inv_freq, neox, q_norm, k_norm, eps, use_norm, xq, xd, xs)
    else:
        def short_kernel(q, k_words, v_words, block_table, pos, out, scale, window, softcap, shift,
                         xq, xd, xs):
            attend(q, k_words, v_words, block_table, pos, out, scale, window, softcap, shift,
                   q, q, out[0, 0], 0, q[0, 0, 0], q[0, 0, 0], scale, 0,  # post's arguments unread
                   xq, xd, xs)

    short_kernel.__name__ = (f"_decode_short_d{D}_w{NW}{'_softcap' if capped else ''}"
                             f"{'_post' if post else ''}{f'_s{S}' if S > 1 else ''}{'_quant' if quant else ''}_kernel")
    cap = {} if SIMULATOR else {"max_registers": min(255, 65536 // NT)}  # a block fits an SM
    return cuda.jit(short_kernel, **cap)


# qkv_post fused (post) without softcap, as decode runs it; softcap and post variants up to 8
# warps: at 16 the 128-register cap makes them spill; clusters of S blocks a row without softcap;
# the output's int8 form (quant) without softcap
KERNEL_KEYS = tuple(
    (D, NW, capped, post, S, quant)
    for D in HEAD_DIMS for NW in WARPS if NW * 32 >= D
    for capped, post in (((False, False), (True, False), (False, True)) if NW <= 8 else ((False, False),))
    for S in (SPLITS if not capped else (1,))
    for quant in ((False,) if capped else (False, True)))


@lru_cache(maxsize=None)
def short_kernel(key: tuple):
    """The kernel of KERNEL_KEYS' key (D, NW, capped, post, S, quant), made at its first use."""
    return _make_kernel(*key)


# ---------------------------------------------------------------- host side

def attention_decode_short(q, k_pool, v_pool, block_table, pos, out, scale: float,
                           window: int | None, softcap: float | None, stream,
                           warps: int | None = None, post: tuple | None = None, splits: int = 1,
                           xq: QuantX | None = None) -> None:
    """out (B, T, H, D) = attention of q (B, T, H, D) float32 over the paged fp16 cache, for
    contexts up to MAX_KEYS keys (a row sees at most MAX_KEYS keys; more are not read).

    k_pool, v_pool (n_pages, page_size, Hkv, D) float16; block_table (B, max_pages) int32;
    pos (B, T) int32, the positions of the queries, whose K/V are already in the cache.
    window None or > 0; softcap None or > 0. One sequence may pass q/out (T, H, D), pos (T,),
    block_table (max_pages,). warps: the block size, one of WARPS; by default 16 (8 with softcap
    or post): 16 warps win from 512 keys on; below, 8 and 16 are within 10% of each other.
    Clusters pay from 1024 keys, where 8 blocks a row run Gemma3 and SmolLM2 2-6x faster than
    one; at head dim 128 2 blocks measured best (gpu/plan.py picks; figures in
    docs/EXPERIMENTS.md, 'Decode attention').

    post = (k_new, v_new, inv_freq, neox, q_norm, k_norm, eps): qkv_post's work fused in front,
    its arguments as there. q is then raw from the Q|K|V GEMV, k_new, v_new (B, T, Hkv, D)
    float32 the step's raw K and V, which the kernel normalizes, rotates and writes to the
    cache; the step's T tokens must sit at consecutive positions pos[b, 0] + i.
    splits (SPLITS): blocks a query row, a thread-block cluster that merges in shared memory.
    xq (quant_x.QuantX of B * T rows, H * D columns): the output's int8 form is written there too,
    equal to quantize_x's of out as (B * T, H * D) (one kernel fewer before a dp4a GEMV of it).
    """
    if q.ndim == 3:
        q, out, pos = q.reshape(1, *q.shape), out.reshape(1, *out.shape), pos.reshape(1, q.shape[0])
        block_table = block_table.reshape(1, block_table.size)
        if post:
            post = (post[0].reshape(1, *post[0].shape), post[1].reshape(1, *post[1].shape), *post[2:])
    for a, dt, nd, name in ((q, np.float32, 4, "q"), (out, np.float32, 4, "out"),
                            (k_pool, np.float16, 4, "k_pool"), (v_pool, np.float16, 4, "v_pool"),
                            (block_table, np.int32, 2, "block_table"), (pos, np.int32, 2, "pos")):
        assert a.dtype == dt and a.ndim == nd and a.is_c_contiguous(), \
            f"{name}: C-contiguous {np.dtype(dt)} with {nd} dims expected, got {a.dtype} {a.shape}"
    B, T, H, D = q.shape
    Hkv = k_pool.shape[2]
    assert out.shape == q.shape and pos.shape == (B, T) and block_table.shape[0] == B
    assert D in HEAD_DIMS and k_pool.shape[3] == D and v_pool.shape == k_pool.shape, "head dims"
    assert k_pool.shape[1] in PAGE_SIZES and H % Hkv == 0 and 1 <= T <= MAX_T, "pages, heads or T"
    assert window is None or window > 0, "window must be None or positive"
    assert softcap is None or softcap > 0, "softcap must be None or positive"
    warps = warps or (8 if softcap or post or splits > 1 else 16)
    key = (D, warps, bool(softcap), bool(post), splits, xq is not None)
    assert key in KERNEL_KEYS, f"warps {warps} at head dim {D}, softcap {softcap}, post {bool(post)}, splits {splits}"
    if xq is not None:
        assert xq.q.shape == (B * T, H * D // 4) and xq.d.shape == xq.s.shape == (B * T, H * D // GROUP)
    flat = out.reshape(B * T * H, D)
    xq = xq or (flat.view(np.uint32), flat, flat)  # unread without quant
    args = (q, k_pool.view(np.uint32), v_pool.view(np.uint32), block_table, pos, out,
            np.float32(scale), np.int32(window or 0), np.float32(softcap or 0.0),
            np.int32(k_pool.shape[1].bit_length() - 1), *xq)
    if post:
        k_new, v_new, inv_freq, neox, q_norm, k_norm, eps = post
        for a, name in ((k_new, "k_new"), (v_new, "v_new")):
            assert a.dtype == np.float32 and a.shape == (B, T, Hkv, D) and a.is_c_contiguous(), \
                f"{name}: (B, T, Hkv, D) float32 expected, got {a.dtype} {a.shape}"
        assert 2 * inv_freq.shape[1] <= D and inv_freq.dtype == np.float32
        use_norm = q_norm is not None
        if use_norm:
            assert q_norm.shape == (D,) and k_norm.shape == (D,)
        else:
            q_norm = k_norm = inv_freq[0]  # unread
        args += (k_new, v_new, inv_freq, np.int32(bool(neox)), q_norm, k_norm, np.float32(eps),
                 np.int32(use_norm))
    launch(short_kernel(key), (H * T, B, splits), warps * 32, stream, *args,
           cluster=(1, 1, splits) if splits > 1 else None)


_Q = types.float32[:, :, :, ::1]
_POOL = types.uint32[:, :, :, ::1]
_I2 = types.int32[:, ::1]
_F1 = types.float32[::1]
_SIG = (_Q, _POOL, _POOL, _I2, _I2, _Q, types.float32, types.int32, types.float32, types.int32,
        types.uint32[:, ::1], types.float32[:, ::1], types.float32[:, ::1])
_POST_SIG = _SIG + (_Q, _Q, types.float32[:, ::1], types.int32, _F1, _F1, types.float32, types.int32)


# Clusters in the build checks: 8 blocks (the most partials to merge) at each head dim, post and
# quant; 2 blocks at each head dim, with and without post and quant (not every product). The int8
# output at 128 and at Gemma3's 256 with qkv_post fused.
CLUSTER_2 = ((64, False, False), (64, True, False), (128, True, True), (256, True, False))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(short_kernel(key), _POST_SIG if post else _SIG,
             {"max_registers": min(255, 65536 // (nw * 32)),
              "stack_bytes": SIN_COS_STACK if post else 0,
              "ptx_contains": ("barrier.cluster.arrive", "mapa.shared::cluster") if S > 1 else ()})
            for key in KERNEL_KEYS for d, nw, _, post, S, quant in (key,)
            if (S == 1 or (nw == 8 and (S == 8 or (S == 2 and (d, post, quant) in CLUSTER_2))))
            and (not quant or (d == 128 and nw in (8, 16)) or (d == 256 and post and S == 1))]
