"""The paged KV pool's bookkeeping (impnb/serve/block_manager.py), the reference's paged cache
against its contiguous one, and the pool's size from tokens or GPU memory."""

import numpy as np
import pytest

from impnb.errors import DeviceError, ParameterError
from impnb.models.config import ModelConfig
from impnb.models.kv_cache import KVCache
from impnb.models.paged_kv_cache import PagedKVPool
from impnb.sampling import SamplingParams
from impnb.serve.block_manager import BlockManager
from impnb.serve.pool_size import blocks_for_memory, blocks_for_tokens, kv_bytes_per_token
from impnb.serve.sequence import Sequence

CFG = ModelConfig(arch="llama", n_layer=2, n_embd=8, n_head=2, n_head_kv=1, head_dim=4, head_dim_v=4,
                  n_ff=8, n_vocab=300, n_ctx=64, eps=1e-6, rope_base=1e4, rope_neox=False, n_rot=4,
                  attn_scale=0.5)


def seq(ids) -> Sequence:
    return Sequence(list(ids), SamplingParams())


def all_free(bm: BlockManager) -> bool:
    return bm.n_free == len(bm.blocks) and all(b.ref_count == 0 for b in bm.blocks)


def test_grow_and_release_leave_nothing_behind():
    bm = BlockManager(8, 4)
    a, b = seq(range(10)), seq(range(5))
    assert bm.blocks_needed(a, 10) == 3 and bm.can_grow(a, 10)
    bm.grow(a, 10)
    bm.grow(b, 5)
    assert len(a.block_table) == 3 and len(b.block_table) == 2 and bm.n_free == 3
    assert not set(a.block_table) & set(b.block_table)
    assert not bm.can_grow(a, 10 + 4 * 4)
    bm.grow(a, 12)  # still inside its third block
    assert len(a.block_table) == 3
    bm.release(a)
    bm.release(b)
    assert all_free(bm) and a.block_table == [] and a.n_computed == 0


def computed(bm: BlockManager, s: Sequence) -> Sequence:
    """s with every token computed and its full blocks in the prefix cache."""
    bm.grow(s, len(s))
    s.n_computed = len(s)
    bm.commit(s)
    return s


def test_prefix_blocks_are_shared_and_counted():
    bm = BlockManager(16, 4)
    system = list(range(100, 110))  # two full blocks and a part
    a = computed(bm, seq(system + [1, 2, 3]))
    b = seq(system + [7, 8])
    assert bm.match_prefix(b) == 8 and b.n_computed == 8 and b.block_table == a.block_table[:2]
    assert [bm.blocks[i].ref_count for i in b.block_table] == [2, 2]
    bm.grow(b, len(b))
    assert b.block_table[2] != a.block_table[2]  # the partial third block is b's own
    bm.release(a)
    assert [bm.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]
    bm.release(b)
    assert all_free(bm)


def test_a_prefix_differs_in_any_earlier_block():
    bm = BlockManager(16, 4)
    computed(bm, seq([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert bm.match_prefix(seq([1, 2, 3, 4, 5, 6, 7, 8, 0])) == 8
    other = seq([0, 2, 3, 4, 5, 6, 7, 8, 9])  # the second block is equal, its prefix is not
    assert bm.match_prefix(other) == 0


def test_the_last_token_is_never_taken_from_the_cache():
    bm = BlockManager(16, 4)
    computed(bm, seq(range(12)))
    again = seq(range(8))  # two full cached blocks, but its last token must be computed
    assert bm.match_prefix(again) == 4


def test_freed_blocks_stay_cached_until_reused():
    bm = BlockManager(4, 4)
    a = computed(bm, seq(range(9)))
    bm.release(a)
    b = seq(list(range(8)) + [50])
    assert bm.match_prefix(b) == 8 and bm.n_free == 2  # taken back out of the free list
    bm.release(b)
    c = seq(range(200, 216))  # needs all four blocks: the cached ones are overwritten
    bm.grow(c, 16)
    c.n_computed = 16
    bm.commit(c)
    assert bm.match_prefix(seq(list(range(8)) + [50])) == 0
    bm.release(c)
    assert all_free(bm)


def test_without_prefix_caching_nothing_is_shared():
    bm = BlockManager(8, 4, prefix_caching=False)
    computed(bm, seq(range(9)))
    assert bm.match_prefix(seq(range(9))) == 0


def test_paged_cache_stores_what_the_contiguous_one_does():
    rng = np.random.default_rng(0)
    pool = PagedKVPool(CFG, n_blocks=9, block_size=4)
    table = [7, 2, 5, 0]  # scattered on purpose
    paged, flat = pool.view(table, 0, 16), KVCache(CFG, 16)
    for pos0, n in ((0, 6), (6, 1), (7, 5)):
        k, v = rng.standard_normal((2, n, 1, 4)).astype(np.float32)
        for il in range(CFG.n_layer):
            got, want = paged.store(il, pos0, k, v), flat.store(il, pos0, k, v)
            assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert np.array_equal(pool.k[0][7], flat.k[0][:4]) and np.array_equal(pool.k[1][2], flat.k[1][4:8])
    assert not pool.k[0][[1, 3, 4, 6, 8]].any()  # blocks outside the table untouched


def test_pool_size_from_tokens_and_memory():
    assert blocks_for_tokens(33, 16) == 3
    with pytest.raises(ParameterError, match="positive number of tokens"):
        blocks_for_tokens(0, 16)
    per_token = kv_bytes_per_token(CFG, 2)
    assert per_token == 2 * 1 * 8 * 2
    gib = 2**30
    # 0.9 of 80 GiB is 72 GiB; 10 GiB are in use: 62 GiB of blocks
    assert blocks_for_memory(CFG, 16, 0.9, 70 * gib, 80 * gib) == 62 * gib // (per_token * 16)
    with pytest.raises(DeviceError, match="no KV block fits"):
        blocks_for_memory(CFG, 16, 0.1, 70 * gib, 80 * gib)
    with pytest.raises(ParameterError, match="gpu_memory_utilization"):
        blocks_for_memory(CFG, 16, 1.5, 70 * gib, 80 * gib)


def test_a_step_packs_into_flat_arrays():
    from impnb.serve.runner import SequenceRows, StepInput

    p = SamplingParams()
    step = StepInput([SequenceRows(4, np.array([7, 8, 9], np.int32), 16, np.array([3, 1, 6]), False, p, 0),
                      SequenceRows(2, np.array([5], np.int32), 40, np.array([0, 2, 4, 5, 8, 9]), True, p, 3)])
    packed = step.packed()
    assert packed.token_ids.tolist() == [7, 8, 9, 5] and packed.positions.tolist() == [16, 17, 18, 40]
    assert packed.seq_starts.tolist() == [0, 3, 4] and packed.context_lens.tolist() == [19, 41]
    assert packed.block_tables.tolist() == [[3, 1, 6, -1, -1, -1], [0, 2, 4, 5, 8, 9]]
    assert packed.sample_rows.tolist() == [3] and step.n_tokens == 4
