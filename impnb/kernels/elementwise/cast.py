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


@cuda.jit(device=True, inline=True)
def perm_pos(k):
    """Where column k (k % 4 == 0) goes in gemm_wgmma_rs's A order (perm_columns' inverse within
    each 64-column step): its four columns to this position, + 1, + 8 and + 9."""
    c = k & 63
    return (k - c) + 16 * (2 * (c >> 5) + ((c >> 2) & 1)) + 2 * ((c >> 3) & 3)


def _make_cast_rows(normed: bool, perm: bool):
    # grid (ceil(K / (4 x 128)), T), block 128: thread i of block (bx, t) converts columns 4 j ..
    # 4 j + 3 of row t (j = 128 bx + i) of x, or of RMSNorm(x[t]) * wn (normed: the row's scale
    # summed by each block, x is in L2); perm: the four written at perm_pos's places
    o2 = 8 if perm else 2  # where the third and fourth columns go, after the first two

    @cuda.jit
    def kernel(x, wn, eps, out):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.y
        K = x.shape[1]
        rms = rms_scale(x, t, wn, eps) if normed else np.float32(1.0)
        k = 4 * (cuda.blockIdx.x * NORM_THREADS + cuda.threadIdx.x)
        if k >= K:
            return
        v0, v1, v2, v3 = qi.ldg_f32x4(x, t * K + k)
        if normed:
            w0, w1, w2, w3 = qi.ldg_f32x4(wn, k)
            v0, v1, v2, v3 = v0 * rms * w0, v1 * rms * w1, v2 * rms * w2, v3 * rms * w3
        q = perm_pos(k) if perm else k
        out[t, q] = sat_f16(v0)
        out[t, q + 1] = sat_f16(v1)
        out[t, q + o2] = sat_f16(v2)
        out[t, q + o2 + 1] = sat_f16(v3)

    kernel.__name__ = f"_cast_f16{'_norm' if normed else ''}{'_perm' if perm else ''}_kernel"
    return kernel


_cast_f16_norm_kernel = _make_cast_rows(True, False)
_cast_f16_perm_kernel = _make_cast_rows(False, True)
_cast_f16_norm_perm_kernel = _make_cast_rows(True, True)


def cast_f16(x, out, stream, norm: tuple | None = None, perm: bool = False) -> None:
    """out (float16) = saturate(x (float32)), same shape, both C-contiguous; norm (wn (K,) float32,
    eps), x (T, K) with K a multiple of 4: of RMSNorm(x) * wn instead; perm (K a multiple of 64):
    each 64-column step's columns in gemm_wgmma_rs's order (out[:, perm_columns] of the plain
    cast's)."""
    assert x.shape == out.shape and x.dtype == np.float32 and out.dtype == np.float16
    assert x.is_c_contiguous() and out.is_c_contiguous()
    if norm is not None or perm:
        T, K = x.shape
        wn, eps = norm if norm is not None else (x[0], 0.0)  # x[0]: unread
        assert K % (64 if perm else 4) == 0 and wn.dtype == np.float32 and wn.shape == (K,)
        kernel = {(True, False): _cast_f16_norm_kernel, (False, True): _cast_f16_perm_kernel,
                  (True, True): _cast_f16_norm_perm_kernel}[norm is not None, perm]
        if T:
            launch(kernel, (-(-K // (4 * NORM_THREADS)), T), NORM_THREADS, stream, x, wn, np.float32(eps), out)
        return
    n = x.size
    if n:
        launch(_cast_f16_kernel, (n + THREADS - 1) // THREADS, THREADS, stream, x.reshape(n),
               out.reshape(n))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(_cast_f16_kernel, (types.float32[::1], types.float16[::1]), {"ptx_contains": ("cvt.rn.f16.f32",)})] + [
        (k, (types.float32[:, ::1], types.float32[::1], types.float32, types.float16[:, ::1]),
         {"ptx_contains": ("cvt.rn.f16.f32",), "max_registers": 64})
        for k in (_cast_f16_norm_kernel, _cast_f16_perm_kernel, _cast_f16_norm_perm_kernel)]
