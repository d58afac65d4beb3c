"""Gated FFN activations: numpy references for SwiGLU and GeGLU (tanh GELU)."""

import numpy as np


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
