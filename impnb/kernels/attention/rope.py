"""Rotary position embedding: numpy reference and the in-place CUDA kernel, normal and NeoX layouts."""

import math

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.attention.reference import rope_freqs, rope_ref  # noqa: F401
from impnb.kernels.common.warp import SIMULATOR
from impnb.launch import launch


# ---------------------------------------------------------------- CUDA kernel

def rope_inv_freq(n_rot: int, base: float, factors: np.ndarray | None = None) -> np.ndarray:
    """(2, n_rot/2) float32 built once at load: rope_freqs as hi (its float32 rounding) + lo (the rest).

    The kernel forms angle = pos * (hi + lo) as a float32 pair (a + e), exact to ~1e-7 rad at
    pos 32768 where a plain float32 product would be off by up to ~2e-3 rad. factors (n_rot/2,)
    divide the frequencies as rope_ref's freq_factors (gemma4's `rope_freqs`: 1e30 holds a pair
    still).
    """
    f = rope_freqs(n_rot, base)
    if factors is not None:
        f = f / np.asarray(factors, np.float64)
    hi = f.astype(np.float32)
    lo = (f - hi.astype(np.float64)).astype(np.float32)
    return np.ascontiguousarray(np.stack([hi, lo]))


if SIMULATOR:
    def _fma(a, b, c):  # the simulator's fma rounds a * b first; a float32 product is exact in float64
        return np.float32(float(a) * float(b) + float(c))
else:
    @cuda.jit(device=True, inline=True)
    def _fma(a, b, c):
        return cuda.fma(a, b, c)


@cuda.jit(device=True, inline=True)
def _rotate(x, t, head, i0, i1, cs, sn):
    a = x[t, head, i0]
    b = x[t, head, i1]
    x[t, head, i0] = a * cs - b * sn
    x[t, head, i1] = b * cs + a * sn


@cuda.jit(device=True, inline=True)
def rotate_row_pair(x, r, i, half, neox, cs, sn):
    """Pair i of row r of x (2-D: NeoX (i, i + half), else adjacent (2 i, 2 i + 1)) rotated in place
    by the angle of cosine cs and sine sn (qkv_post's and the fused kernels' staged rows)."""
    i0 = i if neox else 2 * i
    i1 = i + half if neox else 2 * i + 1
    a = x[r, i0]
    b = x[r, i1]
    x[r, i0] = a * cs - b * sn
    x[r, i1] = b * cs + a * sn


# grid (N, ceil((H + Hkv) * n_rot/2 / 128)), block 128: thread owns one rotating pair j of one head
# of token t (heads 0..H-1 of q, then 0..Hkv-1 of k). In place; no shared memory.
# Angle: a = fl(p * hi), e = (p * hi - a) + p * lo (fma, exact), then cos/sin(a + e) from
# cos/sin(a) by the second-order expansion in e (|e| < 4e-3 for positions below 2^17).
# libdevice's sin / cos keep a 7-word table on the stack for the argument reduction of large
# angles (the slow path): the stack frame kernels that call cos_sin are allowed
SIN_COS_STACK = 32


@cuda.jit(device=True, inline=True)
def cos_sin(pos, inv_freq, j):
    """cos, sin of the angle pos * inv_freq[:, j] (hi + lo pair), float32."""
    p = np.float32(pos)
    f_hi = inv_freq[0, j]
    a = p * f_hi
    e = _fma(p, f_hi, -a) + p * inv_freq[1, j]
    s = math.sin(a)
    c = math.cos(a)
    ce = np.float32(1) - np.float32(0.5) * e * e
    return c * ce - s * e, s * ce + c * e


@cuda.jit
def _rope_kernel(q, k, pos, inv_freq, neox):
    t = cuda.blockIdx.x
    half = inv_freq.shape[1]
    i = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    H = q.shape[1]
    head = i // half
    j = i - head * half
    if head >= H + k.shape[1]:
        return
    cs, sn = cos_sin(pos[t], inv_freq, j)
    if neox:
        i0 = j
        i1 = j + half
    else:
        i0 = 2 * j
        i1 = 2 * j + 1
    if head < H:
        _rotate(q, t, head, i0, i1, cs, sn)
    else:
        _rotate(k, t, head - H, i0, i1, cs, sn)


def _heads(a, name: str):
    assert a.dtype == np.float32 and a.is_c_contiguous(), f"{name}: C-contiguous float32 expected"
    assert a.ndim in (3, 4), f"{name}: (T, H, D) or (B, T, H, D) expected, got {a.shape}"
    return a.reshape(a.shape[0] * a.shape[1], a.shape[2], a.shape[3]) if a.ndim == 4 else a


def rope(q, k, pos, inv_freq, neox: bool, stream) -> None:
    """Rotate q (T, H, D) and k (T, Hkv, D) float32 in place at positions pos (T,) int32.

    inv_freq: rope_inv_freq(n_rot, base) on the device (one per base: Gemma has two); the first
    n_rot = 2 * inv_freq.shape[1] dims of each head rotate. (B, T, ...) inputs with pos (B, T) work too.
    """
    q3, k3 = _heads(q, "q"), _heads(k, "k")
    T, H, D = q3.shape
    half = inv_freq.shape[1]
    assert k3.shape[0] == T and k3.shape[2] == D, f"k {k.shape} does not match q {q.shape}"
    assert pos.dtype == np.int32 and pos.size == T and pos.is_c_contiguous(), "pos: int32 (T,)"
    assert inv_freq.dtype == np.float32 and inv_freq.shape == (2, half) and 2 * half <= D, "inv_freq"
    pairs = (H + k3.shape[1]) * half
    if T:
        launch(_rope_kernel, (T, (pairs + 127) // 128), 128, stream, q3, k3, pos.reshape(T),
               inv_freq, np.int32(bool(neox)))


_HEADS = types.float32[:, :, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_rope_kernel, (_HEADS, _HEADS, types.int32[::1], types.float32[:, ::1], types.int32),
         {"max_registers": 40, "ptx_contains": ("fma.rn.f32",), "stack_bytes": SIN_COS_STACK}),
    ]
