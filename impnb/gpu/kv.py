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
    """k[il], v[il]: kv_cache.pool_shape pools (n_pages, PAGE_SIZE, Hkv, D) fp16; tables
    (max_seqs, max_pages) int32, rows of page numbers (one sequence: its pages 0, 1, ...)."""

    def __init__(self, ctx, cfg: ModelConfig, n_pages: int, max_seqs: int = 1, max_pages: int | None = None):
        self.n_pages = n_pages
        self.k = [ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, cfg.n_head_kv, cfg.head_dim), np.float16)
                  for _ in range(cfg.n_layer)]
        self.v = [ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, cfg.n_head_kv, cfg.head_dim_v), np.float16)
                  for _ in range(cfg.n_layer)]
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
        """The pools' bytes for n_tokens tokens (fp16 K and V of every layer, whole pages)."""
        return 2 * cfg.n_layer * PagedKV.pages(n_tokens) * PAGE_SIZE * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)
