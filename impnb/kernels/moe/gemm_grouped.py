"""Grouped tensor-core GEMM over routed experts (MoE prefill).

For each tile (e, r0, n) that moe.moe_group wrote: C[r0 .. r0+n) = A[rows] fp16 · dequant(W_e)ᵀ,
W_e the e-th of E stacked (N, K) experts in their GGUF type, A's rows gathered by the tile:
order[r] // x_div (the tokens routed to e; x_div = k) or r itself (rows already in expert
order; x_div = 0). gemm_tc_quant's pipeline (quant_mainloop) with a gathered A tile.
Numpy reference: `grouped_ref`.
"""

from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda, float32, int32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.gemm.gemm_tc import (GEMM_PTX, ROW_BYTES, THREADS, F16_2D, F32_2D, aligned16,
                                   tile_offset, tile_ops)
from impnb.kernels.gemm.gemm_tc_quant import BN, quant_mainloop, quant_smem_words
from impnb.kernels.gemm.dequant import DECODERS, dequant_ref
from impnb.kernels.gemv.gemv import parts_type
from impnb.kernels.common.repack import PackedWeight
from impnb.launch import launch

BM = 64  # rows per tile: moe_group's tm
SMEM_ALIGN = ptx.SMEM_ALIGN  # a global, so numba types it as a literal


def grouped_ref(a, w, ggml_type, n_rows: int, tiles, order, x_div: int, n_out: int) -> np.ndarray:
    """float64 C (n_out, n_rows): the rows each tile covers, as the kernel computes them; raw
    expert bytes w (E * n_rows, row_bytes) dequantized as the kernels see them."""
    wd = dequant_ref(w, ggml_type).astype(np.float64)
    c = np.full((n_out, n_rows), np.nan)
    for e, r0, n in tiles:
        rows = np.arange(r0, r0 + n)
        src = order[rows] // x_div if x_div else rows
        c[rows] = np.asarray(a, np.float64)[src] @ wd[e * n_rows:(e + 1) * n_rows].T
    return c


@lru_cache(maxsize=None)
def gemm_grouped_kernel(ggml_type):
    ops = tile_ops(BM, BN, 2, 4)
    store_c, n_acc = ops.store_c, ops.n_acc
    a_chunks = BM * 4 // THREADS
    smem_words = quant_smem_words(BM)

    @cuda.jit(device=True, inline=True)
    def load_a_rows(sbase, a, a_rows, col_lo, col_hi):
        # k slots 0..15 <- columns col_lo..+16, 16..31 <- col_hi..+16 of the gathered rows (-1: zeros)
        t = cuda.threadIdx.x
        K = a.shape[1]
        for i in range(a_chunks):
            idx = t + THREADS * i
            r = idx >> 2
            q = idx & 3
            src = a_rows[r]
            col = (col_lo if q < 2 else col_hi) + 8 * (q & 1)
            ptx.cp_async_16_zfill(sbase + tile_offset(r, q), a, max(src, 0) * K + col, 16 if src >= 0 else 0)

    mainloop = quant_mainloop(ggml_type, BM, 2, 4, load_a_rows)

    # grid (ceil(N / 128), max_tiles), block 256: block (x, y) owns columns 128x.. of tile y
    # (if y < n_tiles), warps as in gemm_tc's 64 x 128 tile. Shared: the tile's A source rows
    # int32[64], then quant_mainloop's stages.
    @cuda.jit
    def _gemm_grouped_kernel(a, parts, c, tiles, n_tiles, order, x_div):
        ti = cuda.blockIdx.y
        if ti >= n_tiles[0]:
            return
        e = tiles[ti, 0]
        r0 = tiles[ti, 1]
        n = tiles[ti, 2]
        N = c.shape[1]
        n0 = cuda.blockIdx.x * BN
        # -- the tile's A rows --
        a_rows = cuda.shared.array(BM, int32)
        t = cuda.threadIdx.x
        if t < BM:
            r = r0 + t
            a_rows[t] = -1 if t >= n else (order[r] // x_div if x_div > 0 else r)
        cuda.syncthreads()
        smem = cuda.shared.array(smem_words, uint32, alignment=SMEM_ALIGN)
        acc = cuda.local.array(n_acc, float32)
        for i in range(n_acc):
            acc[i] = float32(0.0)
        mainloop(a, a_rows, parts, e * N + n0, (e + 1) * N, ptx.smem_addr(smem, 0), acc)
        # -- epilogue: rows r0 .. r0+n-1 --
        store_c(c[:r0 + n], acc, r0, n0, 0)

    return _gemm_grouped_kernel


def gemm_grouped(a, w: PackedWeight, n_rows: int, c, tiles, n_tiles, order, x_div: int, stream) -> None:
    """c (S, n_rows) float32: tile rows of a (rows, K) fp16 times their expert of w (E * n_rows, K).

    tiles (max_tiles, 3), n_tiles (1,), order (S,) int32 from moe.moe_group (tm = BM); x_div as
    in the module docstring. Rows of c that no tile covers are left as they were.
    """
    K = a.shape[1]
    assert w.cols == K and w.rows % n_rows == 0 and c.shape[1] == n_rows and n_rows % 8 == 0
    assert a.dtype == np.float16 and a.is_c_contiguous() and aligned16(a) and K % 32 == 0
    assert c.dtype == np.float32 and c.is_c_contiguous() and aligned16(c)
    assert K % GGML_QUANT_SIZES[T(w.ggml_type)][0] == 0
    launch(gemm_grouped_kernel(w.ggml_type), (-(-n_rows // BN), tiles.shape[0]), THREADS, stream,
           a, w.parts, c, tiles, n_tiles, order, np.int32(x_div))


_I32_1D = types.Array(types.int32, 1, "C")


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemm_grouped_kernel(t), types.void(F16_2D, parts_type(t), F32_2D, types.Array(types.int32, 2, "C"),
                                            _I32_1D, _I32_1D, types.int32),
         {"max_registers": 168, "ptx_contains": GEMM_PTX})
        for t in DECODERS
    ]
