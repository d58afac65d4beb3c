"""Activation buffers allocated once per (name, rows) and reused every step: no per-token allocation."""

import numpy as np


class Arena:
    """Device buffers by name and shape; the first request allocates, later ones reuse."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._buffers = {}
        self.frozen = False  # set before graph capture: a new request is then a bug

    def get(self, name: str, shape: tuple, dtype=np.float32):
        key = (name, tuple(shape), np.dtype(dtype))
        buf = self._buffers.get(key)
        if buf is None:
            assert not self.frozen, f"buffer {key} requested after the arena was frozen"
            buf = self._buffers[key] = self.ctx.empty(shape, dtype)
        return buf

    def zeros(self, name: str, shape: tuple, dtype=np.float32):
        """Like get, zero-filled when first allocated (state that kernels keep zero between uses)."""
        key = (name, tuple(shape), np.dtype(dtype))
        if key not in self._buffers:
            assert not self.frozen, f"buffer {key} requested after the arena was frozen"
            self._buffers[key] = self.ctx.upload(np.zeros(shape, dtype))
        return self._buffers[key]

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())
