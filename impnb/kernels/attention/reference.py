"""numpy reference of rotary position embedding for the CPU path, kept free of numba (rope.py
imports it from here)."""

import numpy as np


def rope_freqs(n_rot: int, base: float) -> np.ndarray:
    """(n_rot/2,) inverse frequencies base^(-2i/n_rot), computed in float64."""
    return base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)


def rope_ref(x: np.ndarray, pos: np.ndarray, base: float, neox: bool,
             n_rot: int | None = None, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """x (T, H, D) float32, pos (T,) -> x rotated; the first n_rot dims of each head rotate.

    Normal layout (llama; the GGUF converter permuted Q/K for it) rotates adjacent pairs
    (2i, 2i+1); NeoX (qwen3, gemma3) rotates (i, i + n_rot/2). freq_factors (n_rot/2,), as
    ggml's rope_ext: pair i's frequency is divided by factor i (gemma4's `rope_freqs`).
    """
    n_rot = x.shape[-1] if n_rot is None else n_rot
    freqs = rope_freqs(n_rot, base)
    if freq_factors is not None:
        freqs = freqs / freq_factors.astype(np.float64)
    angle = pos.astype(np.float64)[:, None] * freqs[None, :]  # (T, n_rot/2)
    cos = np.cos(angle).astype(np.float32)[:, None, :]
    sin = np.sin(angle).astype(np.float32)[:, None, :]
    out = x.astype(np.float32, copy=True)
    if neox:
        a, b = x[..., : n_rot // 2], x[..., n_rot // 2: n_rot]
        out[..., : n_rot // 2] = a * cos - b * sin
        out[..., n_rot // 2: n_rot] = b * cos + a * sin
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = b * cos + a * sin
    return out
