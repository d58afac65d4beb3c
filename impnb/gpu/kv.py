"""The paged KV cache of one sequence on the GPU: per layer K and V pools of fp16 pages, and the
block table mapping the sequence's pages to them (contiguous for one sequence)."""

import numpy as np

from impnb.kernels.attention import kv_cache
from impnb.models.config import ModelConfig
from impnb.tuning import PAGE_SIZE


class PagedKV:
    """k[il], v[il]: kv_cache.pool_shape pools (pages, PAGE_SIZE, Hkv, D) fp16; block_table (pages,)."""

    def __init__(self, ctx, cfg: ModelConfig, n_ctx: int):
        n_pages = kv_cache.pages_needed(n_ctx, PAGE_SIZE)
        self.k = [ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, cfg.n_head_kv, cfg.head_dim), np.float16)
                  for _ in range(cfg.n_layer)]
        self.v = [ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, cfg.n_head_kv, cfg.head_dim_v), np.float16)
                  for _ in range(cfg.n_layer)]
        self.block_table = ctx.upload(kv_cache.contiguous_block_table(1, n_pages)[0])

    @staticmethod
    def nbytes(cfg: ModelConfig, n_ctx: int) -> int:
        """The pools' bytes for n_ctx tokens (fp16 K and V of every layer)."""
        return 2 * cfg.n_layer * n_ctx * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)
