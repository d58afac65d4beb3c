"""gemm_wgmma_rs's Q6_K kernel: a step 128 columns (half a superblock: ql bytes i and 32 + i and
qh byte i hold columns i, + 32, + 64, + 96); lane (g, t) takes the same columns of each 64-column
half as of a Q4_K step (8t .., 32 + 8t ..; low nibbles and qh bits 0-3 the first half, high
nibbles and bits 4-7 the second), so A's permutation is Q4_K's; two sets of eight wgmmas a step,
the tokens' 128 columns as two 64-column swizzled tiles; each step's tokens, ql, qh and scales
staged by cp.async `stages` deep, the superblock's d read from global memory.
"""

from functools import lru_cache

from numba import cuda, float32, int32

from impnb.kernels.common import ptx, ptx_wgmma as wg
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.quant_blocks_k import h2, q6_pairs
from impnb.kernels.gemm.gemm_wgmma_rs_block import ALIGN, THREADS, block_io, ring


@cuda.jit(device=True, inline=True)
def _s8(word, b):
    # byte b of word as a signed int32
    v = int32(qi.shr32(word, 8 * b) & 0xFF)
    return int32(v - 256) if v > 127 else v


Q6_SLOT = 128 * (64 + 32 + 16)  # a 128-column step's ql (64 bytes a row), qh (32) and the superblock's scales (16)


def shared_bytes(nt: int, stages: int = 3) -> int:
    return stages * (nt * 256 + Q6_SLOT) + ALIGN


@lru_cache(maxsize=None)
def gemm_wgmma_rs_q6_k_kernel(nt: int, stages: int = 3):
    """The kernel (a, ql, qh, sc, dsb, part) for token tiles of nt rows, `stages` steps deep (the
    module's docstring: its layout)."""
    body = q6_k_body(nt, stages)

    @cuda.jit
    def kernel(a, ql, qh, sc, dsb, part):
        body(a, ql, qh, sc, dsb, part, cuda.blockIdx.x, 0, part.shape[2])

    kernel.__name__ = f"_gemm_wgmma_rs_q6_k_n{nt}_s{stages}_kernel"
    return kernel


@lru_cache(maxsize=None)
def q6_k_body(nt: int, stages: int):
    """The Q6_K kernel's work as a device function body(a, ql, qh, sc, dsb, part, bx, col0, N):
    block bx of W's N rows, its partial products to part's columns col0 .."""
    coords, store, tokens, mma8, zero = block_io(nt)
    na = nt // 2
    tb = nt * 256              # a step's tokens: two tiles of nt rows x 128 bytes
    sb = tb + Q6_SLOT
    units = nt * 16 // THREADS  # 16-byte token copies a thread a step

    @cuda.jit(device=True, inline=True)
    def stage(dst, w, s):
        a, ql, qh, sc, m0, n0, M, N, K = w
        tid = cuda.threadIdx.x
        for i in range(units):
            u = tid + THREADS * i
            r = u >> 4
            ch = u & 15  # 16-byte chunk of the row's 128 columns: tile ch >> 3, chunk ch & 7
            row = m0 + r
            ok = row < M
            ptx.cp_async_16_zfill(dst + (ch >> 3) * nt * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4), a,
                                  (row if ok else m0) * K + 128 * s + 8 * ch, 16 if ok else 0)
        wdst = dst + tb
        for i in range(4):  # ql: 4 copies a row
            u = tid + THREADS * i
            r = u >> 2
            wr = min(n0 + r, N - 1)
            ptx.cp_async_16(wdst + r * 64 + 16 * (u & 3), ql, wr * (K // 8) + 16 * s + 4 * (u & 3))
        for i in range(2):  # qh: 2 a row
            u = tid + THREADS * i
            r = u >> 1
            wr = min(n0 + r, N - 1)
            ptx.cp_async_16(wdst + 128 * 64 + r * 32 + 16 * (u & 1), qh, wr * (K // 16) + 8 * s + 4 * (u & 1))
        ptx.cp_async_16(wdst + 128 * 96 + tid * 16, sc, min(n0 + tid, N - 1) * (K // 16) + 16 * (s >> 1))

    start, advance = ring(stage, stages, sb)

    @cuda.jit(device=True, inline=True)
    def row_frags(wsl, lr, t, s, d, hi):
        # -- one row's 8 f16x2 pairs of half `hi` of step s, in slot order (kk, j) --
        l0, l1 = ptx.ld_shared_v2_u32(wsl + lr * 64 + 8 * t)
        l2, l3 = ptx.ld_shared_v2_u32(wsl + lr * 64 + 32 + 8 * t)
        q0, q1 = ptx.ld_shared_v2_u32(wsl + 128 * 64 + lr * 32 + 8 * t)
        sw = ptx.ld_shared_u32(wsl + 128 * 96 + lr * 16 + 8 * (s & 1) + 4 * hi)  # this half's scales 4 hi ..
        ls = h2(d * float32(_s8(sw, t >> 1)))
        hs = h2(d * float32(_s8(sw, 2 + (t >> 1))))
        sh = 4 * hi  # ql's nibble; qh's bits 4 hi .. (columns 8t ..) and 4 hi + 2 .. (32 + 8t ..)
        a0, a1 = q6_pairs((qi.shr32(l0, sh) & qi.LO4) | ((qi.shr32(q0, sh) & qi.LO2) << 4), ls)
        c0, c1 = q6_pairs((qi.shr32(l1, sh) & qi.LO4) | ((qi.shr32(q1, sh) & qi.LO2) << 4), ls)
        b0, b1 = q6_pairs((qi.shr32(l2, sh) & qi.LO4) | ((qi.shr32(q0, sh + 2) & qi.LO2) << 4), hs)
        f0, f1 = q6_pairs((qi.shr32(l3, sh) & qi.LO4) | ((qi.shr32(q1, sh + 2) & qi.LO2) << 4), hs)
        return a0, a1, c0, c1, b0, b1, f0, f1

    @cuda.jit(device=True, inline=True)
    def half(acc0, acc1, wsl, l0, t, s, dd, hi, desc):
        d0, d1, d2, d3 = dd
        p0 = row_frags(wsl, l0, t, s, d0, hi)
        p1 = row_frags(wsl, l0 + 8, t, s, d1, hi)
        p2 = row_frags(wsl, l0 + 64, t, s, d2, hi)
        p3 = row_frags(wsl, l0 + 72, t, s, d3, hi)
        mma8(acc0, acc1, p0, p1, p2, p3, desc)

    @cuda.jit(device=True, inline=True)
    def body(a, ql, qh, sc, dsb, part, bx, col0, N):
        ptx.grid_dep_wait()
        ptx.grid_dep_launch()
        M, K = a.shape
        sp, k0, k1, m0, warp, g, t, n0, base = coords(bx, K // 128)
        w = (a, ql, qh, sc, m0, n0, M, N, K)
        start(base, k0, k1, w)
        acc0 = cuda.local.array(na, float32)
        acc1 = cuda.local.array(na, float32)
        zero(acc0, acc1)
        l0 = 16 * warp + g
        r0 = min(n0 + l0, N - 1)
        r1 = min(n0 + l0 + 8, N - 1)
        r2 = min(n0 + l0 + 64, N - 1)
        r3 = min(n0 + l0 + 72, N - 1)
        for s in range(k0, k1):
            sbk = s >> 1
            dd = (float32(dsb[r0 * (K // 256) + sbk]), float32(dsb[r1 * (K // 256) + sbk]),
                  float32(dsb[r2 * (K // 256) + sbk]), float32(dsb[r3 * (K // 256) + sbk]))
            sl = advance(base, k0, s, k1, w)
            half(acc0, acc1, sl + tb, l0, t, s, dd, 0, wg.desc_sw128(sl))
            half(acc0, acc1, sl + tb, l0, t, s, dd, 1, wg.desc_sw128(sl + nt * 128))
        ptx.cp_async_wait_all()
        store(part, acc0, acc1, sp, m0, n0 + 16 * warp + g, t, M, N, col0)

    return body
