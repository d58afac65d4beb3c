"""The paged KV cache on the GPU: per layer K and V pools of fp16 pages, and the block tables
that map sequences' positions to pages.

One sequence (CudaEngine) owns every page, in order. Several (the batched engine) share the
pools: `tables` is then a step input like the token ids, row b the pages of the step's
sequence b, written by the host before each step from its block manager.
"""

import numpy as np

from impnb.kernels.attention import kv_cache
from impnb.models.config import ModelConfig
from impnb.tuning import PAGE_SIZE, prefill_chunk


class PagedKV:
    """k[il], v[il]: kv_cache.pool_shape pools (n_pages, PAGE_SIZE, Hkv, D) fp16 of layer il's
    shape (cfg.kv_heads, cfg.head_dims); a layer that shares another's K/V (cfg.kv_layer) holds
    that layer's pools themselves, no pages of its own. tables (max_seqs, max_pages) int32, rows
    of page numbers (one sequence: its pages 0, 1, ...).

    One sequence with `window_ring` (WINDOW_RING): its sliding-window layers keep only their
    window's pages, a ring of window_pages(...) pages: position p on page (p // PAGE_SIZE) mod
    that, through window_tables. A step writes at most `chunk` rows (tuning.prefill_chunk's where
    not given), so the keys any of its rows sees and the rows it writes span fewer pages than the
    ring holds."""

    def __init__(self, ctx, cfg: ModelConfig, n_pages: int, max_seqs: int = 1, max_pages: int | None = None,
                 window_ring: bool = False, chunk: int | None = None):
        self.n_pages = n_pages
        ring = self.window_pages(cfg, n_pages, max_seqs, window_ring, chunk)
        self.windowed = [bool(ring) and cfg.window(il) is not None for il in range(cfg.n_layer)]
        self.k, self.v = [], []
        for il in range(cfg.n_layer):
            src = cfg.kv_layer(il)
            if src != il:
                assert self.windowed[src] == self.windowed[il], "a shared cache of the other layer type"
                self.k.append(self.k[src])
                self.v.append(self.v[src])
                continue
            hkv, (dk, dv) = cfg.kv_heads(il), cfg.head_dims(il)
            pages = ring if self.windowed[il] else n_pages
            self.k.append(ctx.empty(kv_cache.pool_shape(pages, PAGE_SIZE, hkv, dk), np.float16))
            self.v.append(ctx.empty(kv_cache.pool_shape(pages, PAGE_SIZE, hkv, dv), np.float16))
        max_pages = max_pages or n_pages
        self.tables = ctx.upload(np.tile(kv_cache.contiguous_block_table(1, max_pages) % n_pages, (max_seqs, 1)))
        self.window_tables = (ctx.upload(kv_cache.contiguous_block_table(1, max_pages) % ring) if ring
                              else self.tables)

    @property
    def block_table(self):
        """Row 0: the pages of a step's one sequence."""
        return self.tables[0]

    def tables_of(self, il: int):
        """The block tables layer il's kernels read (window_tables for a windowed layer)."""
        return self.window_tables if self.windowed[il] else self.tables

    def block_table_of(self, il: int):
        """Row 0 of tables_of(il)."""
        return self.tables_of(il)[0]

    @staticmethod
    def window_pages(cfg: ModelConfig, n_pages: int, max_seqs: int = 1, window_ring: bool = False,
                     chunk: int | None = None) -> int:
        """The ring's pages for cfg's sliding-window layers: room for the window's keys and a
        step's rows past them (two positions share a slot only when a multiple of the ring's
        tokens apart); 0 (whole pools) for several sequences, no window, or where the ring would
        not be smaller."""
        if not (window_ring and max_seqs == 1 and cfg.sliding_window):
            return 0
        ring = PagedKV.pages(cfg.sliding_window + (chunk or prefill_chunk(cfg)) - 1)
        return ring if ring < n_pages else 0

    @staticmethod
    def pages(n_tokens: int) -> int:
        return kv_cache.pages_needed(n_tokens, PAGE_SIZE)

    @staticmethod
    def nbytes(cfg: ModelConfig, n_tokens: int, max_seqs: int = 1, window_ring: bool = False,
               chunk: int | None = None) -> int:
        """The pools' bytes for n_tokens tokens (fp16 K and V of every layer with its own, whole
        pages; the sliding-window layers' rings where they have them)."""
        n_pages = PagedKV.pages(n_tokens)
        ring = PagedKV.window_pages(cfg, n_pages, max_seqs, window_ring, chunk)
        return 2 * PAGE_SIZE * sum(cfg.kv_heads(il) * sum(cfg.head_dims(il))
                                   * (ring if ring and cfg.window(il) is not None else n_pages)
                                   for il in range(cfg.n_layer) if cfg.kv_layer(il) == il)
