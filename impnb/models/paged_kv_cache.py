"""A paged KV pool for the numpy reference: blocks of K/V rows shared by many sequences, each
sequence reading and writing its rows through its own block table.

`SequenceKV` is one sequence's view of the pool with the `store` / `pos` / `n_ctx` interface
models/kv_cache.KVCache offers, so the reference's layer graph runs on it unchanged.
"""

import numpy as np

from impnb.models.config import ModelConfig


class PagedKVPool:
    """Per layer K (n_blocks, block_size, Hkv, Dk) and V (n_blocks, block_size, Hkv, Dv) float32."""

    @staticmethod
    def holds(cfg: ModelConfig) -> bool:
        """Whether the pool holds all of a sequence's state for cfg's model: every layer attention
        with the model's one K/V shape and its own K/V (no recurrent state, no per-layer shapes,
        no layer reading another's K/V), which KVCache holds otherwise."""
        return all(not cfg.is_recurrent(il) and cfg.kv_layer(il) == il and cfg.kv_heads(il) == cfg.n_head_kv
                   and tuple(cfg.head_dims(il)) == (cfg.head_dim, cfg.head_dim_v) for il in range(cfg.n_layer))

    def __init__(self, cfg: ModelConfig, n_blocks: int, block_size: int):
        self.n_blocks, self.block_size = n_blocks, block_size
        shape_k = (n_blocks, block_size, cfg.n_head_kv, cfg.head_dim)
        shape_v = (n_blocks, block_size, cfg.n_head_kv, cfg.head_dim_v)
        self.k = [np.zeros(shape_k, np.float32) for _ in range(cfg.n_layer)]
        self.v = [np.zeros(shape_v, np.float32) for _ in range(cfg.n_layer)]

    def view(self, block_table, pos: int, n_ctx: int) -> "SequenceKV":
        return SequenceKV(self, block_table, pos, n_ctx)


class SequenceKV:
    """One sequence in the pool: positions 0..pos-1 are filled, row p lives in block
    block_table[p // block_size] at offset p % block_size."""

    def __init__(self, pool: PagedKVPool, block_table, pos: int, n_ctx: int):
        self.pool = pool
        self.table = np.asarray(block_table, np.int64)
        self.pos = pos
        self.n_ctx = min(n_ctx, len(self.table) * pool.block_size)

    def store(self, il: int, pos0: int, k: np.ndarray, v: np.ndarray):
        """Write K/V for positions pos0.. into the sequence's blocks; return (S, Hkv, D) copies of
        every position so far, gathered through the block table."""
        bs = self.pool.block_size
        end = pos0 + k.shape[0]
        rows = np.arange(pos0, end)
        blocks, offsets = self.table[rows // bs], rows % bs
        self.pool.k[il][blocks, offsets] = k
        self.pool.v[il][blocks, offsets] = v
        used = self.table[:(end + bs - 1) // bs]
        k_all = self.pool.k[il][used].reshape(-1, *k.shape[1:])[:end]
        v_all = self.pool.v[il][used].reshape(-1, *v.shape[1:])[:end]
        return k_all, v_all
