"""Batched decode attention on tensor cores (attention_decode_mma) on the GPU against the numpy
reference: B sequences of different lengths, one token each, through a shuffled block table over
NaN-poisoned pools (paged_cache), output and partials poisoned with NaN; the splits merged by
attention_wide.merge_splits. tests/sim/test_attention_decode_mma.py runs check_mma on tiny shapes.

Tolerances: test_attention_fa2.py's for fp16 (Q·scale and P rounded to fp16 as mma operands).
"""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.attention.attention import attention_ref
from impnb.kernels.attention.attention_decode_mma import (WARPS, attention_decode_mma, layouts, num_splits,
                                                          partials_shape)
from impnb.kernels.attention.kv_cache import kv_gather_ref
from impnb.kernels.gemv.quant_x import GROUP, QuantX, quantize_x_ref
from tests.gpu.test_attention import gauss, paged_cache
from tests.gpu.test_attention_fa2 import TOL

pytestmark = pytest.mark.gpu


def check_mma(rng, lengths, H, Hkv, D, std, window=None, softcap=None, page_size=32, n_splits=None, stages=None,
              quant=False, warps=WARPS):
    """Sequence b's token at position lengths[b] - 1 over its keys 0 .. lengths[b] - 1; n_splits
    default num_splits' for the longest; stages: the warps' ring depth (the kernel's default), warps
    a block's; quant:
    the output's int8 form too (one split), poisoned first, equal bit for bit to quantize_x's of the
    output the kernel wrote."""
    B = len(lengths)
    k_pool, v_pool, table, ks, vs = paged_cache(rng, lengths, Hkv, D, page_size, std)
    q = gauss(rng, (B, 1, H, D), std)
    pos = np.array([[L - 1] for L in lengths], np.int32)
    n_splits = n_splits or num_splits(max(lengths), Hkv, B, window)
    scale = D ** -0.5
    stream = cuda.stream()
    dev = [cuda.to_device(a, stream=stream) for a in
           (q, k_pool, v_pool, table, pos, np.full(q.shape, np.nan, np.float32),
            np.full(partials_shape(n_splits + 1, B, H, D), np.nan, np.float32))]
    xq = None
    if quant:
        xq = QuantX(cuda.to_device(np.full((B, H * D // 4), 0xDEADBEEF, np.uint32), stream=stream),
                    *(cuda.to_device(np.full((B, H * D // GROUP), np.nan, np.float32), stream=stream) for _ in "ds"))
    attention_decode_mma(*dev, n_splits, scale, window, softcap, stream, stages=stages, xq=xq, warps=warps)
    got = dev[5].copy_to_host(stream=stream)
    stream.synchronize()
    if quant:
        for name, a, want in zip("qds", xq, quantize_x_ref(got.reshape(B, H * D))):
            assert np.array_equal(a.copy_to_host(), want), f"int8 output's {name} differs from quantize_x's"
    unit = std * max(1.0, std * std)
    tol16, tol32 = TOL["f16"]
    for b, L in enumerate(lengths):
        what = (f"mma b={b} L={L} H={H}/{Hkv} D={D} std={std} window={window} softcap={softcap} splits={n_splits} "
                f"stages={stages} warps={warps}")
        assert np.isfinite(got[b]).all(), f"{what}: non-finite output"
        k16, v16 = kv_gather_ref(k_pool, table[b], L), kv_gather_ref(v_pool, table[b], L)
        err16 = np.abs(got[b] - attention_ref(q[b], k16, v16, pos[b], scale, window, softcap)).max()
        err32 = np.abs(got[b] - attention_ref(q[b], ks[b], vs[b], pos[b], scale, window, softcap)).max()
        assert err16 <= tol16 * unit, f"{what}: {err16:.3e} from the cached-K/V reference"
        assert err32 <= tol32 * unit, f"{what}: {err32:.3e} from the float32-K/V reference"


def _seed(*xs):
    return np.random.default_rng([int(x * 10) if isinstance(x, float) else int(x or 0) for x in xs])


# (H, Hkv, D, window): the Qwen3-8B's heads, Qwen3-30B-A3B's (GQA 8), SmolLM2's (GQA 3, D 64),
# GQA 16 and 1 at D 128, a sliding window
SHAPES = [(32, 8, 128, None), (32, 4, 128, None), (9, 3, 64, None), (16, 1, 128, None), (8, 8, 128, None),
          (8, 2, 64, 100)]


@pytest.mark.parametrize("std", (0.1, 1.0, 3.0))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_batch(H, Hkv, D, window, std):
    """Sequences of 1 key to past 4k: tiles partly live at both ends, every warp's share."""
    lengths = [1, 17, 130, 255, 1000, 4097, 64, 33]
    check_mma(_seed(H, D, std), lengths, H, Hkv, D, std, window)


@pytest.mark.parametrize("std", (0.1, 1.0, 3.0))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_int8_output(H, Hkv, D, window, std):
    """One split with the output's int8 form (attn_output's dp4a input), every ring depth and block
    of warps."""
    for stages, warps in layouts(D):
        check_mma(_seed(H, D, std, stages, warps), [1, 17, 130, 255, 700, 64, 33], H, Hkv, D, std, window,
                  n_splits=1, stages=stages, quant=True, warps=warps)


@pytest.mark.parametrize("page_size", (16, 32))
@pytest.mark.parametrize("n_splits", (1, 3, 40))
def test_splits(n_splits, page_size):
    """Fixed split counts: one, a few, more than some sequences have tiles (empty splits)."""
    check_mma(_seed(n_splits, page_size), [5, 300, 2000], 32, 8, 128, 1.0, page_size=page_size, n_splits=n_splits)


@pytest.mark.parametrize("softcap", (5.0, 30.0))
def test_softcap(softcap):
    check_mma(_seed(softcap), [40, 700], 16, 4, 128, 3.0, window=300, softcap=softcap)


@pytest.mark.parametrize("D,stages,warps", [(D, st, w) for D in (64, 128) for st, w in layouts(D)])
@pytest.mark.parametrize("n_splits", (1, 3))
def test_ring_depths(D, stages, warps, n_splits):
    """Every ring depth and block of warps a launch may take (ring_plan), over sequences shorter
    and longer than a warp's ring, a window's first tile partly live, in one split and in three."""
    check_mma(_seed(D, stages, n_splits, warps), [1, 40, 129, 700, 3000], 16, 4, D, 1.0, window=None,
              n_splits=n_splits, stages=stages, warps=warps)
    check_mma(_seed(D, stages, n_splits, 1, warps), [90, 1200], 8, 2, D, 3.0, window=333, n_splits=n_splits,
              stages=stages, warps=warps)


def test_large_batch():
    """128 sequences of random lengths: the batched engine's largest bucket."""
    rng = _seed(128)
    check_mma(rng, [int(x) for x in rng.integers(1, 600, 128)], 32, 8, 128, 1.0)
