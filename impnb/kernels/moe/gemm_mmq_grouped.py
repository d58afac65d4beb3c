"""The routed experts of a batch on int8 tensor cores, grouped by expert (gemm_mmq's mma steps
over moe.moe_group's tiles): y[r0 + j] = x̂[row of token j] · dequant(W_e)ᵀ for each tile (e, r0,
n) of at most 8 tokens of expert e, j < n; with a GLU (gate|up stacked per expert) act(gate) * up.

A block of 4 warps owns a tile (blockIdx.y) and a slab of the expert's output rows (blockIdx.x),
over all of K (no split: a tile's few tokens leave the grid wide enough). The tile's tokens are
the mma's n8 operand, their x̂ rows gathered: lane (g, t) loads token g's fragment (row
order[r0 + g] // x_div of the tokens' x̂, or with x_div 0 grouped row r0 + g itself) and the scales
of tokens 2t, 2t + 1; tokens n..7 repeat token n - 1 and are not written. W as gemm_mmq's m16
operand: a warp's lane rows g, g + 8 of its two m16 tiles, plain 32 rows a warp (128 a block) or,
with a GLU, tile 0 the gate rows and tile 1 the same rows of up (16 output rows a warp, 64 a
block), so each lane finishes act(gate) * up of its own rows in registers.

    x̂: quant_x32.QuantX32 of the tokens (or of the grouped rows), q (MP, K/4), ds (K/32, MP, 2).

Requirements (asserted): K a multiple of 256 (Q4_K, Q6_K) or 128 (Q8_0).
Numpy reference: gemm_mmq_grouped_ref.
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, types

from impnb.kernels.common import ptx
from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemm import gemm_mmq as mmq
from impnb.kernels.gemm.gemm_mmq_step import ROWS, make_step
from impnb.kernels.gemm.quant_x32 import XGROUP, QuantX32, dequantize_x32_ref
from impnb.kernels.gemv.gemv import parts_type
from impnb.kernels.gemv.gemv_units import GLU_ACTS, NO_GLU
from impnb.launch import launch
from impnb.quants import dequantize

MT = 2        # m16 tiles of W a warp
TOKENS = 8    # tokens a tile at most (one n8 tile)
WARPS = mmq.WARPS
THREADS = mmq.THREADS


def out_rows_per_block(glu: bool) -> int:
    """Output rows a block: 32 a warp plain, 16 (gate and up tiles of the same rows) with a GLU."""
    return 16 * MT * WARPS // (2 if glu else 1)


_KERNEL = """
def _gemm_mmq_grouped_kernel(xq, xds, parts, y, n_rows, tiles, n_tiles, order, x_div):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished (tiles, x̂)
    ptx.grid_dep_launch()
    i = cuda.blockIdx.y
    if i >= n_tiles[0]:
        return
    e = tiles[i, 0]
    base = tiles[i, 1]  # the tile's first grouped row
    n = tiles[i, 2]
    KW = xq.shape[1]
    K = 4 * KW
    MP = xq.shape[0]
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    g = lane >> 2
    t = lane & 3
    n_out = n_rows // 2 if glu else n_rows
    nb = cuda.blockIdx.x * bn + warp * warp_rows + g  # this lane's first output row of the expert
    w0 = e * n_rows
{rows}
    j = base + min(g, n - 1)
    xrow = order[j] // x_div if x_div > 0 else j
    j = base + min(2 * t, n - 1)
    d0 = order[j] // x_div if x_div > 0 else j
    j = base + min(2 * t + 1, n - 1)
    d1 = order[j] // x_div if x_div > 0 else j
    acc = cuda.local.array(n_acc, float32)
    for a in range(n_acc):
        acc[a] = float32(0.0)
{first}
    n_grp = K // GROUP
    for grp in range(n_grp):
        gn = min(grp + 1, n_grp - 1)
{next}
        step(({xs},), grp, xq, xds, acc, xrow, d0, d1, MP, KW, t)
        {xs} = {ys}
    # -- epilogue: acc[2 i + jt]: lane row i (row nb + 8 i; with a GLU rows 0, 1 gate and 2, 3 up
    # of rows nb, nb + 8), token 2t + jt --
    for jt in range(2):
        tok = 2 * t + jt
        if tok < n:
            for i in range(out_lane_rows):
                row = nb + 8 * i
                if row < n_out:
                    if glu:
                        y[base + tok, row] = act(acc[2 * i + jt]) * acc[4 + 2 * i + jt]
                    else:
                        y[base + tok, row] = acc[2 * i + jt]
"""


@lru_cache(maxsize=None)
def gemm_mmq_grouped_kernel(ggml_type, glu: int = NO_GLU):
    """The kernel of one weight type, plain or through a GLU (SILU, GELU) of gate|up stacked per
    expert."""
    lane_rows = 2 * MT
    if glu:  # lane rows: gate nb, nb + 8, then up nb, nb + 8 (n_out rows further on)
        rows = [f"    r{i} = w0 + {'n_out + ' if i >= 2 else ''}min(nb + {8 * (i & 1)}, n_out - 1)"
                for i in range(lane_rows)]
    else:
        rows = [f"    r{i} = w0 + min(nb + {8 * i}, n_out - 1)" for i in range(lane_rows)]
    src = _KERNEL.format(
        rows="\n".join(rows),
        first="\n".join(f"    x{i} = load_row(parts, r{i}, K, 0, t)" for i in range(lane_rows)),
        next="\n".join(f"        y{i} = load_row(parts, r{i}, K, gn, t)" for i in range(lane_rows)),
        xs=", ".join(f"x{i}" for i in range(lane_rows)), ys=", ".join(f"y{i}" for i in range(lane_rows)))
    scope = {"__name__": __name__, "cuda": cuda, "ptx": ptx, "float32": float32, "GROUP": mmq.GROUP,
             "load_row": ROWS[T(ggml_type)], "step": make_step(ggml_type, 1, MT, grouped=True),
             "bn": out_rows_per_block(bool(glu)), "warp_rows": out_rows_per_block(bool(glu)) // WARPS,
             "n_acc": 4 * MT, "out_lane_rows": 2 if glu else lane_rows, "glu": bool(glu), "act": GLU_ACTS[glu]}
    exec(src, scope)
    return cuda.jit(scope["_gemm_mmq_grouped_kernel"])


def supports(ggml_type, K: int) -> bool:
    return mmq.supports(ggml_type, K)


def gemm_mmq_grouped(xq: QuantX32, w: PackedWeight, n_rows: int, y, tiles, n_tiles, order, x_div: int, stream,
                     glu: int = NO_GLU) -> None:
    """y (S, N) float32: row r0 + j of tile (e, r0, n), j < n, = x̂[order[r0 + j] // x_div] (x_div
    0: x̂[r0 + j]) · dequant(W_e)ᵀ, or with glu (SILU, GELU) y (S, F) = act(gate_e x̂) * up_e x̂ for
    gate|up stacked per expert; moe.moe_group's tiles (max_tiles, 3) of at most TOKENS rows each,
    n_tiles, order. w: E experts of n_rows rows stacked (E * n_rows, K); xq (quantize_x32) of the
    tokens (x_div = k) or of the grouped rows."""
    K = w.cols
    N = n_rows // 2 if glu else n_rows
    assert supports(w.ggml_type, K), f"no int8 GEMM for {T(w.ggml_type).name} at K={K}"
    assert w.rows % n_rows == 0 and x_div >= 0 and (not glu or n_rows % 2 == 0)
    assert xq.q.shape[1] == K // 4 and xq.ds.shape == (K // XGROUP, xq.q.shape[0], 2)
    assert y.dtype == np.float32 and y.is_c_contiguous() and y.shape == (order.shape[0], N)
    for a in (tiles, n_tiles, order):
        assert a.dtype == np.int32 and a.is_c_contiguous()
    launch(gemm_mmq_grouped_kernel(T(w.ggml_type), glu), (-(-N // out_rows_per_block(bool(glu))), tiles.shape[0]),
           THREADS, stream, xq.q, xq.ds, w.parts, y, np.int32(n_rows), tiles, n_tiles, order, np.int32(x_div))


def gemm_mmq_grouped_ref(q: np.ndarray, ds: np.ndarray, raw: np.ndarray, ggml_type, n_rows: int, order: np.ndarray,
                         tiles: np.ndarray, x_div: int, glu_act=None) -> np.ndarray:
    """float64 twin over x̂ (q, ds as quantize_x32_ref gives them) and the raw expert weights
    (E * n_rows, row bytes): y (S, N), rows of no tile NaN."""
    x = dequantize_x32_ref(q, ds)
    w = dequantize(np.asarray(raw).view(np.uint8).reshape(raw.shape[0], -1), T(ggml_type)).astype(np.float64)
    N = n_rows // 2 if glu_act else n_rows
    y = np.full((order.shape[0], N), np.nan)
    for e, r0, n in tiles:
        rows = np.arange(r0, r0 + n)
        out = x[order[rows] // x_div if x_div else rows] @ w[e * n_rows:(e + 1) * n_rows].T
        y[rows] = glu_act(out[:, :N]) * out[:, N:] if glu_act else out
    return y


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    from impnb.kernels.gemv.gemv_units import SILU

    u32, f32_3d = types.Array(types.uint32, 2, "C"), types.Array(types.float32, 3, "C")
    i1, i2 = types.Array(types.int32, 1, "C"), types.Array(types.int32, 2, "C")
    return [
        (gemm_mmq_grouped_kernel(t, glu), types.void(u32, f32_3d, parts_type(t), types.Array(types.float32, 2, "C"),
                                                     types.int32, i2, i1, i1, types.int32), {"max_registers": 255})
        for t, glu in ((T.Q4_K, SILU), (T.Q4_K, NO_GLU), (T.Q6_K, NO_GLU), (T.Q8_0, SILU))
    ]
