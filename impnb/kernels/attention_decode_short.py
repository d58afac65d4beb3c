"""Decode attention for short contexts: one block reads all the keys of its query rows, no splits.

At the contexts of a chat turn (tens to a few hundred keys) the split kernel of attention_decode
is latency-bound: its cp.async ring, split bookkeeping and cross-split merge cost more than the
few KB of K/V it reads. Here a block owns RM query rows of one KV head and walks the keys in
chunks: scores with D/32 lanes a key, a block-wide online softmax per row, PV with D/8 lanes a
key from V staged in shared memory; the next chunk's K and V are in flight meanwhile. Same
arguments and semantics as attention_decode (B sequences, T <= 8 queries, GQA, window,
softcap; the live length read from `pos`), for contexts up to MAX_KEYS.
Numpy reference: attention.attention_ref.
"""

import math

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels import ptx
from impnb.kernels import quant_intrinsics as qi
from impnb.kernels.attention_decode import (HEAD_DIMS, LOG2E, MAX_T, NEG, row_group, split_range,
                                           unpack_halves)
from impnb.kernels.kv_cache import PAGE_SIZES
from impnb.kernels.norm import shfl_xor, warp_max, warp_sum
from impnb.launch import launch

NT = 256                 # threads per block
NW = NT // 32
MAX_KEYS = 4096          # keys a block sees at most; longer contexts take the split kernel
MAX_PAGES = MAX_KEYS // min(PAGE_SIZES) + 1
ROW_TILES = {64: (1, 2, 4, 8), 128: (1, 2, 4, 8), 256: (1, 2, 4)}  # query rows a block
QS = 36                  # floats per 32-dim slice of a query row in shared (4 pad: no bank conflict)
SEEN = np.float32(-5e29)  # scores above this are of keys a row sees (masked ones are NEG)
SMEM_ALIGN = ptx.SMEM_ALIGN
_ZERO = np.float32(0)


def chunk_keys(D: int) -> int:
    """Keys a chunk: each key's K row is scored by D/32 lanes (64 bytes each)."""
    return NT // (D // 32)


def _make_kernel(D: int, RM: int, capped: bool):
    LPK = D // 32            # score lanes per key
    CK = NT // LPK           # keys per chunk
    WPR = D // 2             # u32 words per K or V row
    LPV = D // 8             # PV lanes per key: 8 dims each
    KPV = 32 // LPV          # key slots per warp in PV
    SLOTS = NW * KPV
    KPS = CK // SLOTS        # keys per slot per chunk
    VW = CK * WPR            # u32 words of a V chunk
    CPT = VW // 4 // NT      # 16-byte copies per thread per V chunk
    QW = LPK * QS            # floats per query row in shared
    VBUF = 2 * VW            # two V stages
    QBUF = RM * QW
    KEY_OFFS = tuple(1 << i for i in range(int(math.log2(LPK))))
    SLOT_OFFS = tuple(LPV << i for i in range(int(math.log2(KPV))))
    assert NW * RM * D <= VBUF and RM <= NW and CK % 32 == 0 and CPT * NT * 4 == VW

    if KPV > 1:
        @cuda.jit(device=True, inline=True)
        def merge_slots(acc):
            # -- the warp's key slots summed by shuffles (they share each row's running max) --
            for off in SLOT_OFFS:
                for r in range(RM):
                    for i in range(8):
                        acc[r, i] += shfl_xor(acc[r, i], off)
    else:
        @cuda.jit(device=True, inline=True)
        def merge_slots(acc):
            pass  # one key slot per warp

    @cuda.jit(device=True, inline=True)
    def kv_src(pages, key, p0, shift, Hkv, kh):
        # -- u32 index of key's row of KV head kh in the pools --
        page = pages[(key >> shift) - p0]
        return ((page << shift) + (key & ((1 << shift) - 1))) * Hkv + kh

    @cuda.jit(device=True, inline=True)
    def load_k(kr, k_words, pages, key, hi, p0, shift, Hkv, kh, dl):
        # -- this lane's 32 dims (16 words) of key's K row into kr; zeros past hi --
        if key < hi:
            src = kv_src(pages, key, p0, shift, Hkv, kh) * WPR + dl * 16
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
    def issue_v(vbuf, stage, v_words, pages, c0, hi, p0, shift, Hkv, kh, tid):
        # -- cp.async the V rows of keys c0 .. c0 + CK into stage; zeros past hi --
        for u in range(CPT):
            piece = tid + u * NT          # 16-byte piece of the chunk
            kc = piece // (WPR // 4)
            key = c0 + kc
            src = 0
            n = 0
            if key < hi:
                src = kv_src(pages, key, p0, shift, Hkv, kh) * WPR + (piece - kc * (WPR // 4)) * 4
                n = 16
            ptx.cp_async_16_zfill(ptx.smem_addr(vbuf, stage * VW + piece * 4), v_words, src, n)
        ptx.cp_async_commit()

    # grid (Hkv * n_row_groups, B), block 256 (8 warps). A block owns RM query rows r = t * g + j
    # (token t, head kh * g + j) of KV head kh and every key they see, [lo, hi), in chunks of CK.
    # Per chunk: lane (key kk, slice dl) scores its 32 dims of K (loaded into registers one chunk
    # ahead) against every row's q (shared, pre-scaled), reduced over the key's LPK lanes into
    # ps[r][kk] (base 2; NEG where row r does not see the key); warp r turns row r's scores into
    # probabilities against its running max ms[r] and rescales its sum ls[r]; then lane (slot, dv)
    # accumulates p * V over KPS keys of the chunk for its 8 dims of every row, V cp.async'd into
    # vbuf one chunk ahead. At the end slots merge by shuffles, warps through vbuf.
    # Before griddepcontrol.wait only what no kernel of the step writes is read: pos, block_table.
    def short_kernel(q, k_words, v_words, block_table, pos, out, scale, window, softcap, shift):
        b = cuda.blockIdx.y
        Hkv = k_words.shape[2]
        g, kh, r0, nrows = row_group(q, k_words, RM, cuda.blockIdx.x)
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32

        vbuf = cuda.shared.array(VBUF, types.float32, alignment=SMEM_ALIGN)
        qs = cuda.shared.array(QBUF, types.float32, alignment=SMEM_ALIGN)
        ps = cuda.shared.array((RM, CK), types.float32)
        pages = cuda.shared.array(MAX_PAGES, types.int32)
        row_pos = cuda.shared.array(RM, types.int32)
        ms = cuda.shared.array(RM, types.float32)
        ls = cuda.shared.array(RM, types.float32)
        alpha = cuda.shared.array(RM, types.float32)

        # -- the rows' key range and its pages --
        lo, hi, _, _ = split_range(pos, b, r0, nrows, g, window, 1, 1, 1)
        hi = min(hi, lo + MAX_KEYS)
        p0 = lo >> shift
        for i in range(tid, ((hi - 1) >> shift) - p0 + 1, NT):
            pages[i] = block_table[b, p0 + i]
        if tid < RM:
            row_pos[tid] = pos[b, (r0 + tid) // g] if tid < nrows else -1
            ms[tid] = NEG
            ls[tid] = _ZERO
        ptx.grid_dep_wait()  # programmatic launch: q and the newest K/V are the last kernels'
        ptx.grid_dep_launch()

        # -- query rows, pre-scaled, as 32-dim slices padded to QS floats; rows past nrows zero --
        for i in range(tid, RM * D, NT):
            r = i // D
            d = i - r * D
            v = _ZERO
            if r < nrows:
                t = (r0 + r) // g
                v = q[b, t, kh * g + r0 + r - t * g, d] * scale
            qs[r * QW + (d // 32) * QS + d % 32] = v
        cuda.syncthreads()

        kk = tid // LPK
        dl = tid - kk * LPK
        slot = warp * KPV + lane // LPV
        dv = lane % LPV
        kr = cuda.local.array(16, types.uint32)
        kn = cuda.local.array(16, types.uint32)
        kf = cuda.local.array(32, types.float32)
        vf = cuda.local.array(8, types.float32)
        acc = cuda.local.array((RM, 8), types.float32)
        for r in range(RM):
            for i in range(8):
                acc[r, i] = _ZERO
        n_chunks = (hi - lo + CK - 1) // CK
        issue_v(vbuf, 0, v_words, pages, lo, hi, p0, shift, Hkv, kh, tid)
        load_k(kr, k_words, pages, lo + kk, hi, p0, shift, Hkv, kh, dl)
        for j in range(n_chunks):
            c0 = lo + j * CK
            if j + 1 < n_chunks:
                issue_v(vbuf, (j + 1) & 1, v_words, pages, c0 + CK, hi, p0, shift, Hkv, kh, tid)
                load_k(kn, k_words, pages, c0 + CK + kk, hi, p0, shift, Hkv, kh, dl)
            # -- scores of key c0 + kk for every row --
            key = c0 + kk
            for i in range(16):
                kf[2 * i] = qi.f16_to_f32(kr[i] & qi.HALF)
                kf[2 * i + 1] = qi.f16_to_f32(kr[i] >> 16)
            for r in range(RM):
                s = _ZERO
                for h4 in range(4):
                    qa = ptx.smem_addr(qs, r * QW + dl * QS + 8 * h4)
                    x0, x1, x2, x3 = ptx.ld_shared_v4_u32(qa)
                    x4, x5, x6, x7 = ptx.ld_shared_v4_u32(qa + 16)
                    k8 = 8 * h4
                    s += (qi.as_f32(x0) * kf[k8] + qi.as_f32(x1) * kf[k8 + 1]
                          + qi.as_f32(x2) * kf[k8 + 2] + qi.as_f32(x3) * kf[k8 + 3])
                    s += (qi.as_f32(x4) * kf[k8 + 4] + qi.as_f32(x5) * kf[k8 + 5]
                          + qi.as_f32(x6) * kf[k8 + 6] + qi.as_f32(x7) * kf[k8 + 7])
                for off in KEY_OFFS:
                    s += shfl_xor(s, off)
                if capped:
                    s = softcap * math.tanh(s / softcap)
                qp = row_pos[r]
                seen = (key < hi) & (key <= qp) & ((window <= 0) | (qp - key < window))
                if dl == 0:
                    ps[r, kk] = s * LOG2E if seen else NEG
            cuda.syncthreads()
            # -- warp r: row r's probabilities against its new running max --
            if warp < RM:
                r = warp
                mc = NEG
                for i in range(lane, CK, 32):
                    mc = max(mc, ps[r, i])
                mc = warp_max(mc)
                m_old = ms[r]
                m_new = max(m_old, mc)
                part = _ZERO
                for i in range(lane, CK, 32):
                    s = ps[r, i]
                    p = ptx.ex2_approx_ftz(s - m_new) if s > SEEN else _ZERO
                    ps[r, i] = p
                    part += p
                part = warp_sum(part)
                if lane == 0:
                    a = ptx.ex2_approx_ftz(m_old - m_new)
                    alpha[r] = a
                    ls[r] = ls[r] * a + part
                    ms[r] = m_new
            if j + 1 < n_chunks:
                ptx.cp_async_wait_group(1)
            else:
                ptx.cp_async_wait_group(0)
            cuda.syncthreads()
            # -- p * V for this lane's 8 dims over its slot's keys --
            for r in range(RM):
                a = alpha[r]
                for i in range(8):
                    acc[r, i] *= a
            for u in range(KPS):
                kc = slot + u * SLOTS
                w0, w1, w2, w3 = ptx.ld_shared_v4_u32(
                    ptx.smem_addr(vbuf, (j & 1) * VW + kc * WPR + dv * 4))
                unpack_halves(w0, w1, w2, w3, vf)
                for r in range(RM):
                    p = ps[r, kc]
                    for i in range(8):
                        acc[r, i] += p * vf[i]
            cuda.syncthreads()  # ps and this V stage are refilled next chunk
            for i in range(16):
                kr[i] = kn[i]

        # -- slots merged by shuffles, warps through vbuf --
        merge_slots(acc)
        if lane < LPV:
            for r in range(RM):
                for i in range(8):
                    vbuf[(warp * RM + r) * D + dv * 8 + i] = acc[r, i]
        cuda.syncthreads()
        for i in range(tid, nrows * D, NT):
            r = i // D
            d = i - r * D
            s = _ZERO
            for w in range(NW):
                s += vbuf[(w * RM + r) * D + d]
            t = (r0 + r) // g
            out[b, t, kh * g + r0 + r - t * g, d] = s / ls[r]

    short_kernel.__name__ = f"_decode_short_d{D}_r{RM}{'_softcap' if capped else ''}_kernel"
    return cuda.jit(short_kernel)


_KERNELS = {(D, RM, capped): _make_kernel(D, RM, capped)
            for D in HEAD_DIMS for RM in ROW_TILES[D] for capped in (False, True)}


# ---------------------------------------------------------------- host side

def row_tile(n_head: int, n_head_kv: int, T: int, head_dim: int) -> int:
    """Query rows per block: one. Measured on the H100 (2026-11-23, 131 keys): 1 row a block
    4.9 / 10.2 / 6.6 µs against 7.7 / 19.5 / 17.8 µs for the whole head group (SmolLM2, Gemma3,
    Qwen3-30B-A3B): at short contexts the block's compute, not K/V reads from L2, is the cost."""
    return 1


def attention_decode_short(q, k_pool, v_pool, block_table, pos, out, scale: float,
                           window: int | None, softcap: float | None, stream,
                           rows_per_block: int | None = None) -> None:
    """out (B, T, H, D) = attention of q (B, T, H, D) float32 over the paged fp16 cache, for
    contexts up to MAX_KEYS keys (a row sees at most MAX_KEYS keys; more are not read).

    k_pool, v_pool (n_pages, page_size, Hkv, D) float16; block_table (B, max_pages) int32;
    pos (B, T) int32, the positions of the queries, whose K/V are already in the cache.
    window None or > 0; softcap None or > 0. One sequence may pass q/out (T, H, D), pos (T,),
    block_table (max_pages,). rows_per_block: one of ROW_TILES[D] (default row_tile's: 1).
    """
    if q.ndim == 3:
        q, out, pos = q.reshape(1, *q.shape), out.reshape(1, *out.shape), pos.reshape(1, q.shape[0])
        block_table = block_table.reshape(1, block_table.size)
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
    rm = rows_per_block or row_tile(H, Hkv, T, D)
    assert rm in ROW_TILES[D], f"rows_per_block {rm}"
    n_groups = -(-(H // Hkv * T) // rm)
    launch(_KERNELS[(D, rm, bool(softcap))], (Hkv * n_groups, B), NT, stream,
           q, k_pool.view(np.uint32), v_pool.view(np.uint32), block_table, pos, out,
           np.float32(scale), np.int32(window or 0), np.float32(softcap or 0.0),
           np.int32(k_pool.shape[1].bit_length() - 1))


_Q = types.float32[:, :, :, ::1]
_POOL = types.uint32[:, :, :, ::1]
_I2 = types.int32[:, ::1]
_SIG = (_Q, _POOL, _POOL, _I2, _I2, _Q, types.float32, types.int32, types.float32, types.int32)
BUILD_SIGNATURES = [(kernel, _SIG, {"max_registers": 255}) for kernel in _KERNELS.values()]
