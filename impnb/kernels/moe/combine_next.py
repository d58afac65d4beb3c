"""A batch's MoE layer end in one launch: moe_combine's weighted sum of each token's routed slots
added into the residual x, then the next layer's Q|K|V input, RMSNorm(x) * wn, in gemm_mmq's
int8 form (quant_x32), in place of moe_combine's and quantize_x32's two launches; with vq also in
quant_x's groups of 16 (a V of another type on the dp4a GEMV: its quantize_x launch too).

Grid (NC, MP), block CB / 4 threads, a thread-block cluster of the NC blocks of a row (sm_90;
NC = 1: one block the row): block (z, t) owns columns z CB .. z CB + CB - 1 of token t's row
(CB = D / NC). Thread i sums its four columns in moe_combine's order (slot j = 0 .. k - 1, then
x + the sum), so x is moe_combine's bit for bit, writes them to x and to shared memory, and the
block sums their squares; the cluster's blocks read each other's sums through distributed shared
memory, each adding them in rank order (the same row scale in every block), and each block
quantizes its own columns, XGROUP a thread (with vq the second warp GROUP a thread too). So the combine keeps moe_combine's width (NC blocks a
token reading the slots from L2) where a block a token took the combine's reads onto one SM. The
row's scale sums its squares in another order than quantize_x32's rms_scale (within its last bits).
Rows t >= T (the GEMM's slab padding) write zeros, as quantize_x32's do.
Numpy reference: combine_next_ref.
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.warp import warp_sum
from impnb.kernels.elementwise.reference import rms_norm_ref
from impnb.kernels.gemm.gemm_quant_splitk import F32_3D
from impnb.kernels.gemm.quant_x32 import XGROUP, XWORDS, QuantX32, quantize_x32_ref
from impnb.kernels.gemv.quant_x import GROUP, WORDS, QuantX, make_quantize_words, quantize_x_ref, scale4, store_group
from impnb.kernels.moe.reference import combine_ref
from impnb.launch import launch

CLUSTER = 8  # blocks a row on the GPU (a portable cluster size)

_quantize_words32 = make_quantize_words(XGROUP)


def combine_next_ref(y, rows, weights, x, accumulate: bool, wn, eps: float, n_rows: int) -> tuple:
    """(x after the combine (T, D) float32, (q, ds) of RMSNorm(x) * wn as quantize_x32_ref writes
    them for n_rows rows, (q, d, s) of it as quantize_x_ref writes them)."""
    out = combine_ref(y, rows, weights).astype(np.float32)
    if accumulate:
        out = (np.asarray(x, np.float32) + out).astype(np.float32)
    normed = rms_norm_ref(out, wn, eps)
    return out, quantize_x32_ref(normed, n_rows), quantize_x_ref(normed)


def shape_of(D: int, nc: int) -> int:
    """Threads a block for rows of D columns in nc blocks (four columns a thread, whole warps)."""
    assert D % (nc * 4 * 32) == 0 and D // nc % XGROUP == 0
    return D // nc // 4


@lru_cache(maxsize=None)
def combine_next_kernel(D: int, k: int, nc: int, vq: bool = False, early: bool = False):
    """The kernel for rows of D columns, k slots a token and nc blocks a row (the cluster's); vq:
    quant_x's groups too; early: rows, weights and x read before griddepcontrol.wait."""
    NT = shape_of(D, nc)
    CB = D // nc  # a block's columns
    NW = NT // 32
    GB = CB // XGROUP  # a block's groups of XGROUP
    GV = CB // GROUP  # a block's groups of GROUP
    VT = 32 if NT >= 32 + GV else 0  # the thread of the first: the second warp's where it has room
    assert GB <= NT and GV <= NT

    @cuda.jit
    def _combine_next_kernel(y, rows, weights, x, accumulate, wn, eps, q, ds, vq_q, vq_d, vq_s):
        if not early:
            ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished (y)
            ptx.grid_dep_launch()
        z = cuda.blockIdx.x
        t = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        live = t < x.shape[0]
        seg = cuda.shared.array(CB, float32)
        red = cuda.shared.array(NW, float32)
        bsq = cuda.shared.array(1, float32)
        # -- the combine: columns c .. c + 3 of x[t] (+)= sum_j weights[t, j] y[rows[t k + j]] --
        c = z * CB + 4 * tid
        a0 = float32(0.0)
        a1 = float32(0.0)
        a2 = float32(0.0)
        a3 = float32(0.0)
        ws = cuda.local.array(k, float32)
        rs = cuda.local.array(k, int32)
        x0 = x1 = x2 = x3 = float32(0.0)
        if live:  # (early: the router's slots and weights, and x, before the wait; only y is the previous kernel's)
            for j in range(k):
                ws[j] = weights[t, j]
                rs[j] = rows[t * k + j]
            if accumulate:
                x0, x1, x2, x3 = qi.ldg_f32x4(x, t * D + c)
        if early:
            ptx.grid_dep_wait()  # the previous kernel has finished (y)
            ptx.grid_dep_launch()
        if live:
            for j in range(k):
                w = ws[j]
                y0, y1, y2, y3 = qi.ldg_f32x4(y, rs[j] * D + c)
                a0 += w * y0
                a1 += w * y1
                a2 += w * y2
                a3 += w * y3
            if accumulate:
                a0 = x0 + a0
                a1 = x1 + a1
                a2 = x2 + a2
                a3 = x3 + a3
            qi.stg_x4(x, t * D + c, a0, a1, a2, a3)
        seg[4 * tid] = a0
        seg[4 * tid + 1] = a1
        seg[4 * tid + 2] = a2
        seg[4 * tid + 3] = a3
        # -- the block's sum of squares, then the row's: the cluster's blocks' in rank order --
        s = warp_sum((a0 * a0 + a1 * a1) + (a2 * a2 + a3 * a3))
        if tid % 32 == 0:
            red[tid // 32] = s
        cuda.syncthreads()
        if tid == 0:
            s = float32(0.0)
            for i in range(NW):
                s += red[i]
            bsq[0] = s
        if nc > 1:
            ptx.cluster_sync()  # every block's sum written (release), then readable (acquire)
        else:
            cuda.syncthreads()
        total = float32(0.0)
        for r in range(nc):
            total += ptx.ld_cluster_f32(ptx.smem_addr(bsq, 0), r) if nc > 1 else bsq[0]
        rms = float32(1.0) / math.sqrt(total / float32(D) + eps)
        # -- the block's groups of RMSNorm(x[t]) * wn in int8, a thread a group --
        if tid < GB:
            v = cuda.local.array(XGROUP, float32)
            words = cuda.local.array(XWORDS, uint32)
            grp = z * GB + tid
            for j in range(XWORDS):
                o = XGROUP * tid + 4 * j
                v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3] = seg[o], seg[o + 1], seg[o + 2], seg[o + 3]
                if live:
                    scale4(v, j, rms, wn, XGROUP * grp + 4 * j)
            scale, tot = _quantize_words32(v, words)
            base = t * (D // 4) + XWORDS * grp
            qi.stg_x4(q, base, words[0], words[1], words[2], words[3])
            qi.stg_x4(q, base + 4, words[4], words[5], words[6], words[7])
            ds[grp, t, 0] = scale
            ds[grp, t, 1] = tot
        # -- with vq: the block's groups of GROUP in quant_x's form, a thread a group (rows < T) --
        if vq and live and VT <= tid and tid < VT + GV:
            v16 = cuda.local.array(GROUP, float32)
            i = tid - VT
            g = z * GV + i
            for j in range(WORDS):
                o = GROUP * i + 4 * j
                v16[4 * j], v16[4 * j + 1], v16[4 * j + 2], v16[4 * j + 3] = seg[o], seg[o + 1], seg[o + 2], seg[o + 3]
                scale4(v16, j, rms, wn, GROUP * g + 4 * j)
            store_group(v16, vq_q, vq_d, vq_s, t, g)
        if nc > 1:
            ptx.cluster_sync()  # no block leaves while another may still read its sum

    return _combine_next_kernel


def moe_combine_next(y, rows, weights, x, stream, accumulate: bool, norm: tuple, out: QuantX32,
                     nc: int | None = None, vq: QuantX | None = None, early: bool = False) -> None:
    """moe_combine(y, rows, weights, x, stream, accumulate), then out = quantize_x32 of
    RMSNorm(x) * wn, norm = (wn, eps), for all of out's rows (past x's zero), and with vq the
    same rows as quantize_x writes them for x's rows, in one launch; nc: blocks a row (CLUSTER on
    the GPU, 1 in the simulator, which has no clusters). early: only y is the previous kernel's
    output, and that kernel waits for its own inputs before it lets this one launch (programmatic
    launch): rows, weights and x are read before the wait."""
    T, D = x.shape
    MP = out.q.shape[0]
    wn, eps = norm
    nc = nc or (1 if qi.SIM else CLUSTER)
    assert weights.shape[0] == T and rows.shape[0] >= T * weights.shape[1] and y.shape[1] == D and MP >= T
    assert x.dtype == np.float32 and x.is_c_contiguous() and wn.dtype == np.float32 and wn.shape == (D,)
    assert out.q.shape == (MP, D // 4) and out.ds.shape == (D // XGROUP, MP, 2)
    if vq is not None:
        assert vq.q.shape == (T, D // 4) and vq.d.shape == vq.s.shape == (T, D // GROUP)
    vq_q, vq_d, vq_s = vq or (out.q, x, x)  # without vq: not written, any of the right types
    launch(combine_next_kernel(D, weights.shape[1], nc, vq is not None, early), (nc, MP), shape_of(D, nc), stream, y, rows,
           weights, x, np.int32(accumulate), wn, np.float32(eps), out.q, out.ds, vq_q, vq_d, vq_s,
           cluster=(nc, 1, 1) if nc > 1 else None)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    f2, f1 = types.Array(types.float32, 2, "C"), types.Array(types.float32, 1, "C")
    u2 = types.Array(types.uint32, 2, "C")
    sig = types.void(f2, types.Array(types.int32, 1, "C"), f2, f2, types.int32, f1, types.float32, u2, F32_3D,
                     u2, f2, f2)
    return [(combine_next_kernel(2048, 8, nc, vq, early), sig,
             {"max_registers": 64, "ptx_contains": ("barrier.cluster.arrive", "mapa.shared::cluster") if nc > 1 else ()})
            for nc, vq, early in ((1, False, False), (1, True, False), (CLUSTER, False, False), (CLUSTER, True, True))]
