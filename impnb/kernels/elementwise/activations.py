"""Gated FFN activations: numpy references and CUDA kernels for SwiGLU and GeGLU (tanh GELU)."""

import math

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.elementwise.reference import gelu_tanh, geglu_ref, silu, swiglu_ref  # noqa: F401
from impnb.launch import launch


# ---------------------------------------------------------------- CUDA kernels

_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_GELU_C = np.float32(0.7978845608028654)
_GELU_A = np.float32(0.044715)


@cuda.jit(device=True, inline=True)
def silu_dev(x):
    return x / (_ONE + math.exp(-x))


@cuda.jit(device=True, inline=True)
def gelu_tanh_dev(x):
    return _HALF * x * (_ONE + math.tanh(_GELU_C * (x + _GELU_A * x * x * x)))


def _make_glu_kernels(act, name: str):
    # grid (ceil(F / 256), T), block 256: thread owns column i of row t. No shared memory.
    def glu(gate, up, out):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.y
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < out.shape[1]:
            out[t, i] = act(gate[t, i]) * up[t, i]

    # grid (ceil(F / 256), T), block 256: gate|up fused (T, 2F): gate gu[t, i], up gu[t, F + i].
    def glu_fused(gu, out):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.y
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        F = out.shape[1]
        if i < F:
            out[t, i] = act(gu[t, i]) * gu[t, F + i]

    glu.__name__, glu_fused.__name__ = f"_{name}_kernel", f"_{name}_fused_kernel"
    return cuda.jit(glu), cuda.jit(glu_fused)


_swiglu_kernel, _swiglu_fused_kernel = _make_glu_kernels(silu_dev, "swiglu")
_geglu_kernel, _geglu_fused_kernel = _make_glu_kernels(gelu_tanh_dev, "geglu")
_THREADS = 256


def _mat(a, name: str):
    assert a.dtype == np.float32 and a.ndim == 2 and a.is_c_contiguous(), \
        f"{name}: C-contiguous float32 (T, F) expected, got {a.dtype} {a.shape}"
    return a


def _launch(kernel, out, *args, stream):
    T, F = _mat(out, "out").shape
    if T and F:
        launch(kernel, ((F + _THREADS - 1) // _THREADS, T), _THREADS, stream, *args, out)


def swiglu(gate, up, out, stream) -> None:
    """out = silu(gate) * up; gate, up, out (T, F) float32 (out may be gate or up)."""
    assert _mat(gate, "gate").shape == _mat(up, "up").shape == out.shape, "shapes differ"
    _launch(_swiglu_kernel, out, gate, up, stream=stream)


def geglu(gate, up, out, stream) -> None:
    """out = gelu_tanh(gate) * up; gate, up, out (T, F) float32 (out may be gate or up)."""
    assert _mat(gate, "gate").shape == _mat(up, "up").shape == out.shape, "shapes differ"
    _launch(_geglu_kernel, out, gate, up, stream=stream)


def swiglu_fused(gate_up, out, stream) -> None:
    """out (T, F) = silu(gate_up[:, :F]) * gate_up[:, F:]; gate_up (T, 2F) float32 from one GEMM."""
    assert _mat(gate_up, "gate_up").shape == (out.shape[0], 2 * out.shape[1]), "gate_up is not (T, 2F)"
    _launch(_swiglu_fused_kernel, out, gate_up, stream=stream)


def geglu_fused(gate_up, out, stream) -> None:
    """out (T, F) = gelu_tanh(gate_up[:, :F]) * gate_up[:, F:]; gate_up (T, 2F) float32."""
    assert _mat(gate_up, "gate_up").shape == (out.shape[0], 2 * out.shape[1]), "gate_up is not (T, 2F)"
    _launch(_geglu_fused_kernel, out, gate_up, stream=stream)


_M = types.float32[:, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_swiglu_kernel, (_M, _M, _M), {"max_registers": 32}),
        (_geglu_kernel, (_M, _M, _M), {"max_registers": 32}),
        (_swiglu_fused_kernel, (_M, _M), {"max_registers": 32}),
        (_geglu_fused_kernel, (_M, _M), {"max_registers": 32}),
    ]
