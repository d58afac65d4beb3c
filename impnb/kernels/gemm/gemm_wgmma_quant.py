"""wgmma GEMM over quantized weights: C (M, N) float32 [+]= A (M, K) fp16 · dequant(W)ᵀ.

gemm_wgmma's block (two warpgroups, 128 x 128 of C, 64-deep stages in the 128-byte swizzle) with
the W tile decoded by the block's threads instead of copied: stage s covers W chunks 2s and 2s+1
(32 weights each, repack.py layout, quant_blocks*.py decoders, bit for bit what `dequant`
writes); thread t decodes chunk 2s + (t & 1) of tile row t >> 1, its half h into the row's
16-byte chunks 4 (t & 1) + 2h and + 1. The A tile takes the same columns in the same places
(col(c, h) of the type's decoder: K-quant chunks are not contiguous), as a dot product does not
care about the order of k.

Per step k: A stage k + 2 goes into the cp.async ring (4 stages); the wgmma group of step k is
issued; while it runs the threads decode W of step k + 1 (raw blocks loaded a step earlier) into
the next of four W buffers (step k - 1's group may still read one, step k's another; four for
the ring's mask), then load step k + 2's raw blocks; wgmma_wait(1) retires step k - 1. Each W
element is decoded ceil(M / 128) times.

Requirements (asserted): K a multiple of 64 and of the type's block, N % 8 == 0, any M.
Numpy reference: gemm_tc.gemm_ref with the raw bytes and type.
"""

from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx, ptx_wgmma as wg, quant_blocks_k as qbk
from impnb.kernels.gemm.dequant import DECODERS
from impnb.kernels.gemm.gemm_tc import aligned16, block_tile, grid_size
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES
from impnb.kernels.gemm.gemm_wgmma import ALIGN, BK, BM, ROW, THREADS, tile_store
from impnb.kernels.gemv.gemv import parts_type
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch

BN = 128
A_STAGES = 4
AHEAD = A_STAGES - 2    # A tiles in flight beyond the one multiplied
PENDING = AHEAD - 1     # cp.async groups left pending once step k's A tile has landed
W_BUFS = 4
W_BYTES = BN * ROW  # a W buffer: 128 rows of 64 columns
SMEM_ALIGN = ptx.SMEM_ALIGN


@cuda.jit(device=True, inline=True)
def q8_0_load_l1(parts, g):
    """quant_blocks32.q8_0_load through L1: the two 16-byte loads of a chunk's 32 qs bytes share
    one sector, which the decode GEMVs' no-allocate loads fetch from L2 twice (the two lanes of a
    pair here read adjacent chunks, so no load of the warp covers a whole sector)."""
    qs, d = parts
    return ptx.ld_global_v4_u32(qs, 8 * g), ptx.ld_global_v4_u32(qs, 8 * g + 4), float32(d[g])


F16X2_WORDS = {T.Q4_K: qbk.q4_k_words, T.Q6_K: qbk.q6_k_words}  # types with a decoder on f16x2 (not bit-equal to dequant)


@lru_cache(maxsize=None)
def wgmma_w_ops(ggml_type, f16x2: bool = False):
    """(load_raw, decode, col) of one weight type for a 128-row W tile of 64-deep steps, shared with
    the grouped expert GEMM (moe/gemm_grouped_wgmma.py): load_raw(parts, wrow, s) the raw blocks of
    this thread's chunk of step s, wrow = w_row(n0, n_end, cpr) (rows from n_end on read row
    n_end - 1, never stored), decode(raw, s, dst) them into the W tile at dst, col the type's
    column map. f16x2: the type's F16X2_WORDS decoder (half the ALU operations a weight) where it
    has one."""
    load, run, col = DECODERS[T(ggml_type)]
    words = F16X2_WORDS.get(T(ggml_type)) if f16x2 else None
    if ggml_type == T.Q8_0:
        load = q8_0_load_l1

    @cuda.jit(device=True, inline=True)
    def load_raw(parts, wrow, s):
        # -- raw blocks of this thread's chunk of step s --
        return load(parts, wrow + 2 * s)

    @cuda.jit(device=True, inline=True)
    def decode_words(raw, s, dst):
        # -- this thread's chunk as f16x2 words -> its W tile row, chunks 4u, + 1 (half 0), + 2, + 3 --
        t = cuda.threadIdx.x
        n = t >> 1
        p0 = 4 * (t & 1)
        w = words(raw, 2 * s + (t & 1))
        base = dst + n * ROW
        ptx.st_shared_v4_u32(base + ((p0 ^ (n & 7)) << 4), w[0], w[1], w[2], w[3])
        ptx.st_shared_v4_u32(base + (((p0 + 1) ^ (n & 7)) << 4), w[4], w[5], w[6], w[7])
        ptx.st_shared_v4_u32(base + (((p0 + 2) ^ (n & 7)) << 4), w[8], w[9], w[10], w[11])
        ptx.st_shared_v4_u32(base + (((p0 + 3) ^ (n & 7)) << 4), w[12], w[13], w[14], w[15])

    @cuda.jit(device=True, inline=True)
    def decode(raw, s, dst):
        # -- both halves of this thread's chunk -> fp16 -> its W tile row, chunks 4u + 2h, + 1 --
        t = cuda.threadIdx.x
        n = t >> 1
        u = t & 1
        w = cuda.local.array(16, float32)
        for h in range(2):
            sc = run(raw, 2 * s + u, h, w)
            p0 = 4 * u + 2 * h
            base = dst + n * ROW
            ptx.st_shared_v4_u32(base + ((p0 ^ (n & 7)) << 4),
                                 ptx.pack_f16x2(w[0] * sc, w[1] * sc), ptx.pack_f16x2(w[2] * sc, w[3] * sc),
                                 ptx.pack_f16x2(w[4] * sc, w[5] * sc), ptx.pack_f16x2(w[6] * sc, w[7] * sc))
            ptx.st_shared_v4_u32(base + (((p0 + 1) ^ (n & 7)) << 4),
                                 ptx.pack_f16x2(w[8] * sc, w[9] * sc), ptx.pack_f16x2(w[10] * sc, w[11] * sc),
                                 ptx.pack_f16x2(w[12] * sc, w[13] * sc), ptx.pack_f16x2(w[14] * sc, w[15] * sc))

    return load_raw, decode_words if words is not None else decode, col


@cuda.jit(device=True, inline=True)
def w_row(n0, n_end, cpr):
    """This thread's first W chunk in a 128-row tile from row n0 (wgmma_w_ops' load_raw)."""
    t = cuda.threadIdx.x
    return min(n0 + (t >> 1), n_end - 1) * cpr + (t & 1)


@lru_cache(maxsize=None)
def wgmma_quant_mainloop(ggml_type, a_bytes: int, wg_cols: int, a_wg: int, w_wg: int, load_a, w_ahead: int = 1,
                         f16x2: bool = False):
    """The K loop the wgmma GEMMs over quantized W run (this module's, the few-row one's and the
    grouped experts'): mainloop(a, a_src, parts, n0, n_end, cpr, k0, KT, base, g, acc) fills acc
    (wg_cols / 2 floats a thread) with warpgroup g's m64 x wg_cols accumulator over the KT 64-deep
    steps from step k0: A stages of a_bytes by load_a(dst, a, a_src, s) in the cp.async ring, W by
    wgmma_w_ops into W_BUFS buffers; warpgroup g's A rows start a_wg bytes into a stage, its W rows
    w_wg into a buffer. W's raw blocks are loaded w_ahead (1 or 4) steps before their decode: at 4
    the loop is unrolled four times so that each step's blocks stay in their own registers (a
    rotating queue would move a load's registers a step later, waiting for it there)."""
    assert w_ahead in (1, 4), w_ahead
    assert A_STAGES & (A_STAGES - 1) == 0 and W_BUFS & (W_BUFS - 1) == 0  # ring slots by masks
    load_raw, decode, _ = wgmma_w_ops(ggml_type, f16x2)
    mma = wg.MMA["f16"][wg_cols]
    nacc = wg_cols // 2
    w_base = A_STAGES * a_bytes

    @cuda.jit(device=True, inline=True)
    def step(kt, raw, a, a_src, parts, wrow, k0, KT, base, g, acc):
        # -- step kt: its wgmma group; step kt + 1's W decoded from raw; returns step kt + 1 + w_ahead's raw --
        ptx.cp_async_wait_group(PENDING)
        wg.fence_proxy_async()   # this thread's A copies and W stores, visible to wgmma
        cuda.syncthreads()
        nk = kt + AHEAD
        if nk < KT:
            load_a(base + (nk & (A_STAGES - 1)) * a_bytes, a, a_src, k0 + nk)
        ptx.cp_async_commit()
        sa = base + (kt & (A_STAGES - 1)) * a_bytes
        sw = base + w_base + (kt & (W_BUFS - 1)) * W_BYTES
        da = wg.desc_sw128(sa + g * a_wg)
        db = wg.desc_sw128(sw + g * w_wg)
        wg.wgmma_fence()
        for kk in range(BK // 16):
            mma(acc, da + 2 * kk, db + 2 * kk)
        wg.wgmma_commit()
        if kt + 1 < KT:
            decode(raw, k0 + kt + 1, base + w_base + ((kt + 1) & (W_BUFS - 1)) * W_BYTES)
            raw = load_raw(parts, wrow, k0 + min(kt + 1 + w_ahead, KT - 1))
        wg.wgmma_wait(1)
        return raw

    @cuda.jit(device=True, inline=True)
    def raw_at(parts, wrow, k0, KT, s):
        return load_raw(parts, wrow, k0 + min(s, KT - 1))

    @cuda.jit(device=True, inline=True)
    def mainloop(a, a_src, parts, n0, n_end, cpr, k0, KT, base, g, acc):
        for s in range(AHEAD):
            if s < KT:
                load_a(base + s * a_bytes, a, a_src, k0 + s)
            ptx.cp_async_commit()
        wrow = w_row(n0, n_end, cpr)
        r1 = raw_at(parts, wrow, k0, KT, 1)
        r2 = raw_at(parts, wrow, k0, KT, 2) if w_ahead == 4 else r1
        r3 = raw_at(parts, wrow, k0, KT, 3) if w_ahead == 4 else r1
        r0 = raw_at(parts, wrow, k0, KT, 4) if w_ahead == 4 else r1
        decode(load_raw(parts, wrow, k0), k0, base + w_base)
        for i in range(nacc):
            acc[i] = float32(0)
        done = 0
        if w_ahead == 4:
            done = KT - KT % 4
            for kt in range(0, done, 4):  # step j decodes step j + 1, whose raw is r[(j + 1) % 4]
                r1 = step(kt, r1, a, a_src, parts, wrow, k0, KT, base, g, acc)
                r2 = step(kt + 1, r2, a, a_src, parts, wrow, k0, KT, base, g, acc)
                r3 = step(kt + 2, r3, a, a_src, parts, wrow, k0, KT, base, g, acc)
                r0 = step(kt + 3, r0, a, a_src, parts, wrow, k0, KT, base, g, acc)
        for kt in range(done, KT):
            r1 = step(kt, r1, a, a_src, parts, wrow, k0, KT, base, g, acc)
            if w_ahead == 4:
                r1, r2, r3 = r2, r3, r0
        wg.wgmma_wait(0)

    return mainloop


@lru_cache(maxsize=None)
def gemm_wgmma_quant_kernel(ggml_type):
    _, _, col = wgmma_w_ops(ggml_type)
    A_LOADS = BM * 8 // THREADS
    NACC = BN // 2

    @cuda.jit(device=True, inline=True)
    def load_a(dst, a, a_src, s):
        # -- A rows m0.. (zero past M), the 64 columns of W chunks 2s, 2s+1 in their tile places --
        m0, M, K = a_src
        tid = cuda.threadIdx.x
        for i in range(A_LOADS):
            idx = tid + THREADS * i
            r = idx >> 3
            p = idx & 7
            row = m0 + r
            k = col(2 * s + (p >> 2), (p >> 1) & 1) + 8 * (p & 1)
            ptx.cp_async_16_zfill(dst + r * ROW + ((p ^ (r & 7)) << 4), a, min(row, M - 1) * K + k,
                                  16 if row < M else 0)

    mainloop = wgmma_quant_mainloop(ggml_type, BM * ROW, BN, 64 * ROW, 0, load_a)
    store = tile_store(NACC)

    # grid (tiles,), block 256: as gemm_wgmma's kernel at BN 128; parts: the PackedWeight's parts.
    @cuda.jit
    def _gemm_wgmma_quant_kernel(a, parts, c, accumulate):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        M, K = a.shape
        N = c.shape[1]
        cpr = K // 32      # W chunks per row
        KT = K // BK       # steps
        tm, tn = block_tile((M + BM - 1) // BM, (N + BN - 1) // BN)
        m0 = tm * BM
        n0 = tn * BN
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        base = (ptx.smem_addr(smem, 0) + uint32(ALIGN - 1)) & uint32(~(ALIGN - 1) & 0xFFFFFFFF)
        tid = cuda.threadIdx.x
        g = tid >> 7
        acc = cuda.local.array(NACC, float32)
        mainloop(a, (m0, M, K), parts, n0, N, cpr, 0, KT, base, g, acc)
        store(c, acc, m0, n0, M, N, tid, g, accumulate)

    _gemm_wgmma_quant_kernel.__name__ = f"_gemm_wgmma_{T(ggml_type).name.lower()}_kernel"
    return _gemm_wgmma_quant_kernel


def shared_bytes() -> int:
    return A_STAGES * BM * ROW + W_BUFS * BN * ROW + ALIGN


def gemm_wgmma_quant(a, w: PackedWeight, c, stream, accumulate: bool = False):
    """c (M, N) float32 = a (M, K) fp16 · dequant(w)ᵀ, or c += with accumulate."""
    M, K = a.shape
    N = w.rows
    t = T(w.ggml_type)
    assert t in QUANT_TYPES, f"no wgmma GEMM for {t.name}"
    assert w.cols == K and c.shape == (M, N), (a.shape, w.rows, w.cols, c.shape)
    assert K % BK == 0 and K % GGML_QUANT_SIZES[t][0] == 0 and N % 8 == 0, (N, K)
    assert a.dtype == np.float16 and c.dtype == np.float32
    for x in (a, c):
        assert x.is_c_contiguous() and aligned16(x)
    launch(gemm_wgmma_quant_kernel(t), grid_size(M, N, BM, BN), THREADS, stream, a, w.parts, c,
           np.int32(accumulate), shared_bytes=shared_bytes())


F16_2D = types.Array(types.float16, 2, "C")
F32_2D = types.Array(types.float32, 2, "C")


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [] if wg.SIM else [
        (gemm_wgmma_quant_kernel(t), types.void(F16_2D, parts_type(t), F32_2D, types.int32),
         {"ptx_contains": ["wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", "st.shared.v4.u32",
                           "cvt.rn.f16x2.f32", "fence.proxy.async.shared::cta"]})
        for t in QUANT_TYPES
    ]
