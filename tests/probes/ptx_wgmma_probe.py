"""Probe kernel for the layout test of attention's wgmma forms (tests/gpu/test_ptx_wgmma.py).

One warpgroup copies host-built shared-memory images in word by word, runs ptx_wgmma.MMA_FIRST
(A and B K-major from shared memory, the accumulators' old values ignored) and then MMA_RS (A
from each thread's registers, B MN-major, added to host-given accumulators), and writes every
thread's accumulators back raw. The probe knows no layout: the test builds the images, the A
registers and the accumulator map from the PTX ISA.
"""

from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx, ptx_wgmma as wg

A_WORDS = 64 * 32         # K-major A image: 64 rows x 128 bytes
MN_BLOCK = 16 * 128       # MN-major B image: a 64-wide n block of 16 k rows, bytes (its LBO)
NAN = np.float32(np.nan)
SMEM_ALIGN = ptx.SMEM_ALIGN  # a global, so numba types it as a literal


@lru_cache(maxsize=None)
def wgmma_probe(n: int, dtype: str):
    """grid 1, block 128. sa (A_WORDS,), sb (32 n,) (K-major B: n rows x 128 bytes) and smn (8 n,)
    (MN-major B: n / 64 blocks of MN_BLOCK bytes) uint32 images; a (128, 4) uint32: each thread's
    A words for MMA_RS; c (128, n / 2) float32: its accumulators before MMA_RS. d_first, d_rs
    (128, n / 2) float32: its accumulators after MMA_FIRST (from NaN) and after MMA_RS."""
    first = wg.MMA_FIRST[dtype][n]
    rs = wg.MMA_RS[dtype][n]
    B_WORDS = 32 * n
    MN_WORDS = 8 * n
    NA = n // 2                  # accumulators a thread
    WORDS = A_WORDS + B_WORDS + MN_WORDS + 256  # + 1024 bytes of room to align the images

    def probe(sa, sb, smn, a, c, d_first, d_rs):
        sm = cuda.shared.array(WORDS, uint32, alignment=SMEM_ALIGN)
        start = ptx.smem_addr(sm, 0)
        base = (start + uint32(1023)) & uint32(0xFFFFFC00)
        w0 = (base - start) >> 2
        t = cuda.threadIdx.x
        for i in range(t, A_WORDS, 128):
            sm[w0 + i] = sa[i]
        for i in range(t, B_WORDS, 128):
            sm[w0 + A_WORDS + i] = sb[i]
        for i in range(t, MN_WORDS, 128):
            sm[w0 + A_WORDS + B_WORDS + i] = smn[i]
        wg.fence_proxy_async()
        cuda.syncthreads()
        acc = cuda.local.array(NA, float32)
        for i in range(NA):
            acc[i] = NAN
        wg.wgmma_fence()
        first(acc, wg.desc_sw128(base), wg.desc_sw128(base + 4 * A_WORDS))
        wg.wgmma_commit()
        wg.wgmma_wait(0)
        for i in range(NA):
            d_first[t, i] = acc[i]
            acc[i] = c[t, i]
        wg.wgmma_fence()
        rs(acc, a[t, 0], a[t, 1], a[t, 2], a[t, 3], wg.desc_sw128_mn(base + 4 * (A_WORDS + B_WORDS), MN_BLOCK))
        wg.wgmma_commit()
        wg.wgmma_wait(0)
        for i in range(NA):
            d_rs[t, i] = acc[i]

    probe.__name__ = f"_wgmma_probe_n{n}_{dtype}_kernel"
    return cuda.jit(probe)


_U32_1D = types.Array(types.uint32, 1, "C")
_U32_2D = types.Array(types.uint32, 2, "C")
F32_2D = types.Array(types.float32, 2, "C")
SIG = types.void(_U32_1D, _U32_1D, _U32_1D, _U32_2D, F32_2D, F32_2D, F32_2D)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [] if wg.SIM else [
        (wgmma_probe(n, t), SIG, {"ptx_contains": [f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t}"]})
        for n in (64, 128) for t in ("f16", "bf16")]
