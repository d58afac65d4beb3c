"""Prefill attention over the paged fp16 or bf16 KV cache on Hopper's wgmma (FlashAttention-3
style, sm_90a).

The same operation and arguments as attention_fa2.py (causal, sliding window, softcap, GQA,
chunked prefill against the cache; numpy reference attention.attention_ref), at head dims 64
and 128. A block is two warpgroups over 128 query rows, 64 each; per BN-key tile (FORMS: 128
keys at D 128, 64 at D 64) S = Q·Kᵀ is one m64nBNk16 wgmma a 16-wide k step with Q and K from
shared memory, the first step overwriting S; the online softmax runs on S's accumulators in
fp32 (log2 units, lazy max, as attention_fa2); O += P·V is one m64nDk16 wgmma a 16-key step
with P in registers (S's accumulators packed to the cache's type, fp16 or bf16, as Q is: the
accumulator layout of n-tiles 2j, 2j+1 is the A fragment of key step j) and V read MN-major from
the same swizzled tile layout K uses (ptx_wgmma). P·V of tile j - 1 is issued beside S of tile
j, so the softmax of S runs while it does; K/V tiles stream through cp.async stages. Numba's
simulator cannot run wgmma: tests/gpu/test_attention_fa2.py runs this kernel.
"""

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, uint32

from impnb.kernels.common import ptx, ptx_wgmma as wg
from impnb.kernels.attention.attention_fa2 import FA2_PTX, LAZY, LOG2E, NEG, check_args, kernel_sig
from impnb.kernels.attention.q_tile import q_tile_loader
from impnb.kernels.common.warp import quad_max, quad_sum, warp_any
from impnb.launch import launch

HEAD_DIMS = (64, 128)
# The forms run (wgnBN: BN-key tiles, two warpgroups, three stages): D 64 on 64-key tiles at 128
# registers, two blocks an SM (16 warps); D 128 on 128-key tiles, one block an SM. Other tilings,
# stage counts and warpgroup counts measured slower or spilled (64-key tiles with two blocks an SM
# spill 532 bytes at D 128: O alone is 64 registers a thread). A block is one work item (head,
# query tile), handed out heaviest first by the hardware's block scheduler as SMs free up; a
# persistent grid looping over items measured slower at every short context. Figures of the forms
# and of what lost: docs/EXPERIMENTS.md, 'Prefill attention'.


class Form(NamedTuple):
    """A build of the kernel: keys a tile; warpgroups a block (64 query rows each); K/V stages
    (the tile in S, the one before in P·V, the rest loading); the register cap (128 lets two
    256-thread blocks share an SM)."""
    bn: int = 128
    groups: int = 2
    stages: int = 3
    regs: int = 255


FORMS = {64: Form(bn=64, regs=128), 128: Form()}  # head dim: its form ("wgn64", "wgn128" above)
ROW = 128         # bytes a swizzled tile row: 64 fp16 of the head dim
ALIGN = 1024      # the 128-byte swizzle repeats every 8 rows: tiles start 1024-byte aligned
SMEM_ALIGN = ptx.SMEM_ALIGN


@cuda.jit(device=True, inline=True)
def tile_offset(r, ch, rows):
    """Byte offset of 16-byte chunk ch (8 head-dim values) of row r in a tile of `rows` rows:
    head-dim halves of 64 are blocks of rows x 128 bytes, chunks swizzled by r & 7 within a row."""
    return (ch >> 3) * (rows * ROW) + r * ROW + (((ch & 7) ^ (r & 7)) << 4)


@lru_cache(maxsize=None)
def wgmma_attention_kernel(D: int, PAGE: int, form: Form, bf16: bool = False):
    BN, GROUPS, STAGES = form.bn, form.groups, form.stages
    BM = 64 * GROUPS             # query rows a block
    THREADS = 128 * GROUPS
    CH = D // 8                  # 16-byte chunks a row
    KK = D // 16                 # k steps of S = Q·Kᵀ
    Q_BYTES = BM * 2 * D
    KV_BYTES = BN * 2 * D
    STAGE = 2 * KV_BYTES         # K tile, V tile
    RING = STAGES * STAGE
    AHEAD = STAGES - 2           # tiles in flight beyond the one in S (the one before is in P·V)
    WAIT = AHEAD - 1             # commit groups left pending when tile j has landed
    RSTEP = THREADS // CH        # tile rows one pass of the block's cp.async covers
    KV_PASSES = BN // RSTEP
    NS = BN // 8                 # S n-tiles (8 keys)
    NO = D // 8                  # O n-tiles (8 head-dim values)
    N_S = 4 * NS                 # S accumulators a thread (BN / 2)
    N_O = 4 * NO                 # O accumulators a thread (D / 2)
    N_P = N_S // 2               # P's fp16x2 A-fragment words a thread
    V_LBO = BN * ROW             # bytes between V's head-dim halves
    PSH = PAGE.bit_length() - 1
    dt = "bf16" if bf16 else "f16"
    mma_s = wg.MMA[dt][BN]
    mma_s0 = wg.MMA_FIRST[dt][BN]
    mma_o = wg.MMA_RS[dt][D]
    pack2 = ptx.pack_bf16x2 if bf16 else ptx.pack_f16x2
    assert KV_PASSES * RSTEP == BN and RSTEP % 8 == 0 and BN % PAGE == 0
    assert Q_BYTES % ALIGN == 0 and KV_BYTES % ALIGN == 0

    @cuda.jit(device=True, inline=True)
    def load_kv(sk, k_pool, v_pool, block_table, k0, lo, hi, r0, ch, col, row_elems, page_elems):
        # keys k0 .. k0 + BN - 1 -> K tile at sk, V tile at sk + KV_BYTES, zero outside lo..hi;
        # this thread: rows r0 + RSTEP i, chunk ch of each (the r & 7 swizzle is r0's: RSTEP % 8 == 0)
        for i in range(KV_PASSES):
            r = r0 + RSTEP * i
            key = int32(k0 + r)
            live = min(max(key, lo), hi)
            n = 16 if lo <= key and key <= hi else 0
            src = block_table[uint32(live >> PSH)] * page_elems + int32((r & (PAGE - 1)) * row_elems + col)
            dst = sk + tile_offset(r, ch, BN)
            ptx.cp_async_16_zfill(dst, k_pool, src, n)
            ptx.cp_async_16_zfill(dst + KV_BYTES, v_pool, src, n)

    @cuda.jit(device=True, inline=True)
    def q_offset(r, ch):
        return tile_offset(r, ch, BM)

    q_tile = q_tile_loader(D, BM, THREADS, q_offset, bf16)

    @cuda.jit(device=True, inline=True)
    def qk(s, dq, sk):
        # -- issue S = Q·Kᵀ as one group (the first k step overwrites S): K's k step kk is 32
        # bytes into its head-dim half's swizzled rows, Q's the same --
        dk = wg.desc_sw128(sk)
        wg.wgmma_fence()
        for kk in range(KK):
            db = dk + (kk >> 2) * (BN * ROW // 16) + 2 * (kk & 3)
            da = dq + (kk >> 2) * (BM * ROW // 16) + 2 * (kk & 3)
            if kk == 0:
                mma_s0(s, da, db)
            else:
                mma_s(s, da, db)
        wg.wgmma_commit()

    @cuda.jit(device=True, inline=True)
    def pack(s, pa):
        for i in range(N_P):
            pa[i] = pack2(s[2 * i], s[2 * i + 1])

    @cuda.jit(device=True, inline=True)
    def pv(o, pa, sv):
        # -- issue O += P·V over the tile at sv: key step kj's P words are pa[4 kj ..], V's 16
        # rows from kj on, MN-major --
        dv = wg.desc_sw128_mn(sv + KV_BYTES, V_LBO)
        for kj in range(BN // 16):
            mma_o(o, pa[4 * kj], pa[4 * kj + 1], pa[4 * kj + 2], pa[4 * kj + 3], dv + kj * (16 * ROW // 16))

    @cuda.jit(device=True, inline=True)
    def softmax(s, m, mx, lsum, pos, t0, t_last, wrow, g, c, k0, w_first, w_last, window, softcap):
        # -- S (log2 units) -> P in place: softcap; masks where the tile crosses a row's causal
        # or window edge (warp-uniform); the running max m moved lazily (a warp vote: returns
        # whether it moved, mx then holding O's rescale factors); exp2; the sums l --
        if softcap > 0:
            cap_out = float32(softcap * LOG2E)
            cap_in = float32(1) / cap_out
            for i in range(N_S):
                s[i] = cap_out * math.tanh(s[i] * cap_in)
        if k0 + BN - 1 > w_first or (window > 0 and k0 <= w_last - window):
            for rh in range(2):
                last_off = int32(pos[min(t0 + wrow + 8 * rh + g, t_last)]) - k0 - 2 * c
                first_off = int32(last_off - window)
                for n in range(NS):
                    for e in range(2):
                        if 8 * n + e > last_off or (window > 0 and 8 * n + e <= first_off):
                            s[4 * n + 2 * rh + e] = NEG
        for rh in range(2):
            mx[rh] = m[rh]
        for i in range(N_S):
            mx[(i >> 1) & 1] = max(mx[(i >> 1) & 1], s[i])
        grow = False
        for rh in range(2):
            mx[rh] = quad_max(mx[rh])
            grow = grow or mx[rh] > m[rh] + LAZY
        grow = warp_any(grow)
        if grow:
            for rh in range(2):
                a = ptx.ex2_approx_ftz(m[rh] - mx[rh])
                m[rh] = mx[rh]
                lsum[rh] *= a
                mx[rh] = a
        for i in range(N_S):
            p = ptx.ex2_approx_ftz(s[i] - m[(i >> 1) & 1])
            lsum[(i >> 1) & 1] += p
            s[i] = p
        return grow

    # grid (H, ceil(T / BM)), block 256 = warpgroups 0, 1 over query rows t0 + 64 wg .. + 63 of
    # head h, heaviest query tile first (as attention_fa2). Warp w of a warpgroup holds rows
    # 16 w + g and + 8 (g = lane >> 2, c = lane & 3) of its 64 in the accumulator layout of
    # ptx_wgmma: S (16 x 128) and O (16 x D), register 4 n + 2 half + e at column 8 n + 2 c + e.
    # Shared (dynamic, 1024-aligned): the Q tile (BM x D fp16, scale·log2 e folded in), then
    # STAGES stages of [K tile | V tile] (BN x D fp16), each in tile_offset's layout.
    def attention(q, k_pool, v_pool, block_table, pos, out, qscale, window, softcap):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        T = q.shape[0]
        H = q.shape[1]
        Hkv = k_pool.shape[2]
        h = cuda.blockIdx.x
        kh = h // (H // Hkv)
        t0 = (cuda.gridDim.y - 1 - cuda.blockIdx.y) * BM
        t_last = min(t0 + BM, T) - 1
        tid = cuda.threadIdx.x
        lane = tid & 31
        g = lane >> 2
        c = lane & 3
        grp = tid >> 7                  # warpgroup
        wrow = 64 * grp + 16 * ((tid >> 5) & 3)  # the warp's first row in the block
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        sq = (ptx.smem_addr(smem, 0) + uint32(ALIGN - 1)) & uint32(~(ALIGN - 1) & 0xFFFFFFFF)
        skv = sq + Q_BYTES

        # -- key range of the block; first K/V tile in flight --
        first = int32(pos[t0])
        hi = int32(pos[t_last])
        lo = int32(max(0, first - window + 1) if window > 0 else 0)
        j0 = lo // BN
        j1 = hi // BN
        r0 = tid // CH
        ch = tid - r0 * CH
        col = kh * D + 8 * ch
        row_elems = Hkv * D
        page_elems = np.int64(row_elems * PAGE)
        for i in range(AHEAD):  # tiles j0 .. j0 + AHEAD - 1, a commit group each
            if j0 + i <= j1:
                load_kv(skv + i * STAGE, k_pool, v_pool, block_table, (j0 + i) * BN, lo, hi, r0, ch,
                        col, row_elems, page_elems)
            ptx.cp_async_commit()

        q_tile(q, sq, t0, h, qscale)  # rows past T are zeros
        # -- per row (2 a thread: g, g + 8): online max m and sum l; per warpgroup / warp: key ranges --
        m = cuda.local.array(2, float32)
        lsum = cuda.local.array(2, float32)
        mx = cuda.local.array(2, float32)
        for rh in range(2):
            m[rh] = NEG
            lsum[rh] = float32(0)
        g_last = int32(pos[min(t0 + 64 * grp + 63, t_last)])
        g_lo = int32(pos[min(t0 + 64 * grp, t_last)]) - window + 1 if window > 0 else 0
        w_first = int32(pos[min(t0 + wrow, t_last)])
        w_last = int32(pos[min(t0 + wrow + 15, t_last)])
        s = cuda.local.array(N_S, float32)
        o = cuda.local.array(N_O, float32)
        for i in range(N_O):
            o[i] = float32(0)
        pa = cuda.local.array(N_P, uint32)
        dq = wg.desc_sw128(sq + grp * (64 * ROW))

        # the warpgroup's tiles: ja .. jb (none where ja > jb); tile j's stage is `cur`, j - 1's
        # the one before (its V read by P·V of tile j - 1, issued beside S of tile j)
        ja = max(j0, g_lo // BN)
        jb = min(j1, g_last // BN)
        cur = 0
        for j in range(j0, j1 + 1):
            # -- wait for tile j (and, at j0, the Q tile); both warpgroups are done with S of
            # tile j - 1 and P·V of tile j - 2, whose stage takes tile j + AHEAD --
            ptx.cp_async_wait_group(WAIT)
            wg.fence_proxy_async()   # this thread's shared writes, visible to wgmma
            cuda.syncthreads()
            k0 = int32(j * BN)
            if j + AHEAD <= j1:
                ld = cur + AHEAD * STAGE
                load_kv(skv + (ld - RING if ld >= RING else ld), k_pool, v_pool, block_table,
                        k0 + AHEAD * BN, lo, hi, r0, ch, col, row_elems, page_elems)
            ptx.cp_async_commit()
            sk = skv + cur
            sv = skv + (cur - STAGE if cur >= STAGE else cur + RING - STAGE)
            cur = cur + STAGE if cur + STAGE < RING else 0
            # (warpgroup-uniform branches: wgmma is collective)
            if ja < j and j <= jb:
                # -- S = Q·Kᵀ, then P·V of tile j - 1: two groups, S the older; the softmax of S
                # runs while P·V does, and O is rescaled once P·V is done --
                qk(s, dq, sk)
                pv(o, pa, sv)
                wg.wgmma_commit()
                wg.wgmma_wait(1)
                grow = softmax(s, m, mx, lsum, pos, t0, t_last, wrow, g, c, k0, w_first, w_last, window, softcap)
                wg.wgmma_wait(0)
                if grow:
                    for n in range(NO):
                        o[4 * n] *= mx[0]
                        o[4 * n + 1] *= mx[0]
                        o[4 * n + 2] *= mx[1]
                        o[4 * n + 3] *= mx[1]
                pack(s, pa)
            elif j == ja:  # the warpgroup's first tile: O is still zero
                qk(s, dq, sk)
                wg.wgmma_wait(0)
                softmax(s, m, mx, lsum, pos, t0, t_last, wrow, g, c, k0, w_first, w_last, window, softcap)
                pack(s, pa)
            elif j == jb + 1 and ja <= jb:  # the last tile's P·V, before its stage is refilled
                wg.wgmma_fence()
                pv(o, pa, sv)
                wg.wgmma_commit()
                wg.wgmma_wait(0)
        if jb == j1 and ja <= jb:  # (no load follows the last tile: its stage is intact)
            wg.wgmma_fence()
            pv(o, pa, skv + (cur - STAGE if cur >= STAGE else cur + RING - STAGE))
            wg.wgmma_commit()
            wg.wgmma_wait(0)

        # -- epilogue: out = O / l, rows t < T --
        for rh in range(2):
            inv = float32(1) / quad_sum(lsum[rh])
            t = t0 + wrow + 8 * rh + g
            if t < T:
                base = (t * H + h) * D + 2 * c
                for n in range(NO):
                    ptx.st_global_v2_f32(out, base + 8 * n, o[4 * n + 2 * rh] * inv, o[4 * n + 2 * rh + 1] * inv)

    attention.__name__ = (f"_attention_wgmma_d{D}_p{PAGE}_n{BN}_g{GROUPS}"
                          f"_s{STAGES}_r{form.regs}{'_bf16' if bf16 else ''}_kernel")
    return cuda.jit(attention, max_registers=form.regs)


def shared_bytes(D: int, form: Form) -> int:
    """Q tile, the K/V stages, and room to align the Q tile."""
    return 64 * form.groups * 2 * D + form.stages * 2 * form.bn * 2 * D + ALIGN


def attention_wgmma(q, k_pool, v_pool, block_table, pos, out, scale: float,
                    window: int | None, softcap: float | None, stream) -> None:
    """attention_fa2.attention_fa2's operation on wgmma (head dims 64 and 128, sm_90a), in the
    head dim's form (FORMS)."""
    bf16 = check_args(q, k_pool, v_pool, block_table, pos, out, window, softcap)
    T, H, D = q.shape
    assert D in HEAD_DIMS, f"head dim {D} not in {HEAD_DIMS}"
    f = FORMS[D]
    if T:
        BM = 64 * f.groups
        launch(wgmma_attention_kernel(D, k_pool.shape[1], f, bf16), (H, (T + BM - 1) // BM), 128 * f.groups, stream, q,
               k_pool, v_pool, block_table, pos, out, np.float32(scale * LOG2E), np.int32(window or 0),
               np.float32(softcap or 0.0), shared_bytes=shared_bytes(D, f))


# Each head dim's form, the LTO cubin that runs, fp16 and bf16; the fp16 one's PTX too
# (compile_ptx + link, where libdevice's tanh stays an extern call; LTO inlines it)
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [] if wg.SIM else [
        (wgmma_attention_kernel(D, 32, f, bf16), kernel_sig(bf16),
         {"max_registers": f.regs} if bf16 else
         {"max_registers": f.regs,
          "ptx_contains": [f"wgmma.mma_async.sync.aligned.m64n{f.bn}k16.f32.f16.f16",
                           f"wgmma.mma_async.sync.aligned.m64n{D}k16.f32.f16.f16", *FA2_PTX[3:]]})
        for D, f in FORMS.items() for bf16 in (False, True)
    ]
