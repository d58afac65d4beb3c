"""Gated FFN activations: numpy references and CUDA kernels for SwiGLU and GeGLU (tanh GELU)."""

import math

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.elementwise.cast import F16_MAX
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


def _make_glu_kernels(act, name: str, half: bool = False):
    # half: out is float16, the product saturated to +-F16_MAX as cast_f16 does (the A operand of
    # the GEMM that follows, without a cast launch between)
    @cuda.jit(device=True, inline=True)
    def store_f16(out, t, i, v):
        out[t, i] = np.float16(min(max(v, -F16_MAX), F16_MAX))

    @cuda.jit(device=True, inline=True)
    def store_f32(out, t, i, v):
        out[t, i] = v

    store = store_f16 if half else store_f32

    # grid (ceil(F / 256), T), block 256: thread owns column i of row t. No shared memory.
    def glu(gate, up, out):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.y
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < out.shape[1]:
            store(out, t, i, act(gate[t, i]) * up[t, i])

    # grid (ceil(F / 256), T), block 256: gate|up fused (T, 2F): gate gu[t, i], up gu[t, F + i].
    def glu_fused(gu, out):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        t = cuda.blockIdx.y
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        F = out.shape[1]
        if i < F:
            store(out, t, i, act(gu[t, i]) * gu[t, F + i])

    suffix = "_f16" if half else ""
    glu.__name__, glu_fused.__name__ = f"_{name}{suffix}_kernel", f"_{name}_fused{suffix}_kernel"
    return cuda.jit(glu), cuda.jit(glu_fused)


_swiglu_kernel, _swiglu_fused_kernel = _make_glu_kernels(silu_dev, "swiglu")
_geglu_kernel, _geglu_fused_kernel = _make_glu_kernels(gelu_tanh_dev, "geglu")
_KERNELS_F16 = {k: _make_glu_kernels(act, name, half=True)
                for k, act, name in (("silu", silu_dev, "swiglu"), ("gelu", gelu_tanh_dev, "geglu"))}
_THREADS = 256


def _mat(a, name: str):
    assert a.dtype == np.float32 and a.ndim == 2 and a.is_c_contiguous(), \
        f"{name}: C-contiguous float32 (T, F) expected, got {a.dtype} {a.shape}"
    return a


def _launch(kernel, out, *args, stream):
    assert out.ndim == 2 and out.is_c_contiguous() and out.dtype in (np.float32, np.float16), \
        f"out: C-contiguous float32 or float16 (T, F) expected, got {out.dtype} {out.shape}"
    T, F = out.shape
    if T and F:
        launch(kernel, ((F + _THREADS - 1) // _THREADS, T), _THREADS, stream, *args, out)


def _pick(kernel, act: str, fused: bool, out):
    """kernel for a float32 out, its saturating twin for a float16 one."""
    return _KERNELS_F16[act][fused] if out.dtype == np.float16 else kernel


def swiglu(gate, up, out, stream) -> None:
    """out = silu(gate) * up; gate, up (T, F) float32, out float32 (may be gate or up) or float16
    (saturated to +-65504, as cast_f16)."""
    assert _mat(gate, "gate").shape == _mat(up, "up").shape == out.shape, "shapes differ"
    _launch(_pick(_swiglu_kernel, "silu", False, out), out, gate, up, stream=stream)


def geglu(gate, up, out, stream) -> None:
    """out = gelu_tanh(gate) * up; gate, up (T, F) float32, out float32 (may be gate or up) or float16."""
    assert _mat(gate, "gate").shape == _mat(up, "up").shape == out.shape, "shapes differ"
    _launch(_pick(_geglu_kernel, "gelu", False, out), out, gate, up, stream=stream)


def swiglu_fused(gate_up, out, stream) -> None:
    """out (T, F) = silu(gate_up[:, :F]) * gate_up[:, F:]; gate_up (T, 2F) float32 from one GEMM;
    out float32 or float16."""
    assert _mat(gate_up, "gate_up").shape == (out.shape[0], 2 * out.shape[1]), "gate_up is not (T, 2F)"
    _launch(_pick(_swiglu_fused_kernel, "silu", True, out), out, gate_up, stream=stream)


def geglu_fused(gate_up, out, stream) -> None:
    """out (T, F) = gelu_tanh(gate_up[:, :F]) * gate_up[:, F:]; gate_up (T, 2F) float32; out
    float32 or float16."""
    assert _mat(gate_up, "gate_up").shape == (out.shape[0], 2 * out.shape[1]), "gate_up is not (T, 2F)"
    _launch(_pick(_geglu_fused_kernel, "gelu", True, out), out, gate_up, stream=stream)


_M = types.float32[:, ::1]
_H = types.float16[:, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_swiglu_kernel, (_M, _M, _M), {"max_registers": 32}),
        (_geglu_kernel, (_M, _M, _M), {"max_registers": 32}),
        (_swiglu_fused_kernel, (_M, _M), {"max_registers": 32}),
        (_geglu_fused_kernel, (_M, _M), {"max_registers": 32}),
    ] + [
        (kernel, sig, {"max_registers": 32, "ptx_contains": ("cvt.rn.f16.f32",)})
        for plain, fused in _KERNELS_F16.values()
        for kernel, sig in ((plain, (_M, _M, _H)), (fused, (_M, _H)))
    ]
