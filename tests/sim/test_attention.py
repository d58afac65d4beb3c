"""Paged KV write and decode attention in the CUDA simulator: the GPU tests' checks on
tiny shapes (H 4 / Hkv 2, D 64, page 16, contexts 1..40 across page boundaries, window 7)."""

import numpy as np
import pytest

from impnb.kernels.attention.kv_cache import kv_gather_ref, kv_write_ref
from tests.gpu.test_attention import check_decode, check_decode_growing, check_decode_post, check_kv_write

H, HKV, D = 4, 2, 64


def test_kv_layout_roundtrip():
    """The numpy twin: rows written through a shuffled table gather back in order, fp16-rounded."""
    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 40, HKV, D)).astype(np.float32)
    table = rng.permutation(8).astype(np.int32).reshape(2, 4)
    k_pool = np.full((8, 16, HKV, D), np.nan, np.float16)
    v_pool = k_pool.copy()
    kv_write_ref(k_pool, v_pool, table, k, -k, np.tile(np.arange(40, dtype=np.int32), (2, 1)))
    for b in range(2):
        np.testing.assert_array_equal(kv_gather_ref(k_pool, table[b], 40), k[b].astype(np.float16))
        np.testing.assert_array_equal(kv_gather_ref(v_pool, table[b], 40), -k[b].astype(np.float16))
    assert np.isnan(k_pool[table[:, 2:], 8:]).all()  # positions 40..63 were never written


@pytest.mark.parametrize("B,T,page_size", [(1, 1, 16), (2, 3, 32)])
def test_kv_write(B, T, page_size):
    check_kv_write(np.random.default_rng([B, T]), B, T, HKV, D, page_size)


@pytest.mark.parametrize("L,T,window,n_splits,std,H_,Hkv", [
    (1, 1, None, 1, 1.0, H, HKV),     # a single key, 4-row tile
    (33, 1, None, 3, 0.1, H, HKV),    # two pages and a key: one live split (min_chunk keys), two idle
    (17, 1, 7, 3, 3.0, H, HKV),       # window: keys 11..16 of page 0 and 1, two splits idle
    (40, 5, 7, 1, 1.0, 2, 1),         # 5 queries in a window: 10 rows, two 8-row groups (one KV head)
    (150, 2, None, 3, 1.0, H, HKV),   # two tokens: live splits of 128 keys (four steps) and 22 merged, one idle
])
def test_decode(L, T, window, n_splits, std, H_, Hkv):
    check_decode(np.random.default_rng([L, T]), [L], T, H_, Hkv, D, std, window, n_splits=n_splits)


@pytest.mark.parametrize("H_,Hkv,D_,L,split_keys,n_splits", [
    (3, 1, 64, 100, 32, 5),     # g = 3: four live splits merged by four split groups
    (8, 1, 128, 50, 16, 5),     # g = 8, 8-row tiles: four live splits, two key slots a warp
    (4, 1, 256, 70, 8, 10),     # D 256, one key slot a warp: nine live splits
])
def test_decode_many_splits(H_, Hkv, D_, L, split_keys, n_splits):
    """Short splits (split_keys) so the last block merges many partials at every head dim; one
    split idle (every idle block costs the simulator 256 threads)."""
    check_decode(np.random.default_rng([H_, D_, L]), [L], 1, H_, Hkv, D_, 1.0, n_splits=n_splits,
                 split_keys=split_keys)


def test_decode_batch_softcap():
    check_decode(np.random.default_rng(7), [2, 35], 2, H, HKV, D, 3.0, window=7, softcap=5.0,
                 page_size=32, n_splits=2)


def test_decode_growing_context():
    """Steps 15, 16 cross the page boundary at 16 with fixed buffers and split count."""
    check_decode_growing(np.random.default_rng(3), 15, 17, H, HKV, D, window=7, n_splits=2)


@pytest.mark.parametrize("H_,Hkv,D_,L,T,window,warps,std", [
    (4, 2, 64, 1, 1, None, 4, 1.0),       # a single key
    (4, 2, 64, 150, 1, None, 4, 3.0),     # three turns of 64 keys, four key slots a warp
    (4, 2, 64, 100, 3, None, 4, 1.0),     # two turns: the step's three keys in the second
    (3, 1, 64, 40, 3, 7, 8, 1.0),         # 3 queries in a window: 9 rows, a block each
    (8, 1, 128, 70, 1, None, 4, 0.1),     # three turns of 32, two key slots a warp
    (4, 1, 256, 70, 2, 40, 8, 1.0),       # two turns of 32 in a window, one key slot a warp
])
def test_decode_short(H_, Hkv, D_, L, T, window, warps, std):
    check_decode(np.random.default_rng([H_, D_, L, T]), [L], T, H_, Hkv, D_, std, window,
                 short=True, warps=warps)


def test_decode_short_batch_softcap_growing():
    """Two sequences of two tokens with softcap and window; then the default 16-warp kernel at steps
    15, 16 across a page boundary; one KV head (two: the other short tests)."""
    check_decode(np.random.default_rng(8), [2, 35], 2, 2, 1, D, 3.0, window=7, softcap=5.0,
                 page_size=32, short=True)
    check_decode_growing(np.random.default_rng(4), 15, 17, 2, 1, D, window=7, n_splits=1, short=True)


@pytest.mark.parametrize("L,T,window,neox,norm,D_", [
    (1, 1, None, True, True, 64),     # the step's key alone
    (40, 2, 7, False, False, 64),     # two tokens in a window, adjacent pairs, no QK-norm
    (20, 1, None, True, True, 256),   # D 256: eight lanes a key
    (150, 1, None, True, True, 64),   # three turns of 64 keys (4 warps)
    (70, 2, None, False, True, 64),   # the step's two keys in the second turn
])
def test_decode_short_post(L, T, window, neox, norm, D_):
    check_decode_post(np.random.default_rng([L, T, D_]), L, T, H, HKV, D_, 1.0, window, neox, norm,
                      warps=4 if L > 64 else 8)


def test_decode_short_quant():
    """The output's int8 form beside it, bit-equal to quantize_x_ref's of the output: two
    sequences of two tokens; one token with qkv_post fused."""
    check_decode(np.random.default_rng(9), [3, 40], 2, H, HKV, D, 1.0, short=True, warps=4, quant=True)
    check_decode_post(np.random.default_rng(10), 20, 1, H, HKV, 128, 1.0, warps=4, quant=True)
    check_decode_post(np.random.default_rng(11), 9, 1, 4, 1, 256, 1.0, warps=8, quant=True)  # Gemma3's heads
