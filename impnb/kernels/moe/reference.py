"""numpy references of MoE routing, grouping and combining for the CPU path and the tests, kept free
of numba (moe.py imports them from here). T tokens, E experts, k experts per token, D model dim."""

import numpy as np


def route_ref(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Router logits (T, E) -> (experts (T, k) int32, weights (T, k) float32).

    The k largest logits (the order of their softmax, without the ties its underflow makes
    where logits span more than ~745), ties to the lower expert index; their weights are the
    softmax over all experts, or with `normalize` over the k alone (rescaled to sum to 1).
    """
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    experts = np.argsort(-z, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(p, experts, axis=-1)
    if normalize:
        weights /= weights.sum(axis=-1, keepdims=True)
    return experts.astype(np.int32), weights.astype(np.float32)


def group_ref(experts: np.ndarray, n_expert: int, tm: int) -> tuple[np.ndarray, np.ndarray]:
    """Slots grouped by expert -> (segment starts (E + 1,), tiles (n_tiles, 3) of (e, first row, rows)):
    expert e's slots fill rows seg[e] .. seg[e+1]-1, cut into tiles of at most tm rows."""
    counts = np.bincount(experts.reshape(-1), minlength=n_expert)
    seg = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    tiles = [(e, r, min(tm, seg[e + 1] - r)) for e in range(n_expert) for r in range(seg[e], seg[e + 1], tm)]
    return seg, np.array(tiles, np.int32).reshape(-1, 3)


def combine_ref(y: np.ndarray, rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """out (T, D) = sum_j weights[t, j] * y[rows[t * k + j]] (float64)."""
    T, k = weights.shape
    return (weights[:, :, None].astype(np.float64) * y[rows.reshape(T, k)].astype(np.float64)).sum(axis=1)
