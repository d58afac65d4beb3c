"""The paged KV cache on the GPU: per layer K and V pools of fp16 pages, and the block tables
that map sequences' positions to pages.

One sequence (CudaEngine) owns every page, in order. Several (the batched engine) share the
pools: `tables` is then a step input like the token ids, row b the pages of the step's
sequence b, written by the host before each step from its block manager.
"""

import numpy as np

from impnb.kernels.attention import kv_cache
from impnb.models.config import ModelConfig
from impnb.tuning import PAGE_SIZE


class PagedKV:
    """k[il], v[il]: kv_cache.pool_shape pools (n_pages, PAGE_SIZE, Hkv, D) fp16 of layer il's
    shape (cfg.kv_heads, cfg.head_dims); a layer that shares another's K/V (cfg.kv_layer) holds
    that layer's pools themselves, no pages of its own. tables (max_seqs, max_pages) int32, rows
    of page numbers (one sequence: its pages 0, 1, ...)."""

    def __init__(self, ctx, cfg: ModelConfig, n_pages: int, max_seqs: int = 1, max_pages: int | None = None):
        self.n_pages = n_pages
        self.k, self.v = [], []
        for il in range(cfg.n_layer):
            src = cfg.kv_layer(il)
            if src != il:
                self.k.append(self.k[src])
                self.v.append(self.v[src])
                continue
            hkv, (dk, dv) = cfg.kv_heads(il), cfg.head_dims(il)
            self.k.append(ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, hkv, dk), np.float16))
            self.v.append(ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, hkv, dv), np.float16))
        max_pages = max_pages or n_pages
        self.tables = ctx.upload(np.tile(kv_cache.contiguous_block_table(1, max_pages) % n_pages, (max_seqs, 1)))

    @property
    def block_table(self):
        """Row 0: the pages of a step's one sequence."""
        return self.tables[0]

    @staticmethod
    def pages(n_tokens: int) -> int:
        return kv_cache.pages_needed(n_tokens, PAGE_SIZE)

    @staticmethod
    def nbytes(cfg: ModelConfig, n_tokens: int) -> int:
        """The pools' bytes for n_tokens tokens (fp16 K and V of every layer with its own, whole pages)."""
        per_token = sum(cfg.kv_heads(il) * sum(cfg.head_dims(il))
                        for il in range(cfg.n_layer) if cfg.kv_layer(il) == il)
        return 2 * PagedKV.pages(n_tokens) * PAGE_SIZE * per_token
