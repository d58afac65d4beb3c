"""numpy references of the per-token kernels the CPU path runs (RMSNorm, SwiGLU, GeGLU), kept free of
numba so that the CPU path never imports it; the kernel files import them from here."""

import numpy as np


def rms_norm_ref(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (..., D) float32, weight (D,) -> x / rms(x) * weight over the last axis.

    Gemma's (1 + w) form needs no flag: llama.cpp's converter stores 1 + w in the GGUF.
    """
    x = x.astype(np.float32, copy=False)
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    return x / np.sqrt(ms + np.float32(eps)) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + 0.044715 * x * x * x)))


def swiglu_ref(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, float32."""
    return (silu(gate.astype(np.float32)) * up).astype(np.float32)


def geglu_ref(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up, float32."""
    return (gelu_tanh(gate.astype(np.float32)) * up).astype(np.float32)
