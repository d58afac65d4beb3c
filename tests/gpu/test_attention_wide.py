"""attention_wide (Gemma 4's global heads of 512) on the GPU against attention_ref: decode steps
split over the keys and merged, prompt chunks in one split, windows, padding rows (pos < 0: zeros).
Bounds as tests/gpu/test_attention.py's (assert_attention: the fp16-K/V reference tightly, the
float32 one loosely). tests/sim/test_attention_wide.py runs the check on tiny shapes."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.attention.attention_wide import attention_wide, num_splits, partials_shape
from tests.gpu.test_attention import assert_attention, gauss, paged_cache

pytestmark = pytest.mark.gpu


def check_wide(rng, L, T, H, Hkv, D, window, n_splits, std, page_size=16, pad=0, tiled=False):
    """T queries at positions L - T .. L - 1 (then `pad` padding rows at -1) over a cache of L keys;
    tiled: attention_wide_tiled's split kernel."""
    k_pool, v_pool, table, ks, vs = paged_cache(rng, [L], Hkv, D, page_size, std)
    q = gauss(rng, (T + pad, H, D), std)
    pos = np.concatenate([np.arange(L - T, L), np.full(pad, -1)]).astype(np.int32)
    scale = D ** -0.5
    out = np.full(q.shape, np.nan, np.float32)
    partials = np.full(partials_shape(n_splits + 1, T + pad, H, D), np.nan, np.float32)
    stream = cuda.stream()
    dev = [cuda.to_device(a, stream=stream) for a in (q, k_pool, v_pool, table[0], pos, out, partials)]
    attention_wide(*dev[:7], n_splits, scale, window, stream, tiled)
    got = dev[5].copy_to_host(stream=stream)
    stream.synchronize()
    assert np.array_equal(got[T:], np.zeros_like(got[T:])), "padding rows not zero"
    assert_attention(got[:T], q[:T], k_pool, v_pool, table[0], ks[0], vs[0], pos[:T], scale, window, None, std,
                     f"wide L={L} T={T} H={H}/{Hkv} D={D} window={window} splits={n_splits} std={std} tiled={tiled}")


@pytest.mark.parametrize("tiled", [False, True], ids=["per-warp", "tiled"])
@pytest.mark.parametrize("L", [1, 17, 1000, 4097])
@pytest.mark.parametrize("std", [0.1, 1.0, 3.0])
def test_decode(L, std, tiled):
    """Gemma-4-26B-A4B's global layers: 16 heads on 2 KV heads of 512, the splits decode takes."""
    n = num_splits(L, 2, 1)
    check_wide(np.random.default_rng([L, int(std * 10)]), L, 1, 16, 2, 512, None, n, std, tiled=tiled)


@pytest.mark.parametrize("tiled", [False, True], ids=["per-warp", "tiled"])
@pytest.mark.parametrize("T,window", [(3, None), (8, 100)])
def test_decode_tokens_and_window(T, window, tiled):
    check_wide(np.random.default_rng([T, window or 0]), 777, T, 16, 2, 512, window, num_splits(777, 2, T, window), 1.0,
               tiled=tiled)


@pytest.mark.parametrize("H,Hkv,D,L,n_splits", [(16, 8, 256, 1024, 17), (16, 1, 128, 333, 5), (4, 4, 64, 100, 3),
                                                 (8, 1, 512, 45, 2)])
def test_decode_tiled_groupings(H, Hkv, D, L, n_splits):
    """The tiled kernel at other head groupings: 2 (a warp widening 4 keys of a tile), 16 (warps
    past the tile's 8 only scoring), 1, 8 on one KV head; splits that end mid-tile."""
    check_wide(np.random.default_rng([H, Hkv, D]), L, 1, H, Hkv, D, None, n_splits, 1.0, tiled=True)


@pytest.mark.parametrize("L,T,pad", [(111, 111, 0), (600, 512, 0), (300, 45, 19)])
def test_prompt_chunk(L, T, pad):
    """A chunk of T rows after L - T cached keys, one split; padded rows write zeros."""
    check_wide(np.random.default_rng([L, T, pad]), L, T, 16, 2, 512, None, 1, 1.0, pad=pad)
