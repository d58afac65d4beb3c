"""Prompt chunks through captured graphs: a chunk of n tokens runs as the graph of its bucket.

A chunk is padded to the smallest bucket B >= n: rows n..B-1 repeat the last token at the
positions after it. Their K/V land in cache slots past the prompt, which the next real tokens
overwrite before any query reads them (attention is causal and reads positions <= its own);
their logits are never read: the graph's logits row is gathered from the row index the host
uploads (kernels/elementwise/rows.py). A bucket whose padded end would pass n_ctx runs eagerly instead.
Each bucket's graph is captured after its first (eager) run, which is also a warm-up.
"""

import numpy as np

BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)  # up to tuning.PREFILL_CHUNK_MOE's chunk


def bucket(n: int, pos: int, n_ctx: int) -> int | None:
    """The graph bucket for n tokens at positions pos.. (None: run eagerly)."""
    B = next((b for b in BUCKETS if b >= n), None)
    return B if B is not None and pos + B <= n_ctx else None


def padded(chunk: np.ndarray, pos: int, B: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids (B,), positions (B,)) int32 of a chunk padded to B rows."""
    n = len(chunk)
    ids = np.concatenate([chunk, np.full(B - n, chunk[-1], np.int32)]).astype(np.int32)
    return ids, np.arange(pos, pos + B, dtype=np.int32)
