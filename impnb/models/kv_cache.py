"""Host-side KV cache for the numpy reference model."""

import numpy as np

from impnb.models.config import ModelConfig


class KVCache:
    """Per layer K (n_ctx, Hkv, Dk) and V (n_ctx, Hkv, Dv) float32; `pos` tokens are filled.

    Shapes are the layer's own (cfg.kv_heads, cfg.head_dims); a layer that shares an earlier
    layer's K/V (cfg.kv_layer) holds that layer's arrays, so reading it reads the source."""

    def __init__(self, cfg: ModelConfig, n_ctx: int):
        self.n_ctx = n_ctx
        self.k, self.v = [], []
        for il in range(cfg.n_layer):
            src = cfg.kv_layer(il)
            if src != il:
                self.k.append(self.k[src])
                self.v.append(self.v[src])
                continue
            (dk, dv), hkv = cfg.head_dims(il), cfg.kv_heads(il)
            self.k.append(np.zeros((n_ctx, hkv, dk), np.float32))
            self.v.append(np.zeros((n_ctx, hkv, dv), np.float32))
        self.pos = 0

    def store(self, il: int, pos0: int, k: np.ndarray, v: np.ndarray):
        """Write K/V for positions pos0.. and return the views of every position so far."""
        end = pos0 + k.shape[0]
        self.k[il][pos0:end] = k
        self.v[il][pos0:end] = v
        return self.k[il][:end], self.v[il][:end]

    def stored(self, il: int, end: int):
        """The views of positions 0..end-1 without writing (a layer reading a shared K/V)."""
        return self.k[il][:end], self.v[il][:end]
