"""wgmma GEMM over quantized weights for a batched decode step's rows (9..128), split along K:
C (M, N) float32 [+]= A (M, K) fp16 · dequant(W)ᵀ, each weight decoded once a step.

gemm_wgmma_quant's pipeline (W decoded into shared memory while the previous wgmma group runs)
on a tile that holds every row of A up to 128, so each weight is decoded once however many rows
there are; the few-row GEMM (gemm_few.py) instead issues mma.sync for every 16 rows from each
lane's registers, and its time grows with the rows. A step's raw W blocks are loaded one step (or
four, W_AHEAD_4) before their decode (wgmma_quant_mainloop). The grid is (ceil(N / 128), S, ceil(M / bm)):
block (x, s, z) owns W rows 128 x .., A rows bm z .. and split s of the 64-deep K steps, its
partial tile going to part[s] for gemm_quant_splitk's reduce to add in split order (one split:
straight into C).

bm 64 (M <= 64): warpgroup g multiplies all 64 rows by W rows 64 g .. (m64n64); bm 128: rows
64 g .. by all 128 W rows (m64n128). Requirements (asserted): K a multiple of 64 and of the type's
block, N % 8 == 0. Numpy reference: gemm_tc.gemm_ref with the raw bytes and type.
"""

from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx, ptx_wgmma as wg
from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemm.gemm_quant_splitk import F32_3D, reduce_parts
from impnb.kernels.gemm.gemm_tc import F16_2D, aligned16, check_shapes
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES
from impnb.kernels.gemm.gemm_wgmma import ALIGN, BK, ROW, THREADS
from impnb.kernels.gemm.gemm_wgmma_quant import (A_STAGES, F16X2_WORDS, W_BUFS, W_BYTES, wgmma_quant_mainloop,
                                                 wgmma_w_ops)
from impnb.kernels.gemv.gemv import parts_type
from impnb.launch import launch

BN = 128
# (type, bm) whose raw W goes 4 steps ahead of its decode, not 1 (scripts/bench_gemm_few.py --ahead 1,4)
W_AHEAD_4 = {(T.Q6_K, 128)}
F16X2 = True         # Q4_K's and Q6_K's W decoded on f16x2 (wgmma_w_ops)
MIN_STEPS = 4         # a split's fewest K steps
FILL_STEPS = 2        # a block's pipeline start, in steps (splits_for)
PART_STEPS = 0.05     # a partial tile row's 1 KiB written and read again, in steps of W (~4.6 KiB)
BLOCKS_PER_SM = {64: 2, 128: 1}  # by bm: shared memory (97 / 129 KB a block), registers (up to 168 at bm 128)
SMEM_ALIGN = ptx.SMEM_ALIGN


def bm_for(M: int) -> int:
    return 64 if M <= 64 else 128


def w_ahead_for(ggml_type, bm: int) -> int:
    return 4 if (T(ggml_type), bm) in W_AHEAD_4 else 1


@lru_cache(maxsize=None)
def gemm_wgmma_few_kernel(ggml_type, bm: int, w_ahead: int, f16x2: bool = False):
    _, _, col = wgmma_w_ops(ggml_type)
    a_loads = bm * 8 // THREADS  # 16-byte A copies a thread a stage: 2 or 4
    assert a_loads in (2, 4), bm
    wg_cols = BN if bm == 128 else BN // 2
    nacc = wg_cols // 2

    @cuda.jit(device=True, inline=True)
    def load_a(dst, a, a_src, s):
        # -- A rows m0 .. m0+bm-1 (zero past M), the 64 columns of W chunks 2s, 2s+1 in their tile
        # places: this thread's rows r0 + 32 i at unit p of a_offsets --
        d0, p, src0, n0, src1, n1, src2, n2, src3, n3 = a_src
        k = col(2 * s + (p >> 2), (p >> 1) & 1) + 8 * (p & 1)
        ptx.cp_async_16_zfill(dst + d0, a, src0 + k, n0)
        ptx.cp_async_16_zfill(dst + d0 + 32 * ROW, a, src1 + k, n1)
        if a_loads == 4:
            ptx.cp_async_16_zfill(dst + d0 + 64 * ROW, a, src2 + k, n2)
            ptx.cp_async_16_zfill(dst + d0 + 96 * ROW, a, src3 + k, n3)

    @cuda.jit(device=True, inline=True)
    def a_offsets(m0, M, K):
        # -- this thread's A copies, fixed for the kernel: (its 16-byte unit's offset in a stage, the
        # unit p, then (element offset of its row, bytes) for rows r0 + 32 i): rows r0 = tid >> 3,
        # unit p = tid & 7 of a 128-byte row, swizzled by (r & 7), which 32 i does not change --
        tid = cuda.threadIdx.x
        r0 = tid >> 3
        p = tid & 7
        rows = (m0 + r0, m0 + r0 + 32, m0 + r0 + 64, m0 + r0 + 96)
        return (uint32(r0 * ROW + ((p ^ (r0 & 7)) << 4)), p,
                min(rows[0], M - 1) * K, 16 if rows[0] < M else 0, min(rows[1], M - 1) * K, 16 if rows[1] < M else 0,
                min(rows[2], M - 1) * K, 16 if rows[2] < M else 0, min(rows[3], M - 1) * K, 16 if rows[3] < M else 0)

    if bm == 128:
        mainloop = wgmma_quant_mainloop(ggml_type, bm * ROW, wg_cols, 64 * ROW, 0, load_a, w_ahead, f16x2)
    else:
        mainloop = wgmma_quant_mainloop(ggml_type, bm * ROW, wg_cols, 0, wg_cols * ROW, load_a, w_ahead, f16x2)

    # grid (ceil(N / 128), S, ceil(M / bm)), block 256: block (x, s, z) as the module says; warpgroup
    # g's warp w holds rows 16 w .. of its m64 tile, lane (r, c) = (lane >> 2, lane & 3) the
    # accumulator fragment of ptx_wgmma. Shared (dynamic, 1024-aligned): the A ring, then the
    # three W buffers. out: part (S, M, N), or C as (1, M, N) with accumulate.
    @cuda.jit
    def _gemm_wgmma_few_kernel(a, parts, out, accumulate):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        S = cuda.gridDim.y
        s = cuda.blockIdx.y
        M, K = a.shape
        N = out.shape[2]
        cpr = K // 32
        KT = K // BK
        k0 = s * KT // S
        m0 = cuda.blockIdx.z * bm
        n0 = cuda.blockIdx.x * BN
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        base = (ptx.smem_addr(smem, 0) + uint32(ALIGN - 1)) & uint32(~(ALIGN - 1) & 0xFFFFFFFF)
        tid = cuda.threadIdx.x
        g = tid >> 7
        acc = cuda.local.array(nacc, float32)
        mainloop(a, a_offsets(m0, M, K), parts, n0, N, cpr, k0, (s + 1) * KT // S - k0, base, g, acc)
        # -- epilogue: this split's partial tile --
        lane = tid & 31
        row0 = m0 + 16 * ((tid >> 5) & 3) + (lane >> 2) + (64 * g if bm == 128 else 0)
        col0 = n0 + 2 * (lane & 3) + (0 if bm == 128 else wg_cols * g)
        for half in range(2):
            row = row0 + 8 * half
            if row < M:
                for j in range(nacc // 4):
                    cn = col0 + 8 * j
                    if cn < N:
                        v0 = acc[4 * j + 2 * half]
                        v1 = acc[4 * j + 2 * half + 1]
                        if accumulate:
                            v0 += out[s, row, cn]
                            v1 += out[s, row, cn + 1]
                        ptx.st_global_v2_f32(out, (s * M + row) * N + cn, v0, v1)

    _gemm_wgmma_few_kernel.__name__ = f"_gemm_wgmma_few_{T(ggml_type).name.lower()}_bm{bm}_kernel"
    return _gemm_wgmma_few_kernel


def shared_bytes(bm: int) -> int:
    return A_STAGES * bm * ROW + W_BUFS * W_BYTES + ALIGN


def supports(ggml_type, K: int) -> bool:
    t = T(ggml_type)
    return t in QUANT_TYPES and K % BK == 0 and K % GGML_QUANT_SIZES[t][0] == 0


def splits_for(M: int, N: int, K: int, sms: int = 132) -> int:
    """The split count of the fewest block-steps a slot: waves of the SMs' BLOCKS_PER_SM[bm] slots,
    each a block's steps plus FILL_STEPS for its pipeline's start plus PART_STEPS a row for its
    partial tile's write and read where split; each split at least MIN_STEPS steps deep, the fewest
    splits among equals. On the Qwen3-8B shapes at 16 / 32 / 64 / 128 rows it picks a split count
    measured within 7% of the best measured (scripts/bench_gemm_few.py --kernels wgf)."""
    bm = bm_for(M)
    tiles = -(-N // BN) * -(-M // bm)
    slots = sms * BLOCKS_PER_SM[bm]
    steps = K // BK

    def cost(S):
        part = PART_STEPS * min(M, bm) if S > 1 else 0
        return -(-tiles * S // slots) * (-(-steps // S) + FILL_STEPS + part)
    return min(range(1, max(1, steps // MIN_STEPS) + 1), key=lambda S: (cost(S), S))


def _launch(a, w: PackedWeight, out, stream, splits: int, accumulate: bool, w_ahead: int | None = None,
            f16x2: bool = F16X2):
    M, K = a.shape
    N = w.rows
    t = T(w.ggml_type)
    assert supports(t, K) and w.cols == K and N % 8 == 0, f"no few-row wgmma GEMM for {t.name} {N}x{K}"
    assert 1 <= splits <= K // BK, f"{splits} splits of {K // BK} steps"
    assert a.dtype == np.float16 and a.is_c_contiguous() and aligned16(a)
    assert out.dtype == np.float32 and out.shape == (splits, M, N) and out.is_c_contiguous()
    bm = bm_for(M)
    launch(gemm_wgmma_few_kernel(t, bm, w_ahead or w_ahead_for(t, bm), f16x2), (-(-N // BN), splits, -(-M // bm)),
           THREADS, stream, a, w.parts, out, np.int32(accumulate), shared_bytes=shared_bytes(bm))


def gemm_wgmma_few(a, w: PackedWeight, c, part, stream, splits: int, accumulate: bool = False,
                   w_ahead: int | None = None, f16x2: bool | None = None, reduce: bool = True):
    """c (M, N) float32 = a (M, K) fp16 · dequant(w)ᵀ (c += with accumulate) in `splits` K parts;
    part: a float32 scratch (splits, M, N), unused at one split; w_ahead: raw W steps in flight
    (1 or 4; w_ahead_for's by default); reduce=False leaves the partial products in part at any
    split count (c untouched)."""
    check_shapes(a, c, w.rows, w.cols)
    f16x2 = F16X2 if f16x2 is None else f16x2
    if not reduce:
        _launch(a, w, part, stream, splits, False, w_ahead, f16x2)
        return
    if splits == 1:
        _launch(a, w, c.reshape(1, *c.shape), stream, 1, accumulate, w_ahead, f16x2)
        return
    _launch(a, w, part, stream, splits, False, w_ahead, f16x2)
    reduce_parts(part, (c, c, c), w.rows, 0, accumulate, stream)


def gemm_wgmma_few_split(a, w: PackedWeight, ys, part, stream, splits: int, reduce: bool = True):
    """Rows of W stacked from up to three matrices (Q|K|V): ys[i] (M, N_i) = a · dequant(W rows of i)ᵀ,
    each N_i a multiple of 4; part (splits, M, N) as in gemm_wgmma_few, used at any split count;
    reduce=False leaves the partial products there (ys untouched)."""
    assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows and all(y.shape[1] % 4 == 0 for y in ys)
    y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
    n0, n1 = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0
    _launch(a, w, part, stream, splits, False)
    if reduce:
        reduce_parts(part, (y0, y1, y2), n0, n1, False, stream)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [] if wg.SIM else [
        (gemm_wgmma_few_kernel(t, bm, w_ahead_for(t, bm), F16X2), types.void(F16_2D, parts_type(t), F32_3D, types.int32),
         {"ptx_contains": [f"wgmma.mma_async.sync.aligned.m64n{bm}k16.f32.f16.f16"]
          + (["fma.rn.f16x2", "prmt.b32"] if F16X2 and t in F16X2_WORDS else []), "max_registers": 255})
        for t in QUANT_TYPES for bm in (64, 128)
    ]
