"""RMSNorm: numpy reference (the GPU kernel joins it here)."""

import numpy as np


def rms_norm_ref(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (..., D) float32, weight (D,) -> x / rms(x) * weight over the last axis.

    Gemma's (1 + w) form needs no flag: llama.cpp's converter stores 1 + w in the GGUF.
    """
    x = x.astype(np.float32, copy=False)
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    return x / np.sqrt(ms + np.float32(eps)) * weight
