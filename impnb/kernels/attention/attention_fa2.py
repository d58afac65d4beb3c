"""Prefill attention over the paged fp16 or bf16 KV cache on tensor cores (FlashAttention-2 style).

T query tokens of one sequence at non-decreasing positions pos[t] (pos0 .. pos0 + T - 1 for a
prompt chunk) against the cached keys 0 .. pos[t] (causal, optional sliding window and softcap),
GQA. S = Q·Kᵀ and O += P·V run on mma.sync m16n8k16 (operands in the cache's type, fp16 or
bf16: Q and P are rounded to it; fp32 accumulation), the softmax online in fp32 per query row;
numpy reference: attention.attention_ref. Head dims 64, 128, 256 and 512; at 512 a block owns
one slice of a head's output dims (V_SLICE) and recomputes S and the softmax for it.

Per block, the key range is lo .. hi: hi the position of its last row, lo its first row's window
start (0 without a window). Key tiles wholly outside it are never loaded; only tiles that cross a
row's causal edge or window edge are masked element by element. Keys outside lo .. hi are
zero-filled in shared memory (no block-table entry past the live length is read), rows past T
repeat row T - 1's position and are never stored. Masked scores are a finite -1e30: a row whose
first tiles are all masked accumulates garbage with weight exp2(-1e30 - m) = 0 once it meets
its first visible key, which every row does (its own position). A warp skips the mma's of a
key tile none of its rows sees (causal diagonal at BM 128).

Scores live in log2 units: Q is stored pre-multiplied by scale·log2 e, so the softmax is one
ex2.approx.ftz per score with no per-score multiply; softcap c becomes (c log2 e)·tanh(s / (c log2 e)).
The hot loop keeps 32-bit index math: the page size is a compile-time constant (shift and mask),
ldmatrix addresses step by XOR on the swizzled chunk bits, mask compares are int32.

Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"; g = lane >> 2, c = lane & 3):
A 16x16 regs (g, 2c..+1), (g+8, 2c..+1), (g, 2c+8..+9), (g+8, 2c+8..+9); B 16x8 regs
(k 2c..+1, n g), (k 2c+8..+9, n g); C 16x8 (g, 2c..+1), (g+8, 2c..+1). So the C fragments of
S n-tiles 2j and 2j+1 (keys 16j..16j+15), packed pairwise to fp16, are P's A fragment for the
k step over those keys: (tile 2j c0c1, tile 2j c2c3, tile 2j+1 c0c1, tile 2j+1 c2c3).
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.attention.kv_cache import BF16, PAGE_SIZES
from impnb.kernels.attention.q_tile import q_tile_loader
from impnb.kernels.common.warp import mma_lane, quad_max, quad_sum, warp_any
from impnb.launch import launch

WARPS = 4
THREADS = 32 * WARPS
LOG2E = math.log2(math.e)
NEG = np.float32(-1e30)
# A row's running max m moves only once a tile's max exceeds it by more than LAZY (log2 units),
# and then for every row of the warp at once (a warp vote): until then p = exp2(s - m) <= 2^LAZY,
# which fp16 P and the fp32 sums hold without loss, and the O rescale (D MT / 2 multiplies a
# lane) is skipped. O / l is the same whichever m was used (FlashAttention-4's lazy rescaling).
LAZY = 8.0
SMEM_ALIGN = ptx.SMEM_ALIGN
# Tilings, by name: head dim -> (BN keys per tile, MT 16-row m-tiles per warp, Q fragments held
# in registers across key tiles). A block is 4 warps x 16 MT query rows. MT 2 (BM 128, as
# FlashAttention-2's sm80 forward) reuses every K/V fragment read from shared memory for two
# m-tiles, halving ldmatrix traffic per mma; MT 1 keeps BM 64. Without Q in registers its
# fragments are re-read per k step, as FlashAttention-2 does. D 128 at MT 2 fits 255 registers
# only with 32-key tiles (64 spill 24 bytes for 1-3%, not worth the spill). All compile without
# spills (tests/test_kernel_build.py). A third cp.async stage measured no faster. D 512 (Gemma 4's
# global layers) splits the output dims (V_SLICE); at 32-key tiles a block takes 160 KB of shared
# memory (the 64 KB Q tile, two stages of a 32 KB K tile and a 16 KB V slice), one block an SM.
TILINGS = {
    "m32": {64: (64, 2, True), 128: (32, 2, False), 256: (32, 1, False), 512: (32, 1, False)},
    "m16": {64: (64, 1, True), 128: (64, 1, True), 256: (32, 1, False), 512: (32, 1, False)},
}
DEFAULT_TILING = "m32"
HEAD_DIMS = (64, 128, 256, 512)
# Head dim -> output dims one block accumulates, where fewer than D: at 512 the O accumulator of a
# 16-row m-tile would take 256 registers a lane, so blocks own 256-dim slices of the output (a
# grid dimension picks one; their V tiles hold only it). Each slice's block computes the whole
# S = Q·Kᵀ over all D dims and the softmax statistics itself: the QK work repeats per slice.
V_SLICE = {512: 256}


@cuda.jit(device=True, inline=True)
def swz(r, ch, row_bytes):
    """Byte offset of 16-byte chunk ch of tile row r: chunks XOR-swizzled by r & 7, so the 8 rows an
    ldmatrix phase reads at one chunk (and cp.async's 16-byte writes) hit 8 distinct bank groups."""
    return r * row_bytes + ((ch ^ (r & 7)) << 4)


@lru_cache(maxsize=None)
def fa2_kernel(D: int, BN: int, MT: int, q_in_regs: bool, PAGE: int, bf16: bool = False, decode: bool = False):
    """The FA2 kernel of these tiles; decode: its decode form (see the grid's comment)."""
    DV = V_SLICE.get(D, D)       # output dims per block
    BM = 16 * MT * WARPS         # query rows per block
    WM = 16 * MT                 # query rows per warp
    CH = D // 8                  # 16-byte chunks per K row
    ROWB = 2 * D                 # bytes per fp16 Q or K row
    VROWB = 2 * DV               # bytes per fp16 V row (the block's slice)
    KK = D // 16                 # k steps of S = Q·Kᵀ
    NS = BN // 8                 # S n-tiles per m-tile (16 x BN)
    NO = DV // 8                 # O n-tiles per m-tile (16 x DV)
    Q_BYTES = BM * ROWB
    K_BYTES = BN * ROWB
    STAGE = K_BYTES + BN * VROWB  # K tile, V tile
    RSTEP = THREADS // 8         # tile rows one pass of the block's cp.async covers (8 threads a row)
    KV_PASSES = BN // RSTEP
    NQF = 4 * MT * (KK if q_in_regs else 1)
    S1 = 4 * NS                  # S accumulators per lane and m-tile
    O1 = 4 * NO                  # O accumulators per lane and m-tile
    NSL = D // DV                # output slices of a head (blocks along grid x)
    NR = 2 * MT                  # rows per lane
    N_S = MT * S1                # S accumulators per lane
    N_O = MT * O1                # O accumulators per lane
    N_P = 4 * MT                 # P A-fragment registers per lane and k step
    PSH = PAGE.bit_length() - 1  # log2 page size
    mma = ptx.mma_bf16 if bf16 else ptx.mma_f16
    pack = ptx.pack_bf16x2 if bf16 else ptx.pack_f16x2
    assert KV_PASSES * RSTEP == BN and BN % PAGE == 0 and PAGE == 1 << PSH
    assert D % DV == 0 and DV % 64 == 0

    @cuda.jit(device=True, inline=True)
    def load_kv(sk, k_pool, v_pool, block_table, k0, lo, hi, r0, c8, col, v_off, row_elems, page_elems):
        # keys k0 .. k0 + BN - 1 -> K tile at sk, V tile at sk + K_BYTES (dims v_off .. v_off + DV -
        # 1), zero outside lo..hi. This thread: rows r = r0 + RSTEP i, chunks c8 + 8 u of each
        # (element col + 64 u of its cache row, V's col + v_off + 64 u; in shared memory, swizzled
        # within each 8-chunk group: + 128 u bytes). k0 is a multiple of PAGE, so row r sits at
        # r % PAGE in its page; a key outside lo..hi reads nothing (src size 0) but gets a valid
        # address, in the page of the nearest live key (block-table entries past the live length
        # are never read).
        for i in range(KV_PASSES):
            r = r0 + RSTEP * i
            key = int32(k0 + r)
            live = min(max(key, lo), hi)
            n = 16 if lo <= key and key <= hi else 0
            src = block_table[uint32(live >> PSH)] * page_elems + int32((r & (PAGE - 1)) * row_elems + col)
            dst = sk + swz(r, c8, ROWB)
            v_dst = sk + swz(r, c8, VROWB)
            for u in range(CH // 8):
                ptx.cp_async_16_zfill(dst + 128 * u, k_pool, src + 64 * u, n)
                if u < DV // 64:
                    ptx.cp_async_16_zfill(v_dst + 128 * u + K_BYTES, v_pool, src + v_off + 64 * u, n)

    @cuda.jit(device=True, inline=True)
    def q_offset(r, ch):
        return swz(r, ch, ROWB)

    q_tile = q_tile_loader(D, BM, THREADS, q_offset, bf16)
    q_group = q_tile_loader(D, BM, THREADS, q_offset, bf16, group=True)

    @cuda.jit(device=True, inline=True)
    def q_frags(sq, row0, kk, qf, o):
        # A fragments of Q rows row0 .. row0 + 15 at d 16kk..16kk+15 -> qf[o .. o+3]
        lane = cuda.threadIdx.x & 31
        a0, a1, a2, a3 = ptx.ldmatrix_x4(sq + swz(row0 + (lane & 15), 2 * kk + (lane >> 4), ROWB))
        qf[o] = a0
        qf[o + 1] = a1
        qf[o + 2] = a2
        qf[o + 3] = a3

    # grid (H D / DV, ceil(T / BM)), block 128 (4 warps): block (x, y) owns query rows t0 .. t0 +
    # BM - 1 of head h = x // (D / DV) and their output dims DV sl .. DV sl + DV - 1, sl = x % (D /
    # DV) (the slices of one query tile start together and share its K reads); blocks start
    # heaviest first (every head's last query tile, then the tiles before), so the last wave holds
    # the lightest blocks. Warp w owns rows t0 + WM w .. + WM - 1 as MT m-tiles of 16; lane (g, c)
    # rows g and g + 8 of each m-tile, i.e. the C fragments s (16 x BN scores) and o (16 x DV
    # output) per m-tile, and one quarter of each row's softmax sum l. Row statistics are indexed
    # 2 mt + half (half 0: row g, 1: row g + 8). Shared (dynamic, shared_bytes): Q tile BM x D
    # fp16 (scale·log2 e folded in), then 2 stages of [K tile BN x D | V tile BN x DV] fp16; rows
    # swizzled by swz. Scores are kept in log2 units throughout (exp2 softmax).
    # Decode form (one token, T = 1): grid (Hkv D / DV, S), block (x, y) owns the G = H / Hkv query
    # heads of KV head x // (D / DV) as its tile's rows (rows past G repeat row G - 1, never
    # stored) and split y of the key tiles the token sees (S even shares; one of no tiles writes
    # an empty part): with S = 1 it writes out, else its unnormalised O, its rows' max m and sum l
    # to partials (S, 1, H, D + 2) for attention_wide's merge kernel.
    def body(q, k_pool, v_pool, block_table, pos, out, partials, qscale, window, softcap):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        T = q.shape[0]
        H = q.shape[1]
        Hkv = k_pool.shape[2]
        G = H // Hkv
        if NSL == 1:
            h = cuda.blockIdx.x
            v_off = 0
        else:
            h = cuda.blockIdx.x // NSL
            v_off = (cuda.blockIdx.x - h * NSL) * DV  # the block's first output dim
        if decode:
            kh = h  # the grid's x runs over KV heads
            t0 = 0
        else:
            kh = h // (H // Hkv)
            t0 = (cuda.gridDim.y - 1 - cuda.blockIdx.y) * BM
        t_last = min(t0 + BM, T) - 1
        tid, lane, warp, g, c = mma_lane()
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        sq = ptx.smem_addr(smem, 0)
        skv = sq + Q_BYTES

        # -- key range of the block; first K/V tile in flight --
        first = int32(pos[t0])
        hi = int32(pos[t_last])
        lo = int32(max(0, first - window + 1) if window > 0 else 0)
        j0 = lo // BN
        j1 = hi // BN
        if decode:  # this split's share of the tiles
            per = (j1 - j0 + cuda.gridDim.y) // cuda.gridDim.y
            j0 += cuda.blockIdx.y * per
            j1 = min(j1, j0 + per - 1)
        r0 = tid >> 3                                    # this thread's first K/V tile row
        c8 = tid & 7                                     # its first chunk
        col = kh * D + 8 * c8                            # its element offset within a cache row
        row_elems = Hkv * D
        page_elems = np.int64(row_elems * PAGE)          # int64: pools may pass 2^31 elements
        load_kv(skv, k_pool, v_pool, block_table, j0 * BN, lo, hi, r0, c8, col, v_off, row_elems, page_elems)
        ptx.cp_async_commit()

        if decode:
            q_group(q, sq, kh * G, G, qscale)
        else:
            q_tile(q, sq, t0, h, qscale)
        cuda.syncthreads()
        qf = cuda.local.array(NQF, uint32)
        if q_in_regs:
            for kk in range(KK):
                for mt in range(MT):
                    q_frags(sq, WM * warp + 16 * mt, kk, qf, 4 * (MT * kk + mt))

        # -- per row: online max m and sum l; per warp: its key range --
        m = cuda.local.array(NR, float32)
        lsum = cuda.local.array(NR, float32)
        for rh in range(NR):
            m[rh] = NEG
            lsum[rh] = float32(0)
        w_first = int32(pos[min(t0 + WM * warp, t_last)])
        w_last = int32(pos[min(t0 + WM * warp + WM - 1, t_last)])
        w_lo = w_first - window + 1 if window > 0 else 0   # the warp's first visible key
        s = cuda.local.array(N_S, float32)
        o = cuda.local.array(N_O, float32)
        for i in range(N_O):
            o[i] = float32(0)
        mx = cuda.local.array(NR, float32)
        pa = cuda.local.array(N_P, uint32)
        # ldmatrix lane addresses of K (k step 0) and V (d 0..15), relative to a stage: lanes
        # 8i..8i+7 give matrix i's rows; chunk ch of row r sits at chunk ch ^ (r & 7), so k step kk
        # (V: d step dp) is the step-0 offset XOR kk << 5 (chunk bits only, as ROWB > 32 KK and
        # VROWB > 32 NO / 2, and stages start at multiples of both)
        kb = lane & 7
        k_rel = (kb + ((lane >> 4) << 3)) * ROWB + ((((lane >> 3) & 1) ^ kb) << 4)
        v_rel = K_BYTES + (kb + (((lane >> 3) & 1) << 3)) * VROWB + (((lane >> 4) ^ kb) << 4)

        cur = 0  # byte offset of tile j's stage: 0 or STAGE
        for j in range(j0, j1 + 1):
            # -- wait for tile j; every warp is done with tile j - 1, so refill its slot --
            ptx.cp_async_wait_group(0)
            cuda.syncthreads()
            k0 = int32(j * BN)
            if j < j1:
                load_kv(skv + (STAGE - cur), k_pool, v_pool, block_table, k0 + BN, lo, hi, r0, c8,
                        col, v_off, row_elems, page_elems)
            ptx.cp_async_commit()
            k_lane = cur + k_rel   # loop-variant on purpose: per-step addresses are not hoisted into registers
            v_lane = cur + v_rel
            cur = STAGE - cur
            # the warp's rows see none of these keys: nothing to add (warp-uniform)
            if k0 > w_last or k0 + BN <= w_lo:
                continue

            # -- S = Q·Kᵀ: K rows (keys) are B's columns, so ldmatrix without .trans --
            for i in range(N_S):
                s[i] = float32(0)
            for kk in range(KK):
                if not q_in_regs:
                    for mt in range(MT):
                        q_frags(sq, WM * warp + 16 * mt, kk, qf, 4 * mt)
                # chunk 2kk + bit, swizzled by kb: 2 (kk ^ (kb >> 1)) + kc
                ka = skv + (k_lane ^ (kk << 5))
                for jp in range(NS // 2):  # matrices: keys 16jp+0..7 at d lo, d hi; keys +8..15 likewise
                    b0, b1, b2, b3 = ptx.ldmatrix_x4(ka + 16 * jp * ROWB)
                    for mt in range(MT):
                        qo = 4 * (MT * kk + mt) if q_in_regs else 4 * mt
                        for n in range(2):
                            e = S1 * mt + 4 * (2 * jp + n)
                            bx = b0 if n == 0 else b2
                            by = b1 if n == 0 else b3
                            s[e], s[e + 1], s[e + 2], s[e + 3] = mma(
                                qf[qo], qf[qo + 1], qf[qo + 2], qf[qo + 3], bx, by,
                                s[e], s[e + 1], s[e + 2], s[e + 3])

            # -- softcap; mask tiles that cross a row's causal or window edge (warp-uniform) --
            if softcap > 0:  # (its factors derived here from the parameter: no registers held)
                cap_out = float32(softcap * LOG2E)
                cap_in = float32(1) / cap_out
                for i in range(N_S):
                    s[i] = cap_out * math.tanh(s[i] * cap_in)
            if k0 + BN - 1 > w_first or (window > 0 and k0 <= w_last - window):
                for rh in range(NR):
                    # key k0 + 8n + 2c + e is visible to row rh iff 8n + e <= last_off and, with a
                    # window, 8n + e > first_off
                    # (the row's position read again here: a register less in the hot loop)
                    last_off = int32(pos[min(t0 + WM * warp + 8 * rh + g, t_last)]) - k0 - 2 * c
                    first_off = int32(last_off - window)
                    for n in range(NS):
                        for e in range(2):
                            i = S1 * (rh >> 1) + 4 * n + 2 * (rh & 1) + e
                            if 8 * n + e > last_off or (window > 0 and 8 * n + e <= first_off):
                                s[i] = NEG

            # -- online softmax of each row: new max (lazily), rescale, exp2, partial sums --
            for rh in range(NR):
                mx[rh] = m[rh]
            for i in range(N_S):
                rh = 2 * (i // S1) + ((i >> 1) & 1)
                mx[rh] = max(mx[rh], s[i])
            grow = False
            for rh in range(NR):
                mx[rh] = quad_max(mx[rh])
                grow = grow or mx[rh] > m[rh] + LAZY
            if warp_any(grow):
                for mt in range(MT):
                    a_lo = ptx.ex2_approx_ftz(m[2 * mt] - mx[2 * mt])
                    a_hi = ptx.ex2_approx_ftz(m[2 * mt + 1] - mx[2 * mt + 1])
                    m[2 * mt] = mx[2 * mt]
                    m[2 * mt + 1] = mx[2 * mt + 1]
                    lsum[2 * mt] *= a_lo
                    lsum[2 * mt + 1] *= a_hi
                    for n in range(NO):
                        f = O1 * mt + 4 * n
                        o[f] *= a_lo
                        o[f + 1] *= a_lo
                        o[f + 2] *= a_hi
                        o[f + 3] *= a_hi
            for i in range(N_S):
                rh = 2 * (i // S1) + ((i >> 1) & 1)
                p = ptx.ex2_approx_ftz(s[i] - m[rh])
                lsum[rh] += p
                s[i] = p

            # -- O += P·V: P's A fragments straight from s, V rows (keys) are B's rows: .trans --
            for kj in range(NS // 2):
                for mt in range(MT):
                    e = S1 * mt + 8 * kj
                    for u in range(4):
                        pa[4 * mt + u] = pack(s[e + 2 * u], s[e + 2 * u + 1])
                for dp in range(NO // 2):  # matrices: keys 0..7, 8..15 at d 16dp+0..7, then d +8..15
                    b0, b1, b2, b3 = ptx.ldmatrix_x4_trans(skv + (v_lane ^ (dp << 5)) + 16 * kj * VROWB)
                    for mt in range(MT):
                        for n in range(2):
                            f = O1 * mt + 4 * (2 * dp + n)
                            bx = b0 if n == 0 else b2
                            by = b1 if n == 0 else b3
                            o[f], o[f + 1], o[f + 2], o[f + 3] = mma(
                                pa[4 * mt], pa[4 * mt + 1], pa[4 * mt + 2], pa[4 * mt + 3], bx, by,
                                o[f], o[f + 1], o[f + 2], o[f + 3])

        # -- epilogue: out = O / l, rows t < T (decode: rows r < G, or their parts) --
        for rh in range(NR):
            if decode:
                lrow = quad_sum(lsum[rh])  # every lane: a quad shuffle
                t = t0 + WM * warp + 8 * rh + g
                if t < G:
                    hq = kh * G + t
                    if cuda.gridDim.y == 1:
                        inv = float32(1) / lrow
                        base = hq * D + v_off + 2 * c
                        for n in range(NO):
                            f = O1 * (rh >> 1) + 4 * n + 2 * (rh & 1)
                            ptx.st_global_v2_f32(out, base + 8 * n, o[f] * inv, o[f + 1] * inv)
                    else:
                        base = (cuda.blockIdx.y * H + hq) * (D + 2)
                        for n in range(NO):
                            f = O1 * (rh >> 1) + 4 * n + 2 * (rh & 1)
                            ptx.st_global_v2_f32(partials, base + v_off + 2 * c + 8 * n, o[f], o[f + 1])
                        if c == 0 and v_off == 0:
                            ptx.st_global_v2_f32(partials, base + D, m[rh], lrow)
                continue
            inv = float32(1) / quad_sum(lsum[rh])  # every lane: a quad shuffle
            t = t0 + WM * warp + 8 * rh + g
            if t < T:
                base = (t * H + h) * D + v_off + 2 * c
                for n in range(NO):
                    f = O1 * (rh >> 1) + 4 * n + 2 * (rh & 1)
                    ptx.st_global_v2_f32(out, base + 8 * n, o[f] * inv, o[f + 1] * inv)

    body = cuda.jit(device=True, inline=True)(body)
    if decode:
        def fa2(q, k_pool, v_pool, block_table, pos, out, partials, qscale, window, softcap):
            body(q, k_pool, v_pool, block_table, pos, out, partials, qscale, window, softcap)
    else:
        def fa2(q, k_pool, v_pool, block_table, pos, out, qscale, window, softcap):
            body(q, k_pool, v_pool, block_table, pos, out, out, qscale, window, softcap)

    tiles = (f"_v{DV}" if DV < D else "") + f"_n{BN}_m{WM}" + ("_qr" if q_in_regs else "")
    fa2.__name__ = f"_fa2{'_decode' if decode else ''}_d{D}{tiles}_p{PAGE}{'_bf16' if bf16 else ''}_kernel"
    return cuda.jit(fa2)


def shared_bytes(D: int, BN: int, MT: int) -> int:
    """Dynamic shared memory of a block: the Q tile and 2 stages of K and V tiles, fp16."""
    return 16 * MT * WARPS * 2 * D + 2 * BN * 2 * (D + V_SLICE.get(D, D))


def _check(a, dtype, ndim: int, name: str):
    assert a.dtype == dtype and a.ndim == ndim and a.is_c_contiguous(), \
        f"{name}: C-contiguous {np.dtype(dtype)} with {ndim} dims expected, got {a.dtype} {a.shape}"


def check_args(q, k_pool, v_pool, block_table, pos, out, window, softcap) -> bool:
    """The arguments' dtypes, layouts and shapes, as the prefill attention kernels take them;
    returns whether the pools are bf16 (kv_cache.BF16) rather than float16."""
    kv = BF16 if k_pool.dtype == BF16 else np.float16
    for a, dt, nd, name in ((q, np.float32, 3, "q"), (out, np.float32, 3, "out"),
                            (k_pool, kv, 4, "k_pool"), (v_pool, kv, 4, "v_pool"),
                            (block_table, np.int32, 1, "block_table"), (pos, np.int32, 1, "pos")):
        _check(a, dt, nd, name)
    T, H, D = q.shape
    assert out.shape == q.shape and pos.shape == (T,), "out or pos shape"
    assert k_pool.shape[3] == D and v_pool.shape == k_pool.shape, "head dims"
    assert k_pool.shape[1] in PAGE_SIZES and H % k_pool.shape[2] == 0, "pages or heads"
    assert window is None or window > 0, "window must be None or positive"
    assert softcap is None or softcap > 0, "softcap must be None or positive"
    return kv == BF16


def attention_fa2(q, k_pool, v_pool, block_table, pos, out, scale: float,
                  window: int | None, softcap: float | None, stream, tiling: str = DEFAULT_TILING) -> None:
    """out (T, H, D) = causal attention of q (T, H, D) float32 at positions pos (T,) int32,
    non-decreasing (a prompt chunk: consecutive). k_pool, v_pool (n_pages, page_size, Hkv, D)
    float16, or both bf16 (kv_cache.BF16), already hold keys 0 .. max(pos); block_table
    (max_pages,) int32 of this sequence. window None or > 0; softcap None or > 0. All queries at
    one position N - 1 give non-causal attention over N keys. tiling: a key of TILINGS."""
    bf16 = check_args(q, k_pool, v_pool, block_table, pos, out, window, softcap)
    T, H, D = q.shape
    P = k_pool.shape[1]
    assert D in HEAD_DIMS, f"head dim {D} not in {HEAD_DIMS}"
    BN, MT, q_in_regs = TILINGS[tiling][D]
    BM = 16 * MT * WARPS
    if T:
        launch(fa2_kernel(D, BN, MT, q_in_regs, P, bf16), (H * (D // V_SLICE.get(D, D)), (T + BM - 1) // BM),
               THREADS, stream, q, k_pool,
               v_pool, block_table, pos, out, np.float32(scale * LOG2E), np.int32(window or 0),
               np.float32(softcap or 0.0),
               shared_bytes=shared_bytes(D, BN, MT))


def kernel_sig(bf16: bool = False, decode: bool = False):
    """The kernels' argument types: q, the pools (float16, or uint16 bf16 bits), block_table, pos,
    out, (decode: partials,) qscale, window, softcap."""
    kv = types.uint16 if bf16 else types.float16
    parts = (types.float32[:, :, :, ::1],) if decode else ()
    return types.void(types.float32[:, :, ::1], kv[:, :, :, ::1], kv[:, :, :, ::1], types.int32[::1],
                      types.int32[::1], types.float32[:, :, ::1], *parts, types.float32, types.int32, types.float32)


FA2_PTX = ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
           "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "cp.async.cg.shared.global", "ex2.approx"]


# every tiling at page size 32 (the page size only changes the block-table shift and mask); the
# default tiling in bf16 too
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(fa2_kernel(D, *cfg, 32), kernel_sig(), {"max_registers": 255, "ptx_contains": FA2_PTX})
                        for cfg, D in sorted({(TILINGS[t][D], D) for t in TILINGS for D in HEAD_DIMS})] + [
        (fa2_kernel(D, *TILINGS[DEFAULT_TILING][D], 32, True), kernel_sig(True),
         {"max_registers": 255,
          "ptx_contains": ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "cvt.rn.bf16x2.f32"]})
        for D in HEAD_DIMS]
