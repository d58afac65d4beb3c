"""Exact re-encoding of GGUF blocks in a wider type, so that matrices of mixed types can stack.

A Q4_0 block is d · (q − 8) and a Q5_0 block d · (q − 16), q unsigned: both are Q8_0 blocks with
the same fp16 scale d and the int8 quants q − 8 or q − 16, equal value for value (tests/
test_quant_promote.py, against the gguf package). A layer whose Q and K are Q5_0 and whose V is
Q8_0 (Gemma3-270M Q4_K_M) thus reads Q|K|V in one GEMV instead of three.
"""

from collections.abc import Iterable

import numpy as np
from gguf import GGMLQuantizationType as T

TO_Q8_0 = (T.Q4_0, T.Q5_0, T.Q8_0)
_Q8_0_BLOCK = 34  # bytes: d f16, 32 int8 quants


def common_type(types: Iterable[T]) -> T | None:
    """The one type every tensor of `types` is held in exactly: theirs where they agree, Q8_0
    for a mix of Q4_0, Q5_0 and Q8_0, else None."""
    kinds = set(types)
    if len(kinds) == 1:
        return kinds.pop()
    return T.Q8_0 if kinds <= set(TO_Q8_0) else None


def promote(data: np.ndarray, ggml_type: T, to: T) -> np.ndarray:
    """Raw tensor bytes (..., row_bytes) of ggml_type -> the same values as `to` bytes."""
    if ggml_type == to:
        return data
    assert to == T.Q8_0 and ggml_type in TO_Q8_0, (ggml_type, to)
    raw = np.ascontiguousarray(data).view(np.uint8)
    lead, row_bytes = raw.shape[:-1], raw.shape[-1]
    size = 18 if ggml_type == T.Q4_0 else 22
    blocks = raw.reshape(-1, size)
    qs = blocks[:, size - 16:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int16)  # (n, 32): x[j], x[j + 16]
    if ggml_type == T.Q5_0:
        qh = blocks[:, 2:6].copy().view("<u4")  # (n, 1): bit j is the fifth bit of x[j]
        q |= (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int16)
        q -= 16
    else:
        q -= 8
    out = np.empty((blocks.shape[0], _Q8_0_BLOCK), np.uint8)
    out[:, :2] = blocks[:, :2]
    out[:, 2:] = q.astype(np.int8).view(np.uint8)
    return out.reshape(*lead, row_bytes // size * _Q8_0_BLOCK)
