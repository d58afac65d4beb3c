"""What gemm_wgmma_rs's Q4_K and Q6_K kernels share: the block's shape (one warpgroup, MT m64
tiles of W rows, a token tile of nt_for's width), A's column order within each 64-column step
(perm_columns, permute_a: the order each lane's decoded pairs take in wgmma's register
fragments) and block_io's device functions (the block's coordinates, a step's token tile staged,
its eight wgmmas, the accumulators' stores).
"""

from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint32

from impnb.kernels.common import ptx, ptx_wgmma as wg

THREADS = 128
MT = 2          # m64 tiles of W a block
ALIGN = 1024
SMEM_ALIGN = ptx.SMEM_ALIGN


def perm_columns() -> np.ndarray:
    """perm[q]: the column (of a 64-column step) at fragment position q = 16 kk + 8 j + 2 t + e."""
    q = np.arange(64)
    kk, j, t, e = q // 16, (q % 16) // 8, (q % 8) // 2, q % 2
    return 32 * (kk // 2) + 8 * t + 4 * (kk % 2) + 2 * j + e


def permute_a(a: np.ndarray) -> np.ndarray:
    """A (M, K) with each 64-column step's columns in perm_columns' order."""
    M, K = a.shape
    return np.ascontiguousarray(a.reshape(M, K // 64, 64)[:, :, perm_columns()].reshape(M, K))


def nt_for(M: int) -> int:
    return 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128


def ring(stage, stages: int, slot_bytes: int):
    """(start, advance) of a kernel's ring of `stages` cp.async slots of slot_bytes from base, a
    step staged by stage(slot, w, step) (w: the kernel's operands, a tuple):
    start(base, k0, k1, w) primes it with steps k0 .. k0 + stages - 2 below k1, a commit a slot
    whether staged or not (the waits count groups); advance(base, k0, s, k1, w) -> step s's slot,
    once it has landed and every warp is done with step s - 1, whose slot then takes step s +
    stages - 1."""
    ahead = stages - 1
    wait = stages - 2

    @cuda.jit(device=True, inline=True)
    def start(base, k0, k1, w):
        for i in range(ahead):
            if k0 + i < k1:
                stage(base + i * slot_bytes, w, k0 + i)
            ptx.cp_async_commit()

    @cuda.jit(device=True, inline=True)
    def advance(base, k0, s, k1, w):
        i = s - k0
        ptx.cp_async_wait_group(wait)
        cuda.syncthreads()  # step s's slot landed; every warp's wgmmas of step s - 1 done
        if s + ahead < k1:
            stage(base + ((i + ahead) % stages) * slot_bytes, w, s + ahead)
        ptx.cp_async_commit()
        return base + (i % stages) * slot_bytes

    return start, advance


@lru_cache(maxsize=None)
def block_io(nt: int):
    """Device functions the Q4_K and Q6_K kernels share: coords(bx, KT) -> (split sp, its steps k0 .. k1
    of KT, first token m0, warp, lane's g and t, first W row n0 of block bx, the dynamic shared
    memory's aligned base); store(part, acc0, acc1, sp, m0, row0, t, M, N, col0): the lane's
    accumulators (register i of tile u: W row row0 + 64 u + 8 ((i >> 1) & 1), token m0 + 8 (i >> 2)
    + 2 t + (i & 1)) to part's columns col0 + row, rows below N and tokens below M; mma8: a step's
    eight wgmmas; tokens: a 64-column step's token tile staged; zero(acc0, acc1): both m64 tiles'
    accumulators set to 0."""
    na = nt // 2
    mma = wg.MMA_RS_K[nt]
    units = nt * 8 // THREADS  # 16-byte token copies a thread a step (nt >= 16)

    @cuda.jit(device=True, inline=True)
    def coords(bx, KT):
        S = cuda.gridDim.y
        sp = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        lane = tid & 31
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        base = (ptx.smem_addr(smem, 0) + uint32(ALIGN - 1)) & uint32(~(ALIGN - 1) & 0xFFFFFFFF)
        return (sp, sp * KT // S, (sp + 1) * KT // S, cuda.blockIdx.z * nt, tid >> 5, lane >> 2, lane & 3,
                bx * 64 * MT, base)

    @cuda.jit(device=True, inline=True)
    def store(part, acc0, acc1, sp, m0, row0, t, M, N, col0):
        for i in range(na):
            row = row0 + 8 * ((i >> 1) & 1)
            tok = m0 + 8 * (i >> 2) + 2 * t + (i & 1)
            if tok < M:
                if row < N:
                    part[sp, tok, col0 + row] = acc0[i]
                if row + 64 < N:
                    part[sp, tok, col0 + row + 64] = acc1[i]

    @cuda.jit(device=True, inline=True)
    def tokens(dst, a, m0, M, K, s):
        # -- the nt token rows' 64 columns of step s into a swizzled (128-byte) tile at dst by
        #    cp.async; rows past M zero-filled --
        tid = cuda.threadIdx.x
        for i in range(units):
            u = tid + THREADS * i
            r = u >> 3
            ch = u & 7
            row = m0 + r
            ok = row < M
            ptx.cp_async_16_zfill(dst + r * 128 + ((ch ^ (r & 7)) << 4), a,
                                  (row if ok else m0) * K + 64 * s + 8 * ch, 16 if ok else 0)

    @cuda.jit(device=True, inline=True)
    def zero(acc0, acc1):
        for i in range(na):
            acc0[i] = float32(0.0)
            acc1[i] = float32(0.0)

    @cuda.jit(device=True, inline=True)
    def mma8(acc0, acc1, p0, p1, p2, p3, desc):
        # -- a 64-column step of both m64 tiles from four rows' 8 pairs each (rows l0, l0 + 8 of
        #    tile 0; l0 + 64, l0 + 72 of tile 1), the tokens at descriptor desc; waited --
        wg.wgmma_fence()
        mma(acc0, p0[0], p1[0], p0[1], p1[1], desc)
        mma(acc0, p0[2], p1[2], p0[3], p1[3], desc + 2)
        mma(acc0, p0[4], p1[4], p0[5], p1[5], desc + 4)
        mma(acc0, p0[6], p1[6], p0[7], p1[7], desc + 6)
        mma(acc1, p2[0], p3[0], p2[1], p3[1], desc)
        mma(acc1, p2[2], p3[2], p2[3], p3[3], desc + 2)
        mma(acc1, p2[4], p3[4], p2[5], p3[5], desc + 4)
        mma(acc1, p2[6], p3[6], p2[7], p3[7], desc + 6)
        wg.wgmma_commit()
        wg.wgmma_wait(0)

    return coords, store, tokens, mma8, zero
