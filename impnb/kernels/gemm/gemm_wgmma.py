"""Hopper GEMM tiles on wgmma: C (M, N) float32 [+]= A (M, K) fp16 · W (N, K)ᵀ fp16, fp32 accumulation.

A block is two warpgroups (256 threads) over a 128 x BN tile of C, each warpgroup 64 rows of
it as one m64nBNk16 accumulator (BN / 2 fp32 registers a thread; ptx_wgmma.py). K advances
64 at a time through a ring of STAGES shared-memory stages, each an A tile 128 x 64 and a W tile
BN x 64 in the 128-byte swizzle wgmma reads (row r's 16-byte chunk ch at chunk ch ^ (r & 7)),
filled by cp.async from all 256 threads, STAGES - 2 tiles ahead: the stage refilled at step k
was last read by the wgmma group of step k - 2, which every thread has waited for
(wgmma_wait(1) at the end of step k - 1) before the barrier of step k. Rows past M and N are
zero-filled and never stored; blocks raster over groups of 8 M tiles (gemm_tc.block_tile).

Requirements (asserted in gemm_wgmma): K % 64 == 0, N % 8 == 0, M >= 1; C-contiguous, 16-byte
aligned arrays. Numpy reference: gemm_tc.gemm_ref. sm_90a only: no simulator twin.
"""

from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx, ptx_wgmma as wg
from impnb.kernels.gemm.gemm_tc import aligned16, block_tile, grid_size
from impnb.launch import launch

BM = 128          # rows of C a block: two warpgroups of 64
BK = 64           # K per stage: one 128-byte swizzle row of fp16
THREADS = 256
ROW = 2 * BK      # bytes per tile row
ALIGN = 1024      # the swizzle pattern repeats every 8 rows: tiles start 1024-byte aligned
TILES = {"n128s4": (128, 4), "n256s4": (256, 4), "n128s3": (128, 3)}  # name -> (BN, STAGES)
DEFAULT_TILE = "n256s4"
SMEM_ALIGN = ptx.SMEM_ALIGN


def tile_store(nacc: int):
    """The device function store(c, acc, m0, n0, M, N, tid, g, accumulate) of a block's tile of C
    at (m0, n0), rows 64 g .. of warpgroup g's accumulator acc (nacc fp32 registers a thread, the
    fragment of ptx_wgmma): c = acc, or c += acc with accumulate; rows past M and columns past N
    are not stored."""
    @cuda.jit(device=True, inline=True)
    def store(c, acc, m0, n0, M, N, tid, g, accumulate):
        # -- register i -> row 16 w + r + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 c + (i & 1) --
        lane = tid & 31
        row0 = m0 + 64 * g + 16 * ((tid >> 5) & 3) + (lane >> 2)
        col0 = n0 + 2 * (lane & 3)
        for half in range(2):
            row = row0 + 8 * half
            if row < M:
                for j in range(nacc // 4):
                    col = col0 + 8 * j
                    if col < N:
                        v0 = acc[4 * j + 2 * half]
                        v1 = acc[4 * j + 2 * half + 1]
                        if accumulate:
                            v0 += c[row, col]
                            v1 += c[row, col + 1]
                        ptx.st_global_v2_f32(c, row * N + col, v0, v1)
    return store


@lru_cache(maxsize=None)
def gemm_wgmma_kernel(bn: int, stages: int):
    A_BYTES = BM * ROW
    STAGE = A_BYTES + bn * ROW
    A_LOADS = BM * 8 // THREADS   # 16-byte chunks a thread copies per stage
    B_LOADS = bn * 8 // THREADS
    NACC = bn // 2
    AHEAD = stages - 2            # tiles in flight beyond the one multiplied
    PENDING = AHEAD - 1           # cp.async groups left pending once tile k has landed
    mma = wg.MMA["f16"][bn]
    store = tile_store(NACC)
    assert AHEAD >= 1 and STAGE % ALIGN == 0

    @cuda.jit(device=True, inline=True)
    def load_rows(dst, src, row0, n_rows, K, k0, loads):
        # -- tile rows row0.. (zero past n_rows) of columns k0 .. k0 + 63 into the swizzled tile --
        tid = cuda.threadIdx.x
        for i in range(loads):
            idx = tid + THREADS * i
            r = idx >> 3
            ch = idx & 7
            row = row0 + r
            ptx.cp_async_16_zfill(dst + r * ROW + ((ch ^ (r & 7)) << 4), src,
                                  min(row, n_rows - 1) * K + k0 + 8 * ch, 16 if row < n_rows else 0)

    # grid (tiles,), block 256: warpgroup g = tid >> 7 owns C rows m0 + 64 g .. + 63; warp w of it
    # rows + 16 w .., lane (r, c) = (lane >> 2, lane & 3) the accumulator fragment of ptx_wgmma.
    @cuda.jit
    def _gemm_wgmma_kernel(a, w, c, accumulate):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        M, K = a.shape
        N = w.shape[0]
        tm, tn = block_tile((M + BM - 1) // BM, (N + bn - 1) // bn)
        m0 = tm * BM
        n0 = tn * bn
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        base = (ptx.smem_addr(smem, 0) + uint32(ALIGN - 1)) & uint32(~(ALIGN - 1) & 0xFFFFFFFF)
        tid = cuda.threadIdx.x
        g = tid >> 7
        KT = K // BK
        for s in range(AHEAD):
            if s < KT:
                load_rows(base + s * STAGE, a, m0, M, K, s * BK, A_LOADS)
                load_rows(base + s * STAGE + A_BYTES, w, n0, N, K, s * BK, B_LOADS)
            ptx.cp_async_commit()
        acc = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = float32(0)
        for kt in range(KT):
            ptx.cp_async_wait_group(PENDING)
            wg.fence_proxy_async()   # this thread's cp.async writes, visible to wgmma
            cuda.syncthreads()
            nk = kt + AHEAD
            if nk < KT:
                slot = base + (nk % stages) * STAGE
                load_rows(slot, a, m0, M, K, nk * BK, A_LOADS)
                load_rows(slot + A_BYTES, w, n0, N, K, nk * BK, B_LOADS)
            ptx.cp_async_commit()
            slot = base + (kt % stages) * STAGE
            da = wg.desc_sw128(slot + g * (64 * ROW))
            db = wg.desc_sw128(slot + A_BYTES)
            wg.wgmma_fence()
            for kk in range(BK // 16):
                mma(acc, da + 2 * kk, db + 2 * kk)
            wg.wgmma_commit()
            wg.wgmma_wait(1)
        wg.wgmma_wait(0)
        store(c, acc, m0, n0, M, N, tid, g, accumulate)

    _gemm_wgmma_kernel.__name__ = f"_gemm_wgmma_n{bn}_s{stages}_kernel"
    return _gemm_wgmma_kernel


def shared_bytes(bn: int, stages: int) -> int:
    return stages * (BM + bn) * ROW + ALIGN  # + ALIGN: room to align the first tile


def gemm_wgmma(a, w, c, stream, accumulate: bool = False, tile: str = DEFAULT_TILE):
    """c (M, N) float32 = a (M, K) fp16 · w (N, K)ᵀ fp16, or c += with accumulate; tile a TILES key."""
    M, K = a.shape
    N = w.shape[0]
    assert w.shape == (N, K) and c.shape == (M, N), (a.shape, w.shape, c.shape)
    assert M >= 1 and K % BK == 0 and N % 8 == 0, f"wgmma tiles need K % {BK} == 0 and N % 8 == 0: N={N} K={K}"
    assert a.dtype == np.float16 and w.dtype == np.float16 and c.dtype == np.float32
    for x in (a, w, c):
        assert x.is_c_contiguous() and aligned16(x)
    bn, stages = TILES[tile]
    launch(gemm_wgmma_kernel(bn, stages), grid_size(M, N, BM, bn), THREADS, stream, a, w, c,
           np.int32(accumulate), shared_bytes=shared_bytes(bn, stages))


F16_2D = types.Array(types.float16, 2, "C")
F32_2D = types.Array(types.float32, 2, "C")


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [] if wg.SIM else [
        (gemm_wgmma_kernel(*TILES[name]), types.void(F16_2D, F16_2D, F32_2D, types.int32),
         {"ptx_contains": ["wgmma.mma_async.sync.aligned.m64n%dk16.f32.f16.f16" % TILES[name][0],
                           "wgmma.fence.sync.aligned", "fence.proxy.async.shared::cta", "cp.async.cg.shared.global"]})
        for name in TILES
    ]
