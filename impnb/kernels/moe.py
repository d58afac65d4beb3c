"""Mixture-of-experts routing: numpy reference for softmax top-k routing."""

import numpy as np


def route_ref(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Router logits (T, E) -> (experts (T, k) int32, weights (T, k) float32).

    Softmax over all experts, then the k largest; ties go to the lower expert index.
    With `normalize` the k weights are rescaled to sum to 1.
    """
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    experts = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(p, experts, axis=-1)
    if normalize:
        weights /= weights.sum(axis=-1, keepdims=True)
    return experts.astype(np.int32), weights.astype(np.float32)
