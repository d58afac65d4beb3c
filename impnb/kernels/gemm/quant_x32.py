"""Activations in int8 for the int8 GEMMs (gemm_mmq, the routed experts' gemm_mmq_grouped,
reduce_glu's int8 output): x̂ in groups of XGROUP columns, each with its scale d = amax / 127 and
s = d · Σ q (the Q4_K min's term), of x or of RMSNorm(x) · wn with the row's scale summed by the
block.

    QuantX32: q (MP, K/4) uint32, 4 int8 a word in column order; ds (K/32, MP, 2) float32: each
    group's (d, s); MP >= the tokens (rounded up to the reading kernel's slab), rows past M zero.

Numpy references: quantize_x32_ref, dequantize_x32_ref.
"""

from typing import NamedTuple

import numpy as np
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemm.gemm_quant_splitk import F32_3D
from impnb.kernels.gemv.quant_x import make_quantize_words, quantize_groups_ref, rms_scale, scale4
from impnb.launch import launch

XGROUP = 32                 # x̂ columns a scale
XWORDS = XGROUP // 4        # int8 words a group
QUANT_THREADS = 128


class QuantX32(NamedTuple):
    q: object   # (MP, K/4) uint32
    ds: object  # (K/32, MP, 2) float32


def quantize_x32_ref(x: np.ndarray, rows: int | None = None) -> tuple:
    """x (M, K) float32 -> (q (MP, K/4) uint32, ds (K/32, MP, 2) float32) as quantize_x32 writes
    them, MP = rows (default M), rows past M zero."""
    x = np.asarray(x, np.float32)
    M, K = x.shape
    padded = np.zeros((M if rows is None else rows, K), np.float32)
    padded[:M] = x
    words, d, s = quantize_groups_ref(padded, XGROUP)
    return words, np.ascontiguousarray(np.stack([d, s], axis=2).transpose(1, 0, 2))


def dequantize_x32_ref(q: np.ndarray, ds: np.ndarray) -> np.ndarray:
    """The values the kernel multiplies: q · d, (MP, K) float64."""
    MP = q.shape[0]
    vals = q.view(np.int8).reshape(MP, -1, XGROUP).astype(np.float64)
    return (vals * ds[:, :, 0].T.astype(np.float64)[:, :, None]).reshape(MP, -1)


_quantize_words32 = make_quantize_words(XGROUP)


def _make_quantize_x32(normed):
    # grid (ceil(K/32 / 128), MP), block 128: a thread a group of 32 columns of token blockIdx.y
    # (normed: of RMSNorm(x[t]) * wn, the row's scale summed by the block)
    @cuda.jit
    def _quantize_x32_kernel(x, wn, eps, q, ds):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.y
        grp = cuda.blockIdx.x * QUANT_THREADS + cuda.threadIdx.x
        K = q.shape[1] * 4
        live = t < x.shape[0]
        rms = rms_scale(x, t, wn, eps) if normed and live else float32(1.0)
        if grp >= K // XGROUP:
            return
        v = cuda.local.array(XGROUP, float32)
        if live:
            for j in range(XGROUP // 4):
                k = XGROUP * grp + 4 * j
                v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3] = qi.ldg_f32x4(x, t * K + k)
                if normed:
                    scale4(v, j, rms, wn, k)
        else:
            for j in range(XGROUP):
                v[j] = float32(0.0)
        words = cuda.local.array(XWORDS, uint32)
        scale, total = _quantize_words32(v, words)
        base = t * (K // 4) + 8 * grp
        qi.stg_x4(q, base, words[0], words[1], words[2], words[3])
        qi.stg_x4(q, base + 4, words[4], words[5], words[6], words[7])
        ds[grp, t, 0] = scale
        ds[grp, t, 1] = total

    return _quantize_x32_kernel


_quantize_x32_kernel = _make_quantize_x32(False)
_quantize_x32_norm_kernel = _make_quantize_x32(True)


def quant_x32_buffers(rows: int, K: int) -> QuantX32:
    """Device buffers for the int8 form of up to `rows` tokens (a multiple of the slab, slab_rows)."""
    return QuantX32(cuda.device_array((rows, K // 4), np.uint32),
                    cuda.device_array((K // XGROUP, rows, 2), np.float32))


def quantize_x32(x, out: QuantX32, stream, norm: tuple | None = None) -> None:
    """out = the int8 form of x (M, K) float32, or with norm (wn (K,) float32, eps) of
    RMSNorm(x) * wn; K a multiple of 32, out's rows past M zero."""
    M, K = x.shape
    MP = out.q.shape[0]
    assert x.dtype == np.float32 and x.is_c_contiguous() and K % XGROUP == 0 and MP >= M
    assert out.q.shape == (MP, K // 4) and out.ds.shape == (K // XGROUP, MP, 2)
    grid = (-(-(K // XGROUP) // QUANT_THREADS), MP)
    if norm is None:
        launch(_quantize_x32_kernel, grid, QUANT_THREADS, stream, x, x[0], np.float32(0), out.q, out.ds)
        return
    wn, eps = norm
    assert wn.dtype == np.float32 and wn.shape == (K,)
    launch(_quantize_x32_norm_kernel, grid, QUANT_THREADS, stream, x, wn, np.float32(eps), out.q, out.ds)


F32_2D = types.Array(types.float32, 2, "C")
U32_2D = types.Array(types.uint32, 2, "C")


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    qsig = types.void(F32_2D, types.Array(types.float32, 1, "C"), types.float32, U32_2D, F32_3D)
    return [(_quantize_x32_kernel, qsig, {"max_registers": 64}), (_quantize_x32_norm_kernel, qsig, {"max_registers": 64})]
