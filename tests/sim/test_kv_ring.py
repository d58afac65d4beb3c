"""The paged KV cache's window rings (gpu/kv.PagedKV, WINDOW_RING) on the simulator's device arrays:
one sequence's sliding-window layers hold window_pages pages and map position p to page
(p // PAGE_SIZE) mod that; every position a step's rows see or write has a slot of its own."""

from dataclasses import replace

import numpy as np
import pytest

from impnb.gpu.context import GpuContext
from impnb.gpu.kv import PagedKV
from impnb.tuning import PAGE_SIZE, PREFILL_CHUNK, PREFILL_CHUNK_MOE, prefill_chunk
from tests.sim.test_plans import cfg_of

WINDOW = 64
TOKENS = 16384  # a context past the rings of either kind of model's chunk


def gemma_like(n_layer: int = 6):
    """Five sliding layers (heads of 256) to one global, as Gemma 3 / 4 stack them."""
    return replace(cfg_of(256, 8, 4), n_layer=n_layer, sliding_window=WINDOW,
                   swa_layers=tuple((il + 1) % 6 != 0 for il in range(n_layer)))


def test_window_layers_keep_a_ring():
    cfg = gemma_like()
    n_pages = PagedKV.pages(TOKENS)
    kv = PagedKV(GpuContext(), cfg, n_pages, 1, n_pages, window_ring=True)
    ring = PagedKV.window_pages(cfg, n_pages, 1, True)
    assert ring == PagedKV.pages(WINDOW + prefill_chunk(cfg) - 1) < n_pages
    moe = replace(cfg, n_expert=8, n_expert_used=2)
    assert PagedKV.window_pages(moe, n_pages, 1, True) == PagedKV.pages(WINDOW + prefill_chunk(moe) - 1) > ring
    for il in range(cfg.n_layer):
        windowed = cfg.window(il) is not None
        assert kv.windowed[il] == windowed
        assert kv.k[il].shape[0] == kv.v[il].shape[0] == (ring if windowed else n_pages)
        table = kv.block_table_of(il).copy_to_host()
        want = np.arange(n_pages) % ring if windowed else np.arange(n_pages)
        assert np.array_equal(table, want), il
    held = sum(kv.k[il].nbytes + kv.v[il].nbytes for il in range(cfg.n_layer))
    assert PagedKV.nbytes(cfg, TOKENS, 1, True) == held < PagedKV.nbytes(cfg, TOKENS)


@pytest.mark.parametrize("chunk", [PREFILL_CHUNK, PREFILL_CHUNK_MOE, 48])
@pytest.mark.parametrize("T", [1, 3, 8, 100, "chunk"])
def test_a_steps_positions_never_share_a_slot(T, chunk):
    """Every chunk start: the keys its first row sees from (p0 - WINDOW + 1) and the rows it
    writes (to p0 + T - 1) land on distinct (page, offset) slots of the ring; a page fewer would
    not hold a whole prompt chunk's."""
    cfg = gemma_like()
    T = chunk if T == "chunk" else min(T, chunk)
    n_pages = PagedKV.pages(8192)
    ring = PagedKV.window_pages(cfg, n_pages, 1, True, chunk)
    table = np.arange(n_pages) % ring
    assert not distinct(np.arange(n_pages) % (ring - 1), 8192 - chunk - 1, chunk)
    for p0 in range(0, 8192 - T, 7):
        assert distinct(table, p0, T), (p0, T)


def distinct(table, p0: int, T: int) -> bool:
    """Whether the positions a step of T rows from p0 sees or writes have slots of their own."""
    live = np.arange(max(0, p0 - WINDOW + 1), p0 + T)
    slots = table[live // PAGE_SIZE] * PAGE_SIZE + live % PAGE_SIZE
    return len(np.unique(slots)) == len(live)


@pytest.mark.parametrize("why", ["off", "batch", "short context", "no window"])
def test_whole_pools_otherwise(why):
    cfg = gemma_like() if why != "no window" else cfg_of(256, 8, 4)
    n_pages = PagedKV.pages(512 if why == "short context" else 4096)
    max_seqs = 4 if why == "batch" else 1
    kv = PagedKV(GpuContext(), cfg, n_pages, max_seqs, n_pages, window_ring=why != "off")
    assert not any(kv.windowed) and kv.window_tables is kv.tables
    assert all(k.shape[0] == n_pages for k in kv.k)
    tokens = n_pages * PAGE_SIZE
    assert PagedKV.nbytes(cfg, tokens, max_seqs, why != "off") == PagedKV.nbytes(cfg, tokens)
