"""Prefill attention over the paged fp16 KV cache on tensor cores (FlashAttention-2 style).

T query tokens of one sequence at non-decreasing positions pos[t] (pos0 .. pos0 + T - 1 for a
prompt chunk) against the cached keys 0 .. pos[t] (causal, optional sliding window and softcap),
GQA. S = Q·Kᵀ and O += P·V run on mma.sync m16n8k16 (fp16 operands, fp32 accumulation), the
softmax online in fp32 per query row; numpy reference: attention.attention_ref.

Per block, the key range is lo .. hi: hi the position of its last row, lo its first row's window
start (0 without a window). Key tiles wholly outside it are never loaded; only tiles that cross a
row's causal edge or window edge are masked element by element. Keys outside lo .. hi are
zero-filled in shared memory (no block-table entry past the live length is read), rows past T
repeat row T - 1's position and are never stored. Masked scores are a finite -1e30: a row whose
first tiles are all masked accumulates garbage with weight exp2(-1e30 - m) = 0 once it meets
its first visible key, which every row does (its own position).

Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"; g = lane >> 2, c = lane & 3):
A 16x16 regs (g, 2c..+1), (g+8, 2c..+1), (g, 2c+8..+9), (g+8, 2c+8..+9); B 16x8 regs
(k 2c..+1, n g), (k 2c+8..+9, n g); C 16x8 (g, 2c..+1), (g+8, 2c..+1). So the C fragments of
S n-tiles 2j and 2j+1 (keys 16j..16j+15), packed pairwise to fp16, are P's A fragment for the
k step over those keys: (tile 2j c0c1, tile 2j c2c3, tile 2j+1 c0c1, tile 2j+1 c2c3).
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32

from impnb.kernels import ptx
from impnb.kernels.kv_cache import PAGE_SIZES
from impnb.kernels.norm import quad_max, quad_sum
from impnb.launch import launch

BM = 64             # query rows per block: 4 warps x 16
THREADS = 128
LOG2E = np.float32(math.log2(math.e))
NEG = np.float32(-1e30)
SMEM_ALIGN = ptx.SMEM_ALIGN
# head dim -> (BN keys per tile, Q fragments held in registers); D 256 reloads Q per tile
TILES = {64: (64, True), 128: (64, True), 256: (32, False)}
HEAD_DIMS = tuple(TILES)


@cuda.jit(device=True, inline=True)
def swz(r, ch, row_bytes):
    """Byte offset of 16-byte chunk ch of tile row r: chunks XOR-swizzled by r & 7, so the 8 rows an
    ldmatrix phase reads at one chunk (and cp.async's 16-byte writes) hit 8 distinct bank groups."""
    return r * row_bytes + ((ch ^ (r & 7)) << 4)


@lru_cache(maxsize=None)
def fa2_kernel(D: int):
    BN, q_in_regs = TILES[D]
    CH = D // 8                  # 16-byte chunks per row
    ROWB = 2 * D                 # bytes per fp16 row
    KK = D // 16                 # k steps of S = Q·Kᵀ
    NS = BN // 8                 # S n-tiles per warp (16 x BN)
    NO = D // 8                  # O n-tiles per warp (16 x D)
    Q_BYTES = BM * ROWB
    KV_BYTES = BN * ROWB
    STAGE = 2 * KV_BYTES         # K tile, V tile
    KV_CHUNKS = BN * CH // THREADS
    NQF = 4 * KK if q_in_regs else 4
    N_S = 4 * NS                 # S accumulators per lane
    N_O = 4 * NO                 # O accumulators per lane

    @cuda.jit(device=True, inline=True)
    def load_kv(sk, k_pool, v_pool, block_table, kh, k0, lo, hi):
        # keys k0 .. k0 + BN - 1 of KV head kh -> K tile at sk, V tile at sk + KV_BYTES (zero outside lo..hi)
        tid = cuda.threadIdx.x
        P = k_pool.shape[1]
        Hkv = k_pool.shape[2]
        for i in range(KV_CHUNKS):
            idx = tid + THREADS * i
            r = idx // CH
            ch = idx - r * CH
            key = k0 + r
            ok = lo <= key and key <= hi
            src = 0
            if ok:
                src = ((block_table[key // P] * P + key % P) * Hkv + kh) * D + 8 * ch
            dst = sk + swz(r, ch, ROWB)
            ptx.cp_async_16_zfill(dst, k_pool, src, 16 if ok else 0)
            ptx.cp_async_16_zfill(dst + KV_BYTES, v_pool, src, 16 if ok else 0)

    @cuda.jit(device=True, inline=True)
    def q_frags(sq, kk, qf, o):
        # A fragments of this warp's 16 Q rows at d 16kk..16kk+15 -> qf[o .. o+3]
        lane = cuda.threadIdx.x & 31
        r = 16 * (cuda.threadIdx.x >> 5) + (lane & 15)
        a0, a1, a2, a3 = ptx.ldmatrix_x4(sq + swz(r, 2 * kk + (lane >> 4), ROWB))
        qf[o] = a0
        qf[o + 1] = a1
        qf[o + 2] = a2
        qf[o + 3] = a3

    # grid (ceil(T / BM), H), block 128 (4 warps): a block owns query rows t0 .. t0 + 63 of head h
    # (the heaviest, last, tiles first), warp w rows t0 + 16w .. +15, lane (g, c) rows g and g + 8
    # of those, i.e. the C fragments s (16 x BN scores) and o (16 x D output), and one quarter of
    # each row's softmax sum l. Shared (dynamic, shared_bytes): Q tile 64 x D fp16 (scale folded
    # in), then 2 stages of [K tile BN x D | V tile BN x D] fp16; rows swizzled by swz.
    def fa2(q, k_pool, v_pool, block_table, pos, out, scale, window, softcap):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        T = q.shape[0]
        H = q.shape[1]
        h = cuda.blockIdx.y
        kh = h // (H // k_pool.shape[2])
        t0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * BM
        t_last = min(t0 + BM, T) - 1
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        g = lane >> 2
        c = lane & 3
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        sq = ptx.smem_addr(smem, 0)
        skv = sq + Q_BYTES

        # -- key range of the block; first K/V tile in flight --
        first = pos[t0]
        hi = pos[t_last]
        lo = max(0, first - window + 1) if window > 0 else 0
        j0 = lo // BN
        j1 = hi // BN
        load_kv(skv, k_pool, v_pool, block_table, kh, j0 * BN, lo, hi)
        ptx.cp_async_commit()

        # -- Q tile: float32 * scale -> fp16 in shared memory --
        for idx in range(tid, BM * CH, THREADS):
            r = idx // CH
            ch = idx - r * CH
            t = t0 + r
            w = cuda.local.array(4, uint32)
            for i in range(4):
                w[i] = 0
                if t < T:
                    d = 8 * ch + 2 * i
                    w[i] = ptx.pack_f16x2(q[t, h, d] * scale, q[t, h, d + 1] * scale)
            ptx.st_shared_v4_u32(sq + swz(r, ch, ROWB), w[0], w[1], w[2], w[3])
        cuda.syncthreads()
        qf = cuda.local.array(NQF, uint32)
        if q_in_regs:
            for kk in range(KK):
                q_frags(sq, kk, qf, 4 * kk)

        qp_lo = pos[min(t0 + 16 * warp + g, t_last)]
        qp_hi = pos[min(t0 + 16 * warp + g + 8, t_last)]
        m_lo = NEG
        m_hi = NEG
        l_lo = float32(0)
        l_hi = float32(0)
        s = cuda.local.array(N_S, float32)
        o = cuda.local.array(N_O, float32)
        for i in range(N_O):
            o[i] = float32(0)

        cur = 0  # byte offset of tile j's stage: 0 or STAGE
        for j in range(j0, j1 + 1):
            # -- wait for tile j; every warp is done with tile j - 1, so refill its slot --
            ptx.cp_async_wait_group(0)
            cuda.syncthreads()
            k0 = j * BN
            if j < j1:
                load_kv(skv + (STAGE - cur), k_pool, v_pool, block_table, kh, k0 + BN, lo, hi)
            ptx.cp_async_commit()
            sk = skv + cur
            sv = sk + KV_BYTES
            cur = STAGE - cur

            # -- S = Q·Kᵀ: K rows (keys) are B's columns, so ldmatrix without .trans --
            for i in range(N_S):
                s[i] = float32(0)
            for kk in range(KK):
                qo = 4 * kk
                if not q_in_regs:
                    q_frags(sq, kk, qf, 0)
                    qo = 0
                for jp in range(NS // 2):  # matrices: keys 16jp+0..7 at d lo, d hi; keys +8..15 likewise
                    r = 16 * jp + (lane & 7) + ((lane >> 4) << 3)
                    b0, b1, b2, b3 = ptx.ldmatrix_x4(sk + swz(r, 2 * kk + ((lane >> 3) & 1), ROWB))
                    for n in range(2):
                        e = 4 * (2 * jp + n)
                        bx = b0 if n == 0 else b2
                        by = b1 if n == 0 else b3
                        s[e], s[e + 1], s[e + 2], s[e + 3] = ptx.mma_f16(
                            qf[qo], qf[qo + 1], qf[qo + 2], qf[qo + 3], bx, by, s[e], s[e + 1], s[e + 2], s[e + 3])

            # -- softcap, log2 units, mask; online softmax of rows g (lo) and g + 8 (hi) --
            masked = k0 + BN - 1 > first or (window > 0 and k0 <= hi - window)
            mx_lo = NEG
            mx_hi = NEG
            for i in range(N_S):
                x = s[i]
                if softcap > 0:
                    x = softcap * math.tanh(x / softcap)
                x *= LOG2E
                if masked:
                    key = k0 + 8 * (i >> 2) + 2 * c + (i & 1)
                    qp = qp_lo if (i & 2) == 0 else qp_hi
                    if key > qp or (window > 0 and key <= qp - window):
                        x = NEG
                s[i] = x
                if (i & 2) == 0:
                    mx_lo = max(mx_lo, x)
                else:
                    mx_hi = max(mx_hi, x)
            mn_lo = max(m_lo, quad_max(mx_lo))
            mn_hi = max(m_hi, quad_max(mx_hi))
            a_lo = math.exp2(m_lo - mn_lo)
            a_hi = math.exp2(m_hi - mn_hi)
            m_lo = mn_lo
            m_hi = mn_hi
            l_lo *= a_lo
            l_hi *= a_hi
            for i in range(N_S):
                if (i & 2) == 0:
                    p = math.exp2(s[i] - mn_lo)
                    l_lo += p
                else:
                    p = math.exp2(s[i] - mn_hi)
                    l_hi += p
                s[i] = p
            for i in range(N_O):
                o[i] *= a_lo if (i & 2) == 0 else a_hi

            # -- O += P·V: P's A fragments straight from s, V rows (keys) are B's rows: .trans --
            for kj in range(NS // 2):
                e = 8 * kj
                p0 = ptx.pack_f16x2(s[e], s[e + 1])
                p1 = ptx.pack_f16x2(s[e + 2], s[e + 3])
                p2 = ptx.pack_f16x2(s[e + 4], s[e + 5])
                p3 = ptx.pack_f16x2(s[e + 6], s[e + 7])
                r = 16 * kj + (lane & 7) + (((lane >> 3) & 1) << 3)
                for dp in range(NO // 2):  # matrices: keys 0..7, 8..15 at d 16dp+0..7, then d +8..15
                    b0, b1, b2, b3 = ptx.ldmatrix_x4_trans(sv + swz(r, 2 * dp + (lane >> 4), ROWB))
                    for n in range(2):
                        f = 4 * (2 * dp + n)
                        bx = b0 if n == 0 else b2
                        by = b1 if n == 0 else b3
                        o[f], o[f + 1], o[f + 2], o[f + 3] = ptx.mma_f16(
                            p0, p1, p2, p3, bx, by, o[f], o[f + 1], o[f + 2], o[f + 3])

        # -- epilogue: out = O / l, rows t < T --
        inv_lo = float32(1) / quad_sum(l_lo)
        inv_hi = float32(1) / quad_sum(l_hi)
        for half in range(2):
            t = t0 + 16 * warp + g + 8 * half
            if t < T:
                inv = inv_lo if half == 0 else inv_hi
                base = (t * H + h) * D + 2 * c
                for n in range(NO):
                    f = 4 * n + 2 * half
                    ptx.st_global_v2_f32(out, base + 8 * n, o[f] * inv, o[f + 1] * inv)

    fa2.__name__ = f"_fa2_d{D}_kernel"
    return cuda.jit(fa2)


def shared_bytes(D: int) -> int:
    BN = TILES[D][0]
    return BM * 2 * D + 2 * 2 * BN * 2 * D


def _check(a, dtype, ndim: int, name: str):
    assert a.dtype == dtype and a.ndim == ndim and a.is_c_contiguous(), \
        f"{name}: C-contiguous {np.dtype(dtype)} with {ndim} dims expected, got {a.dtype} {a.shape}"


def attention_fa2(q, k_pool, v_pool, block_table, pos, out, scale: float,
                  window: int | None, softcap: float | None, stream) -> None:
    """out (T, H, D) = causal attention of q (T, H, D) float32 at positions pos (T,) int32,
    non-decreasing (a prompt chunk: consecutive). k_pool, v_pool (n_pages, page_size, Hkv, D)
    float16 already hold keys 0 .. max(pos); block_table (max_pages,) int32 of this sequence.
    window None or > 0; softcap None or > 0. All queries at one position N - 1 give
    non-causal attention over N keys."""
    for a, dt, nd, name in ((q, np.float32, 3, "q"), (out, np.float32, 3, "out"),
                            (k_pool, np.float16, 4, "k_pool"), (v_pool, np.float16, 4, "v_pool"),
                            (block_table, np.int32, 1, "block_table"), (pos, np.int32, 1, "pos")):
        _check(a, dt, nd, name)
    T, H, D = q.shape
    assert out.shape == q.shape and pos.shape == (T,), "out or pos shape"
    assert D in TILES and k_pool.shape[3] == D and v_pool.shape == k_pool.shape, "head dims"
    assert k_pool.shape[1] in PAGE_SIZES and H % k_pool.shape[2] == 0, "pages or heads"
    assert window is None or window > 0, "window must be None or positive"
    assert softcap is None or softcap > 0, "softcap must be None or positive"
    if T:
        launch(fa2_kernel(D), ((T + BM - 1) // BM, H), THREADS, stream, q, k_pool, v_pool, block_table,
               pos, out, np.float32(scale), np.int32(window or 0), np.float32(softcap or 0.0),
               shared_bytes=shared_bytes(D))


_SIG = types.void(types.float32[:, :, ::1], types.float16[:, :, :, ::1], types.float16[:, :, :, ::1],
                  types.int32[::1], types.int32[::1], types.float32[:, :, ::1],
                  types.float32, types.int32, types.float32)
FA2_PTX = ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
           "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "cp.async.cg.shared.global", "ex2.approx"]
BUILD_SIGNATURES = [(fa2_kernel(D), _SIG, {"max_registers": 255, "ptx_contains": FA2_PTX}) for D in HEAD_DIMS]
