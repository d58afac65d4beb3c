"""Host-side cache of one sequence for the numpy reference model: K/V of the attention layers and the
recurrent state of the Gated DeltaNet layers."""

import numpy as np

from impnb.models.config import ModelConfig


class KVCache:
    """Per attention layer K (n_ctx, Hkv, Dk) and V (n_ctx, Hkv, Dv) float32, of the layer's own
    shape (cfg.kv_heads, cfg.head_dims); a layer that shares an earlier layer's K/V (cfg.kv_layer)
    holds that layer's arrays, so reading it reads the source. Per Gated DeltaNet layer
    (cfg.is_recurrent) its conv state `conv` (C, K-1) and delta-rule state `ssm` (Hv, Dk, Dv)
    float32, None in the other layers' places. `pos` tokens are filled."""

    def __init__(self, cfg: ModelConfig, n_ctx: int):
        self.n_ctx = n_ctx
        attn = [not cfg.is_recurrent(il) for il in range(cfg.n_layer)]
        self.k, self.v = [], []
        for il in range(cfg.n_layer):
            src = cfg.kv_layer(il)
            if not attn[il] or src != il:
                self.k.append(self.k[src] if attn[il] else None)
                self.v.append(self.v[src] if attn[il] else None)
                continue
            (dk, dv), hkv = cfg.head_dims(il), cfg.kv_heads(il)
            self.k.append(np.zeros((n_ctx, hkv, dk), np.float32))
            self.v.append(np.zeros((n_ctx, hkv, dv), np.float32))
        d = cfg.deltanet
        self.conv = [None if a else np.zeros((d.conv_channels, d.conv_kernel - 1), np.float32) for a in attn]
        self.ssm = [None if a else np.zeros((d.n_v_heads, d.head_k_dim, d.head_v_dim), np.float32)
                    for a in attn]
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
