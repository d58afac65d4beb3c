"""Tensor-core GEMM over quantized weights: C (M, N) float32 [+]= A (M, K) fp16 · dequant(W)ᵀ.

The W tile of each 32-deep stage is one 32-weight chunk of 128 rows, decoded from the raw GGUF
blocks (repack.py layout, quant_blocks*.py loaders and exact decoders) straight into shared memory
as fp16 -- the same values `dequant` writes, bit for bit -- in gemm_tc's swizzled tile layout, so
gemm_tc's warp step and epilogue do the rest. A chunk's two 16-weight halves sit at row columns
col(c, 0) and col(c, 1) (`block32_k`, `k4_k`, `q6_k_k`); the stage's A tile takes the same
columns (k slots 0..15 and 16..31), since a dot product does not care about the order of k.

Pipeline per 32-deep stage kt (one barrier each):
  A: 3-stage cp.async ring, as in gemm_tc;
  W: raw blocks of chunk kt+2 loaded into registers before the mma of stage kt and decoded into
     the other of two fp16 W buffers after it, so two stages of mma cover the global latency.
Decode work: thread t decodes half t & 1 of row t >> 1 (lanes 2i, 2i+1 read the same raw bytes
in one request); W tiles are 128 rows, so each weight is decoded ceil(M / bm) times.

Requirements (asserted): K a multiple of the type's block (256 for K-quants), N % 8 == 0, any M.
Numpy reference: gemm_tc.gemm_ref with the raw bytes and type.
"""

from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.gemm.dequant import DECODERS
from impnb.kernels.gemm.gemm_tc import (BK, GEMM_PTX, ROW_BYTES, THREADS, F16_2D, F32_2D, block_tile,
                                   check_shapes, gemm_f16, grid_size, tile_ops)
from impnb.kernels.gemv.gemv import parts_type
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch

BN = 128          # W tile rows: 256 threads decode 2 halves of 128 rows
A_STAGES = 3
QUANT_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4, T.NVFP4)
SMEM_ALIGN = ptx.SMEM_ALIGN  # a global, so numba types it as a literal


@lru_cache(maxsize=None)
def quant_tile_ops(ggml_type):
    """(load_raw, decode, col) device functions of one weight type for 128-row W tiles."""
    load, run, col = DECODERS[T(ggml_type)]

    @cuda.jit(device=True, inline=True)
    def load_raw(parts, n0, N, cpr, c):
        # raw blocks of chunk c of this thread's W row (rows past N read row N-1, never stored)
        row = min(n0 + (cuda.threadIdx.x >> 1), N - 1)
        return load(parts, row * cpr + c)

    @cuda.jit(device=True, inline=True)
    def decode(raw, c, sbuf):
        # 16 weights of half h of the chunk -> fp16 -> W tile row n, 16-byte chunks 2h, 2h+1
        t = cuda.threadIdx.x
        n = t >> 1
        h = t & 1
        w = cuda.local.array(16, float32)
        s = run(raw, c, h, w)
        p = sbuf + n * ROW_BYTES
        x = (n >> 1) & 3
        ptx.st_shared_v4_u32(p + (((2 * h) ^ x) << 4),
                             ptx.pack_f16x2(w[0] * s, w[1] * s), ptx.pack_f16x2(w[2] * s, w[3] * s),
                             ptx.pack_f16x2(w[4] * s, w[5] * s), ptx.pack_f16x2(w[6] * s, w[7] * s))
        ptx.st_shared_v4_u32(p + (((2 * h + 1) ^ x) << 4),
                             ptx.pack_f16x2(w[8] * s, w[9] * s), ptx.pack_f16x2(w[10] * s, w[11] * s),
                             ptx.pack_f16x2(w[12] * s, w[13] * s), ptx.pack_f16x2(w[14] * s, w[15] * s))

    return load_raw, decode, col


def quant_smem_words(bm: int) -> int:
    """Shared memory of a bm x 128 quantized tile: 3 A stages, then 2 W tiles (32-bit words)."""
    words = (A_STAGES * bm + 2 * BN) * ROW_BYTES // 4
    assert words * 4 <= 48 * 1024
    return words


@lru_cache(maxsize=None)
def quant_mainloop_range(ggml_type, bm, warps_m, warps_n, load_a):
    """The K loop of a bm x 128 tile over quantized W, chunks c0 .. c1 - 1 of it (c1 > c0; a
    split-K block's share): acc += A · dequant(W rows n0..n0+127)ᵀ over those 32-column chunks.
    load_a(sbase, a, a_rows, col_lo, col_hi) fills one A stage (a_rows: the first row, or a
    shared array of gathered rows); W rows past N read row N-1 and are never stored."""
    load_raw, decode, col = quant_tile_ops(ggml_type)
    warp_step = tile_ops(bm, BN, warps_m, warps_n).warp_step
    a_bytes, w_bytes = bm * ROW_BYTES, BN * ROW_BYTES
    w_base = A_STAGES * a_bytes

    # Shared at base: 3 A tiles bm x 32 fp16, then 2 W tiles 128 x 32 fp16, all swizzled
    # (gemm_tc.tile_offset).
    @cuda.jit(device=True, inline=True)
    def mainloop(a, a_rows, parts, n0, N, base, acc, c0, c1):
        cpr = a.shape[1] // BK  # chunks per W row
        n = c1 - c0  # stages
        # -- prologue: A stages 0, 1 in flight; W stage 0 decoded; raw W of stage 1 in registers --
        for s in range(A_STAGES - 1):
            if s < n:
                load_a(base + s * a_bytes, a, a_rows, col(c0 + s, 0), col(c0 + s, 1))
            ptx.cp_async_commit()
        decode(load_raw(parts, n0, N, cpr, c0), c0, base + w_base)
        raw_next = load_raw(parts, n0, N, cpr, min(c0 + 1, c1 - 1))
        rd = 0
        wr = A_STAGES - 1
        for i in range(n):
            kt = c0 + i
            # -- stage i's A and W tiles are complete after this barrier --
            ptx.cp_async_wait_group(1)
            cuda.syncthreads()
            nxt = i + A_STAGES - 1
            if nxt < n:
                load_a(base + wr * a_bytes, a, a_rows, col(c0 + nxt, 0), col(c0 + nxt, 1))
            ptx.cp_async_commit()
            raw_after = load_raw(parts, n0, N, cpr, min(kt + 2, c1 - 1))
            wb = base + w_base + (i & 1) * w_bytes
            # -- mma on stage i --
            warp_step(base + rd * a_bytes, wb, acc)
            # -- decode stage i+1 into the other W buffer (its readers passed this barrier) --
            if i + 1 < n:
                decode(raw_next, kt + 1, base + w_base + ((i + 1) & 1) * w_bytes)
            raw_next = raw_after
            rd = 0 if rd == A_STAGES - 1 else rd + 1
            wr = 0 if wr == A_STAGES - 1 else wr + 1

    return mainloop


@lru_cache(maxsize=None)
def quant_mainloop(ggml_type, bm, warps_m, warps_n, load_a):
    """quant_mainloop_range over the whole K loop: mainloop(a, a_rows, parts, n0, N, base, acc)."""
    ranged = quant_mainloop_range(ggml_type, bm, warps_m, warps_n, load_a)

    @cuda.jit(device=True, inline=True)
    def mainloop(a, a_rows, parts, n0, N, base, acc):
        ranged(a, a_rows, parts, n0, N, base, acc, 0, a.shape[1] // BK)

    return mainloop


@lru_cache(maxsize=None)
def gemm_quant_kernel(ggml_type, bm=128, warps_m=2, warps_n=4):
    ops = tile_ops(bm, BN, warps_m, warps_n)
    mainloop = quant_mainloop(ggml_type, bm, warps_m, warps_n, ops.load_a_split)
    store_c, n_acc = ops.store_c, ops.n_acc
    smem_words = quant_smem_words(bm)

    # grid (ceil(M/bm) * ceil(N/128),), block 256: a block owns the bm x 128 tile of C given by
    # block_tile, warps as in gemm_tc; shared as in quant_mainloop. parts: the PackedWeight's parts.
    @cuda.jit
    def _gemm_quant_kernel(a, parts, c, accumulate):
        N = c.shape[1]
        tm, tn = block_tile((a.shape[0] + bm - 1) // bm, (N + BN - 1) // BN)
        m0 = tm * bm
        n0 = tn * BN
        smem = cuda.shared.array(smem_words, uint32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(n_acc, float32)
        for i in range(n_acc):
            acc[i] = float32(0.0)
        mainloop(a, m0, parts, n0, N, ptx.smem_addr(smem, 0), acc)
        # -- epilogue --
        store_c(c, acc, m0, n0, accumulate)

    return _gemm_quant_kernel


def gemm_quant(a, w: PackedWeight, c, stream, accumulate: bool = False, bm: int = 128):
    """c (M, N) float32 = a (M, K) fp16 · dequant(w)ᵀ, or c += with accumulate; F16 weights go
    through gemm_f16 on their values."""
    N, K = w.rows, w.cols
    check_shapes(a, c, N, K)
    t = T(w.ggml_type)
    if t == T.F16:
        gemm_f16(a, w.parts[0].view(np.float16).reshape(N, K), c, stream, accumulate)
        return
    assert t in QUANT_TYPES, f"no tensor-core GEMM for {t.name}"
    assert K % GGML_QUANT_SIZES[t][0] == 0
    launch(gemm_quant_kernel(t, bm), grid_size(a.shape[0], N, bm, BN), THREADS, stream,
           a, w.parts, c, np.int32(accumulate))


def gemm(a, w, c, stream, accumulate: bool = False):
    """c (M, N) float32 [+]= a (M, K) fp16 · Wᵀ; w an fp16 (N, K) device array or a PackedWeight."""
    if hasattr(w, "ggml_type"):
        gemm_quant(a, w, c, stream, accumulate)
    else:
        gemm_f16(a, w, c, stream, accumulate)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import. Every type at bm 128 (a warp's 64 rows: the most
    accumulators), bm 64 at every other type (the split-K kernels build it at Q4_K, Q6_K, Q8_0)."""
    return [
        (gemm_quant_kernel(t, bm), types.void(F16_2D, parts_type(t), F32_2D, types.int32),
         {"max_registers": 168, "ptx_contains": GEMM_PTX + [f"cp.async.wait_group {A_STAGES - 2}", "st.shared.v4.u32", "cvt.rn.f16x2.f32"]})
        for i, t in enumerate(QUANT_TYPES) for bm in ((128, 64) if i % 2 == 0 else (128,))
    ]
