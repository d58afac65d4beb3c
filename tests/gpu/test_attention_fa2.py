"""Prefill attention on tensor cores (FA2 on mma.sync in each tiling, and the wgmma kernel: tiling
"wg") on the GPU against the float64 numpy reference.

check_fa2 runs one case; tests/sim/test_attention_fa2.py runs it on tiny shapes in the simulator.
Every case: Gaussian q/k/v, a shuffled block table whose slots holding no live position (and one
table entry past the live length) are fp16 NaN, the output poisoned with NaN.

Tolerances (max abs error, unit = std max(1, std²) as in test_attention.py), per cache dtype:
  fp16, vs attention_ref on the fp16 K/V the cache holds: 4e-3 unit (Q·scale and P rounded to
  fp16 as mma operands: ~2.4e-4 relative each, on scores of std up to std² and on the V sum);
  vs attention_ref on the float32 K/V before caching: 8e-3 unit (plus the cache's fp16 rounding);
  bf16 (a bf16 cache; Q and P rounded to bf16, 8x fp16's unit roundoff): 3.2e-2 and 6.4e-2 unit.
"""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.attention import attention_wgmma
from impnb.kernels.attention.attention import attention_ref
from impnb.kernels.attention.attention_fa2 import DEFAULT_TILING, TILINGS, attention_fa2
from impnb.kernels.attention.attention_fa2_decode import attention_fa2_decode, decode_splits
from impnb.kernels.attention.kv_cache import bf16_bits, bf16_values, kv_gather_ref
from tests.gpu.test_attention import gauss, paged_cache

pytestmark = pytest.mark.gpu

TOL = {"f16": (4e-3, 8e-3), "bf16": (3.2e-2, 6.4e-2)}  # (vs the cached K/V, vs float32 K/V)


def check_fa2(rng, pos0, T, H, Hkv, D, std, window=None, softcap=None, page_size=32, causal=True,
              tiling=DEFAULT_TILING, kv="f16", splits=None):
    """T queries at pos0 .. pos0 + T - 1 over keys 0 .. pos0 + T - 1 from the cache; causal=False
    puts every query at the last position (each sees all pos0 + T keys). tiling: a TILINGS key
    of attention_fa2, or "wg" for attention_wgmma; kv: the cache's type, f16 or bf16; splits: the
    decode form (attention_fa2_decode, T = 1) in that many splits, its partials poisoned too."""
    L = pos0 + T
    k_pool, v_pool, block_table, ks, vs = paged_cache(rng, [L], Hkv, D, page_size, std)
    if kv == "bf16":  # the same NaN-poisoned pages, the live rows rounded from float32 to bf16
        p = np.arange(L)
        slots = block_table[0][p // page_size], p % page_size
        k_pool, v_pool = bf16_bits(k_pool.astype(np.float32)), bf16_bits(v_pool.astype(np.float32))
        k_pool[slots], v_pool[slots] = bf16_bits(ks[0]), bf16_bits(vs[0])
    q = gauss(rng, (T, H, D), std)
    pos = np.arange(pos0, L, dtype=np.int32) if causal else np.full(T, L - 1, np.int32)
    scale = D ** -0.5
    out = np.full(q.shape, np.nan, np.float32)
    stream = cuda.stream()
    dev = [cuda.to_device(a, stream=stream) for a in (q, k_pool, v_pool, block_table[0], pos, out)]
    if splits is not None:
        assert T == 1
        partials = cuda.to_device(np.full((splits + 1, 1, H, D + 2), np.nan, np.float32), stream=stream)
        attention_fa2_decode(*dev, partials, splits, scale, window, softcap, stream, tiling)
    elif tiling == "wg":
        attention_wgmma.attention_wgmma(*dev, scale, window, softcap, stream)
    else:
        attention_fa2(*dev, scale, window, softcap, stream, tiling)
    got = dev[5].copy_to_host(stream=stream)
    stream.synchronize()
    what = f"{kv} fa2[{tiling}{'' if splits is None else f' decode/{splits}'}] pos0={pos0} T={T} H={H}/{Hkv} D={D} std={std} window={window} softcap={softcap}"
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    k16, v16 = kv_gather_ref(k_pool, block_table[0], L), kv_gather_ref(v_pool, block_table[0], L)
    if kv == "bf16":
        k16, v16 = bf16_values(k16), bf16_values(v16)
    unit = std * max(1.0, std * std)
    err16 = np.abs(got - attention_ref(q, k16, v16, pos, scale, window, softcap)).max()
    err32 = np.abs(got - attention_ref(q, ks[0], vs[0], pos, scale, window, softcap)).max()
    tol16, tol32 = TOL[kv]
    print(f"{what}: {err16 / unit:.2e} / {err32 / unit:.2e} unit")
    assert err16 <= tol16 * unit, f"{what}: {err16:.3e} from the cached-K/V reference"
    assert err32 <= tol32 * unit, f"{what}: {err32:.3e} from the float32-K/V reference"
    return err16 / unit


# (H, Hkv, D, window): GQA 1, 3, 4, 8; Gemma3 local layers (D 256, window 512)
SHAPES = [(4, 4, 64, None), (9, 3, 64, None), (8, 2, 128, None), (32, 4, 128, None),
          (4, 1, 256, 512), (8, 1, 256, None)]
STDS = (0.1, 1.0, 3.0)


def _seed(*xs):
    return np.random.default_rng([int(x * 10) if isinstance(x, float) else int(x or 0) for x in xs])


@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("pos0,T", [(0, 1), (0, 17), (0, 255), (0, 1000), (17, 255), (1000, 17)])
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_fa2(H, Hkv, D, window, pos0, T, std):
    check_fa2(_seed(H, D, pos0, T, std), pos0, T, H, Hkv, D, std, window, page_size=16 + 16 * (T % 2))


@pytest.mark.parametrize("D", (64, 128, 256))
def test_fa2_long(D):
    """A 4097-token prompt: 65 query tiles, the last of one row; window on D 256."""
    check_fa2(_seed(D, 4097), 0, 4097, 8, 2, D, 1.0, 512 if D == 256 else None)


@pytest.mark.parametrize("window", (None, 100))
@pytest.mark.parametrize("D", (64, 128, 256))
def test_fa2_softcap(D, window):
    check_fa2(_seed(D, window), 300, 140, 4, 1, D, 3.0, window, softcap=20.0)


@pytest.mark.parametrize("D", (64, 128, 256))
def test_fa2_not_causal(D):
    check_fa2(_seed(D, 7), 0, 333, 4, 4, D, 1.0, causal=False)


@pytest.mark.parametrize("pos0,T,window", [(500, 64, 1), (500, 100, 63), (37, 200, 64)])
def test_fa2_window_edges(pos0, T, window):
    """Windows of one key and of a tile width, across page and tile edges."""
    check_fa2(_seed(pos0, T, window), pos0, T, 4, 2, 128, 1.0, window)


@pytest.mark.parametrize("tiling", sorted(TILINGS))
@pytest.mark.parametrize("D", (64, 128, 256))
def test_fa2_tilings(D, tiling):
    """Every tiling: a 1000-token chunk after 300 cached keys, GQA 2, window and softcap."""
    check_fa2(_seed(D, 1000), 300, 1000, 4, 2, D, 1.0, None, None, tiling=tiling)
    check_fa2(_seed(D, 77), 300, 200, 4, 2, D, 1.0, 100, 20.0, page_size=16, tiling=tiling)


# -- head dim 512 (Gemma 4's global layers: 16 query heads, 2 KV heads), blocks in 256-dim output
# slices: prompt chunks of 1 to 700 rows after up to 1300 cached keys, with and without a window,
# both cache types --
@pytest.mark.parametrize("kv", ("f16", "bf16"))
@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("pos0,T", [(0, 1), (0, 17), (0, 700), (17, 255), (1000, 17), (1300, 700)])
@pytest.mark.parametrize("window", (None, 300))
def test_fa2_d512(window, pos0, T, std, kv):
    check_fa2(_seed(512, pos0, T, std, window, 16 if kv == "bf16" else 0), pos0, T, 16, 2, 512, std, window,
              page_size=16 + 16 * (T % 2), kv=kv)


@pytest.mark.parametrize("kv", ("f16", "bf16"))
def test_fa2_d512_softcap_not_causal_gqa(kv):
    """Softcap with a window, every query at the last position, GQA 1 and 8, windows of one key
    and of a tile width."""
    check_fa2(_seed(512, 100, 16 if kv == "bf16" else 0), 300, 140, 4, 1, 512, 3.0, 100, softcap=20.0, kv=kv)
    check_fa2(_seed(512, 7), 0, 333, 4, 4, 512, 1.0, causal=False, kv=kv)
    check_fa2(_seed(512, 8), 999, 1, 8, 1, 512, 1.0, kv=kv)
    for pos0, T, window in [(500, 64, 1), (500, 100, 32), (37, 200, 33)]:
        check_fa2(_seed(pos0, T, window), pos0, T, 4, 2, 512, 1.0, window, kv=kv)


# -- the wgmma kernel (head dims 64 and 128): the cases above at its head dims --
WG_SHAPES = [sh for sh in SHAPES if sh[2] in attention_wgmma.HEAD_DIMS] + [(8, 8, 128, 200), (12, 4, 64, 77)]


@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("pos0,T", [(0, 1), (0, 17), (0, 255), (0, 1000), (17, 255), (1000, 17), (130, 300)])
@pytest.mark.parametrize("H,Hkv,D,window", WG_SHAPES)
def test_wgmma(H, Hkv, D, window, pos0, T, std):
    check_fa2(_seed(H, D, pos0, T, std), pos0, T, H, Hkv, D, std, window, page_size=16 + 16 * (T % 2),
              tiling="wg")


@pytest.mark.parametrize("D", attention_wgmma.HEAD_DIMS)
def test_wgmma_long_softcap_not_causal(D):
    """A 4097-token prompt (33 query tiles, the last of one row), softcap with and without a
    window, every query at the last position, windows of one key and of a tile width."""
    check_fa2(_seed(D, 4097), 0, 4097, 8, 2, D, 1.0, tiling="wg")
    check_fa2(_seed(D, 20), 300, 140, 4, 1, D, 3.0, None, softcap=20.0, tiling="wg")
    check_fa2(_seed(D, 100), 300, 140, 4, 1, D, 3.0, 100, softcap=20.0, tiling="wg")
    check_fa2(_seed(D, 7), 0, 333, 4, 4, D, 1.0, causal=False, tiling="wg")
    for pos0, T, window in [(500, 64, 1), (500, 100, 128), (37, 200, 129)]:
        check_fa2(_seed(pos0, T, window), pos0, T, 4, 2, D, 1.0, window, tiling="wg")


# -- a bf16 cache: both kernels, every head dim, GQA, window, softcap, odd lengths --
BF16_CASES = [(*sh, DEFAULT_TILING) for sh in SHAPES] + [(*sh, "wg") for sh in WG_SHAPES]


@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("pos0,T", [(0, 17), (0, 1000), (130, 300), (1000, 17)])
@pytest.mark.parametrize("H,Hkv,D,window,tiling", BF16_CASES)
def test_bf16(H, Hkv, D, window, pos0, T, std, tiling):
    check_fa2(_seed(H, D, pos0, T, std, 16), pos0, T, H, Hkv, D, std, window, page_size=16 + 16 * (T % 2),
              tiling=tiling, kv="bf16")


@pytest.mark.parametrize("D,tiling", [(D, DEFAULT_TILING) for D in (64, 128, 256)]
                         + [(D, "wg") for D in attention_wgmma.HEAD_DIMS])
def test_bf16_long_softcap_not_causal(D, tiling):
    """A 4097-token prompt; softcap with a window; every query at the last position."""
    check_fa2(_seed(D, 4097, 16), 0, 4097, 8, 2, D, 1.0, 512 if D == 256 else None, tiling=tiling, kv="bf16")
    check_fa2(_seed(D, 100, 16), 300, 140, 4, 1, D, 3.0, 100, softcap=20.0, tiling=tiling, kv="bf16")
    check_fa2(_seed(D, 7, 16), 0, 333, 4, 4, D, 1.0, causal=False, tiling=tiling, kv="bf16")


# -- the decode form (attention_fa2_decode): one token, a block's rows the query heads of a KV head,
# the keys in splits merged by attention_wide's merge kernel. Gemma 4's sliding layers (16 heads on
# 8 KV heads of 256, window 1024) and global ones (16 on 2 of 512); Gemma3's (4 on 1, window 512) --
DECODE_SHAPES = [(16, 8, 256, 1024), (16, 2, 512, None), (4, 1, 256, 512), (8, 8, 256, None)]


@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("L", (1, 31, 33, 700, 1025, 4097))
@pytest.mark.parametrize("H,Hkv,D,window", DECODE_SHAPES)
def test_fa2_decode(H, Hkv, D, window, L, std):
    """A token at position L - 1 in the split count decode_splits gives its context bucket, one
    split, and more splits than the tiles (empty splits)."""
    keys = min(L, window or L)
    for splits in sorted({decode_splits(max(keys, 256), Hkv, D), 1, -(-keys // 32) + 2}):
        check_fa2(_seed(H, D, L, std, splits), L - 1, 1, H, Hkv, D, std, window, page_size=16 + 16 * (L % 2),
                  splits=min(splits, 128))


@pytest.mark.parametrize("kv", ("f16", "bf16"))
@pytest.mark.parametrize("D", (256, 512))
def test_fa2_decode_softcap_long(D, kv):
    """Softcap with and without a window, a bf16 cache, 9000 keys."""
    check_fa2(_seed(D, 9000), 8999, 1, 16, 2, D, 1.0, None, softcap=20.0, kv=kv, splits=33)
    check_fa2(_seed(D, 300), 2999, 1, 8, 1, D, 3.0, 1000, softcap=20.0, kv=kv, splits=17)
