"""float32 -> float16 conversion of activations feeding cuBLAS (round to nearest, saturating)."""

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.launch import launch

F16_MAX = np.float32(65504.0)
THREADS = 256


def cast_f16_ref(x: np.ndarray) -> np.ndarray:
    return np.clip(x, -F16_MAX, F16_MAX).astype(np.float16)


# grid: ceil(n / 256) blocks of 256 threads; one thread converts one element of the flat array.
@cuda.jit(cache=True)
def _cast_f16_kernel(x, out):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    i = cuda.grid(1)
    if i < x.size:
        out[i] = np.float16(min(max(x[i], -F16_MAX), F16_MAX))


def cast_f16(x, out, stream) -> None:
    """out (float16) = saturate(x (float32)), same shape, both C-contiguous."""
    assert x.shape == out.shape and x.dtype == np.float32 and out.dtype == np.float16
    assert x.is_c_contiguous() and out.is_c_contiguous()
    n = x.size
    if n:
        launch(_cast_f16_kernel, (n + THREADS - 1) // THREADS, THREADS, stream, x.reshape(n),
               out.reshape(n))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_cast_f16_kernel, (types.float32[::1], types.float16[::1]), {"ptx_contains": ("cvt.rn.f16.f32",)}),
    ]
