"""float32 -> float16 conversion of activations feeding a GEMM on fp16 (round to nearest,
saturating), or of RMSNorm(x) * w (the layer's pre-norm fused: cast_f16's norm)."""

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.gemv.quant_x import THREADS as NORM_THREADS, rms_scale
from impnb.launch import launch

F16_MAX = np.float32(65504.0)
THREADS = 256


def cast_f16_ref(x: np.ndarray, norm: tuple | None = None) -> np.ndarray:
    """cast_f16's output; norm (wn, eps): of RMSNorm(x) * wn, in float64 (the kernel rounds within
    an fp16 unit of it)."""
    if norm is not None:
        wn, eps = norm
        x = np.asarray(x, np.float64)
        x = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * np.asarray(wn, np.float64)
    return np.clip(x, -F16_MAX, F16_MAX).astype(np.float16)


# grid: ceil(n / 256) blocks of 256 threads; one thread converts one element of the flat array.
@cuda.jit(cache=True)
def _cast_f16_kernel(x, out):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    i = cuda.grid(1)
    if i < x.size:
        out[i] = np.float16(min(max(x[i], -F16_MAX), F16_MAX))


@cuda.jit(device=True, inline=True)
def sat_f16(v):
    """v rounded to fp16, saturated to +-F16_MAX (cast_f16's conversion of one value)."""
    return np.float16(min(max(v, -F16_MAX), F16_MAX))


# grid (ceil(K / (4 x 128)), T), block 128: thread i of block (bx, t) converts columns 4 j .. 4 j + 3
# of row t (j = 128 bx + i) of RMSNorm(x[t]) * wn, the row's scale summed by each block (x is in L2).
@cuda.jit
def _cast_f16_norm_kernel(x, wn, eps, out):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    t = cuda.blockIdx.y
    K = x.shape[1]
    rms = rms_scale(x, t, wn, eps)
    k = 4 * (cuda.blockIdx.x * NORM_THREADS + cuda.threadIdx.x)
    if k >= K:
        return
    v0, v1, v2, v3 = qi.ldg_f32x4(x, t * K + k)
    w0, w1, w2, w3 = qi.ldg_f32x4(wn, k)
    out[t, k] = sat_f16(v0 * rms * w0)
    out[t, k + 1] = sat_f16(v1 * rms * w1)
    out[t, k + 2] = sat_f16(v2 * rms * w2)
    out[t, k + 3] = sat_f16(v3 * rms * w3)


def cast_f16(x, out, stream, norm: tuple | None = None) -> None:
    """out (float16) = saturate(x (float32)), same shape, both C-contiguous; norm (wn (K,) float32,
    eps), x (T, K) with K a multiple of 4: of RMSNorm(x) * wn instead."""
    assert x.shape == out.shape and x.dtype == np.float32 and out.dtype == np.float16
    assert x.is_c_contiguous() and out.is_c_contiguous()
    if norm is not None:
        wn, eps = norm
        T, K = x.shape
        assert K % 4 == 0 and wn.dtype == np.float32 and wn.shape == (K,)
        if T:
            launch(_cast_f16_norm_kernel, (-(-K // (4 * NORM_THREADS)), T), NORM_THREADS, stream, x, wn,
                   np.float32(eps), out)
        return
    n = x.size
    if n:
        launch(_cast_f16_kernel, (n + THREADS - 1) // THREADS, THREADS, stream, x.reshape(n),
               out.reshape(n))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_cast_f16_kernel, (types.float32[::1], types.float16[::1]), {"ptx_contains": ("cvt.rn.f16.f32",)}),
        (_cast_f16_norm_kernel, (types.float32[:, ::1], types.float32[::1], types.float32, types.float16[:, ::1]),
         {"ptx_contains": ("cvt.rn.f16.f32",), "max_registers": 64}),
    ]
