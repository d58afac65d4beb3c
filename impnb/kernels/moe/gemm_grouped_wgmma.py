"""Grouped expert GEMM on wgmma (MoE prefill, sm_90a): gemm_grouped's tiles on gemm_wgmma_quant's
pipeline.

For each tile (e, r0, n) that moe.moe_group wrote (at most BM = 64 rows): C[r0 .. r0+n) = A[rows]
fp16 · dequant(W_e)ᵀ, A's rows gathered as gemm_grouped gathers them (order[r] // x_div, or r
itself with x_div = 0). A block is gemm_wgmma_quant's (256 threads, 64-deep stages in the 128-byte
swizzle, W decoded by all 256 threads into three buffers, A in a 4-stage cp.async ring) over a
64 x 128 tile: warpgroup g multiplies the tile's 64 rows by W rows 64g .. 64g + 63 (m64n64k16, so
neither warpgroup branches around a wgmma) while both decode the next stage's W. Against
gemm_grouped's mma.sync tiles (32-deep stages, a barrier each, the decode after the mma) the
multiply runs asynchronously beside the decode, and there is one barrier every 64 columns.

Requirements (asserted): a quantized type of gemm_tc_quant.QUANT_TYPES, K a multiple of 64 and
of the type's block, N % 8 == 0. Numpy reference: gemm_grouped.grouped_ref. No simulator twin.
"""

from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda, float32, int32, types, uint32

from impnb.kernels.common import ptx, ptx_wgmma as wg
from impnb.kernels.gemm.gemm_tc import aligned16
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES
from impnb.kernels.gemm.gemm_wgmma import ALIGN, BK, ROW, THREADS
from impnb.kernels.gemm.gemm_wgmma_quant import A_STAGES, W_BUFS, W_BYTES, wgmma_quant_mainloop, wgmma_w_ops
from impnb.kernels.gemv.gemv import parts_type
from impnb.kernels.moe.gemm_grouped import BM
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch

BN = 128
A_BYTES = BM * ROW
A_LOADS = BM * 8 // THREADS  # 16-byte A chunks a thread copies a stage
WG_COLS = BN // 2  # W rows (C columns) a warpgroup
NACC = WG_COLS // 2
SMEM_ALIGN = ptx.SMEM_ALIGN


@lru_cache(maxsize=None)
def gemm_grouped_wgmma_kernel(ggml_type):
    _, _, col = wgmma_w_ops(ggml_type)

    @cuda.jit(device=True, inline=True)
    def load_a(dst, a, a_src, s):
        # -- the tile's gathered A rows (a_rows[r] < 0: zeros), the 64 columns of W chunks 2s,
        # 2s+1 in their tile places --
        a_rows, K = a_src
        tid = cuda.threadIdx.x
        for i in range(A_LOADS):
            idx = tid + THREADS * i
            r = idx >> 3
            p = idx & 7
            src = a_rows[r]
            k = col(2 * s + (p >> 2), (p >> 1) & 1) + 8 * (p & 1)
            ptx.cp_async_16_zfill(dst + r * ROW + ((p ^ (r & 7)) << 4), a, max(src, 0) * K + k,
                                  16 if src >= 0 else 0)

    mainloop = wgmma_quant_mainloop(ggml_type, A_BYTES, WG_COLS, 0, WG_COLS * ROW, load_a)

    # grid (ceil(N / 128), max_tiles), block 256: block (x, y) owns columns 128x.. of tile y (if
    # y < n_tiles), warpgroup g its columns + 64g ..; warp w of it rows 16w.., lane (r, c) =
    # (lane >> 2, lane & 3) the accumulator fragment of ptx_wgmma. Shared: the tile's A source
    # rows int32[64] (static), then (dynamic, 1024-aligned) the A ring and the W buffers. The W
    # tile decoded at step k + 1 goes into the buffer step k - 2's wgmma groups read, retired by
    # every thread's wgmma_wait(1) at the end of step k - 1, before the barrier of step k;
    # likewise the A stage refilled at step k.
    @cuda.jit
    def _gemm_grouped_wgmma_kernel(a, parts, c, tiles, n_tiles, order, x_div):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        ti = cuda.blockIdx.y
        if ti >= n_tiles[0]:
            return
        e = tiles[ti, 0]
        r0 = tiles[ti, 1]
        n = tiles[ti, 2]
        N = c.shape[1]
        K = a.shape[1]
        cpr = K // 32      # W chunks per row
        KT = K // BK       # steps
        n0 = e * N + cuda.blockIdx.x * BN
        n_end = (e + 1) * N
        tid = cuda.threadIdx.x
        a_rows = cuda.shared.array(BM, int32)
        if tid < BM:
            a_rows[tid] = -1 if tid >= n else (order[r0 + tid] // x_div if x_div > 0 else r0 + tid)
        cuda.syncthreads()
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        base = (ptx.smem_addr(smem, 0) + uint32(ALIGN - 1)) & uint32(~(ALIGN - 1) & 0xFFFFFFFF)
        g = tid >> 7
        acc = cuda.local.array(NACC, float32)
        mainloop(a, (a_rows, K), parts, n0, n_end, cpr, 0, KT, base, g, acc)
        # -- epilogue: rows r0 .. r0+n-1, columns of this block within the expert's N --
        lane = tid & 31
        row0 = 16 * ((tid >> 5) & 3) + (lane >> 2)
        col0 = cuda.blockIdx.x * BN + g * WG_COLS + 2 * (lane & 3)
        for half in range(2):
            r = row0 + 8 * half
            if r < n:
                row = r0 + r
                for j in range(NACC // 4):
                    cn = col0 + 8 * j
                    if cn < N:
                        ptx.st_global_v2_f32(c, row * N + cn, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1])

    _gemm_grouped_wgmma_kernel.__name__ = f"_gemm_grouped_wgmma_{T(ggml_type).name.lower()}_kernel"
    return _gemm_grouped_wgmma_kernel


def shared_bytes() -> int:
    return A_STAGES * A_BYTES + W_BUFS * W_BYTES + ALIGN


def supports(ggml_type: T, K: int) -> bool:
    """Whether the kernel takes an expert weight of this type and K."""
    return T(ggml_type) in QUANT_TYPES and K % BK == 0 and K % GGML_QUANT_SIZES[T(ggml_type)][0] == 0


def gemm_grouped_wgmma(a, w: PackedWeight, n_rows: int, c, tiles, n_tiles, order, x_div: int, stream) -> None:
    """gemm_grouped's contract on wgmma: c (S, n_rows) float32 = tile rows of a (rows, K) fp16
    times their expert of w (E * n_rows, K); rows of c no tile covers are left as they were."""
    K = a.shape[1]
    assert w.cols == K and w.rows % n_rows == 0 and c.shape[1] == n_rows and n_rows % 8 == 0
    assert supports(w.ggml_type, K), (T(w.ggml_type).name, K)
    assert a.dtype == np.float16 and a.is_c_contiguous() and aligned16(a)
    assert c.dtype == np.float32 and c.is_c_contiguous() and aligned16(c)
    launch(gemm_grouped_wgmma_kernel(w.ggml_type), (-(-n_rows // BN), tiles.shape[0]), THREADS, stream,
           a, w.parts, c, tiles, n_tiles, order, np.int32(x_div), shared_bytes=shared_bytes())


_I32_1D = types.Array(types.int32, 1, "C")
F16_2D = types.Array(types.float16, 2, "C")
F32_2D = types.Array(types.float32, 2, "C")


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [] if wg.SIM else [
        (gemm_grouped_wgmma_kernel(t), types.void(F16_2D, parts_type(t), F32_2D, types.Array(types.int32, 2, "C"),
                                                  _I32_1D, _I32_1D, types.int32),
         {"ptx_contains": ["wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", "st.shared.v4.u32",
                           "cvt.rn.f16x2.f32", "fence.proxy.async.shared::cta"]})
        for t in QUANT_TYPES
    ]
