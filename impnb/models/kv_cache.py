"""Host-side KV cache for the numpy reference model."""

import numpy as np

from impnb.models.config import ModelConfig


class KVCache:
    """Per layer K (n_ctx, Hkv, Dk) and V (n_ctx, Hkv, Dv) float32; `pos` tokens are filled."""

    def __init__(self, cfg: ModelConfig, n_ctx: int):
        self.n_ctx = n_ctx
        self.k = [np.zeros((n_ctx, cfg.n_head_kv, cfg.head_dim), np.float32) for _ in range(cfg.n_layer)]
        self.v = [np.zeros((n_ctx, cfg.n_head_kv, cfg.head_dim_v), np.float32) for _ in range(cfg.n_layer)]
        self.pos = 0

    def store(self, il: int, pos0: int, k: np.ndarray, v: np.ndarray):
        """Write K/V for positions pos0.. and return the views of every position so far."""
        end = pos0 + k.shape[0]
        self.k[il][pos0:end] = k
        self.v[il][pos0:end] = v
        return self.k[il][:end], self.v[il][:end]
