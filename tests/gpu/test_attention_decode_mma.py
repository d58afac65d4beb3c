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
from impnb.kernels.attention.attention_decode_mma import (WARPS, Post, attention_decode_mma, layouts, num_splits,
                                                          partials_shape)
from impnb.kernels.attention.kv_cache import kv_gather_ref, kv_write_ref
from impnb.kernels.attention.reference import rope_ref
from impnb.kernels.attention.rope import rope_inv_freq
from impnb.kernels.elementwise.reference import rms_norm_ref
from impnb.kernels.gemv.quant_x import GROUP, QuantX, quantize_x_ref
from tests.gpu.test_attention import gauss, paged_cache
from tests.gpu.test_attention_fa2 import TOL

pytestmark = pytest.mark.gpu


def check_mma(rng, lengths, H, Hkv, D, std, window=None, softcap=None, page_size=32, n_splits=None, stages=None,
              quant=False, warps=WARPS, post=None):
    """Sequence b's token at position lengths[b] - 1 over its keys 0 .. lengths[b] - 1; n_splits
    default num_splits' for the longest; stages: the warps' ring depth (the kernel's default), warps
    a block's; quant:
    the output's int8 form too (one split), poisoned first, equal bit for bit to quantize_x's of the
    output the kernel wrote. post (neox, QK-norm, rotated dims[, split-K partials, V among them]):
    qkv_post in front, the token's own K and V rows poisoned in the pools (post_case)."""
    B = len(lengths)
    k_pool, v_pool, table, ks, vs = paged_cache(rng, lengths, Hkv, D, page_size, std)
    q = gauss(rng, (B, 1, H, D), std)
    pos = np.array([[L - 1] for L in lengths], np.int32)
    n_splits = n_splits or num_splits(max(lengths), Hkv, B, window)
    scale = D ** -0.5
    stream = cuda.stream()
    fused = None
    if post is not None:
        q, k_pool, v_pool, ks, vs, fused, check_pools = post_case(rng, post, q, k_pool, v_pool, table, ks, vs, pos, std,
                                                                  stream)
    dev = [cuda.to_device(a, stream=stream) for a in
           (q, k_pool, v_pool, table, pos, np.full(q.shape, np.nan, np.float32),
            np.full(partials_shape(n_splits + 1, B, H, D), np.nan, np.float32))]
    xq = None
    if quant:
        xq = QuantX(cuda.to_device(np.full((B, H * D // 4), 0xDEADBEEF, np.uint32), stream=stream),
                    *(cuda.to_device(np.full((B, H * D // GROUP), np.nan, np.float32), stream=stream) for _ in "ds"))
    attention_decode_mma(*dev, n_splits, scale, window, softcap, stream, stages=stages, xq=xq, warps=warps,
                         post=fused)
    got = dev[5].copy_to_host(stream=stream)
    stream.synchronize()
    if post is not None:
        q, k_pool, v_pool = check_pools(dev[0].copy_to_host(), dev[1].copy_to_host(), dev[2].copy_to_host())
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


def post_case(rng, post, q_raw, k_pool, v_pool, table, ks, vs, pos, std, stream):
    """qkv_post's inputs for check_mma: the fresh K and V rows Gaussian, QK-norm weights Gaussian
    around 1, the token's row NaN in both pools; with n_parts, q, k (and v with v_in_parts) come as
    Gaussian split-K partials, their arrays NaN -> (q as given, the pools poisoned there, the float32
    K/V with the fresh rows as the reference has them, Post on the device, check_pools). check_pools
    (q, k_pool, v_pool after the kernel) asserts q unchanged, the fresh K row within one fp16 ulp of
    norm -> RoPE's (qkv_post's reference), the V row its fp16 rounding, every other slot as it was,
    and returns (the reference's rotated q, the pools as the reference has them)."""
    neox, norm, n_rot, n_parts, v_in_parts = (*post, 0, True)[:5]
    B, _, H, D = q_raw.shape
    Hkv = k_pool.shape[2]
    k_new, v_new = gauss(rng, (B, 1, Hkv, D), std), gauss(rng, (B, 1, Hkv, D), std)
    parts = None
    if n_parts:  # the GEMM's split-K partials, [Q | K | V] columns; the rows are their float32 sum in split order
        cols = [q_raw.reshape(B, H * D), k_new.reshape(B, Hkv * D)] + ([v_new.reshape(B, Hkv * D)] if v_in_parts else [])
        parts = gauss(rng, (n_parts, B, sum(c.shape[1] for c in cols)), std)
        total = parts[0].copy()
        for i in range(1, n_parts):
            total += parts[i]
        at = 0
        for c in cols:
            c[:] = total[:, at:at + c.shape[1]]
            at += c.shape[1]
    qn, kn = ((1 + 0.3 * rng.standard_normal(D)).astype(np.float32) for _ in "qk") if norm else (None, None)
    inv_freq = rope_inv_freq(n_rot, 10000.0)
    p = pos[:, 0]
    want_q = rms_norm_ref(q_raw[:, 0], qn, 1e-6) if norm else q_raw[:, 0]
    want_k = rms_norm_ref(k_new[:, 0], kn, 1e-6) if norm else k_new[:, 0]
    want_q = rope_ref(want_q, p, 10000.0, neox, n_rot)[:, None]
    want_k = rope_ref(want_k, p, 10000.0, neox, n_rot)[:, None]
    k_want, v_want = k_pool.copy(), v_pool.copy()
    kv_write_ref(k_want, v_want, table, want_k, v_new, pos)
    poisoned_k, poisoned_v = k_pool.copy(), v_pool.copy()
    kv_write_ref(poisoned_k, poisoned_v, table, np.full_like(want_k, np.nan), np.full_like(v_new, np.nan), pos)
    ks = [np.concatenate([kb[:-1], want_k[b]]) for b, kb in enumerate(ks)]
    vs = [np.concatenate([vb[:-1], v_new[b]]) for b, vb in enumerate(vs)]
    dev = lambda a: None if a is None else cuda.to_device(a, stream=stream)  # noqa: E731
    q_given = q_raw if parts is None else np.full_like(q_raw, np.nan)  # from the partials: q, k (and v) unread
    k_given = k_new if parts is None else np.full_like(k_new, np.nan)
    v_given = v_new if parts is None or not v_in_parts else np.full_like(v_new, np.nan)
    fused = Post(dev(k_given), dev(v_given), dev(inv_freq), neox, dev(qn), dev(kn), 1e-6, dev(parts), v_in_parts)

    def check_pools(got_q, got_k, got_v):
        assert np.array_equal(got_q, q_given, equal_nan=True), "q changed"
        assert np.array_equal(got_v, v_want, equal_nan=True), "V pool: the fresh row or another slot differs"
        assert np.array_equal(np.isnan(got_k), np.isnan(k_want)), "K pool: NaN where the reference has none"
        kr, kg = np.nan_to_num(k_want.astype(np.float32)), np.nan_to_num(got_k.astype(np.float32))
        ulp = np.spacing(np.abs(kr).astype(np.float16)).astype(np.float32)
        assert (np.abs(kg - kr) <= ulp).all(), "K pool: the fresh row past one fp16 ulp of the reference's"
        return want_q, k_want, v_want

    return q_given, poisoned_k, poisoned_v, ks, vs, fused, check_pools


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


@pytest.mark.parametrize("std", (0.1, 1.0, 3.0))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
@pytest.mark.parametrize("neox,norm,rot", [(True, True, 1.0), (False, False, 0.5)])
def test_post(H, Hkv, D, window, std, neox, norm, rot):
    """qkv_post in front (a batch's decode without its launch): every layout, one split with the int8
    output and three splits (the fresh key in the last), QK-norm and NeoX or adjacent pairs over
    part of the dims, a sequence whose one key is the fresh one."""
    lengths = [1, 17, 130, 255, 700, 64, 33]
    for stages, warps in layouts(D):
        check_mma(_seed(H, D, std, stages, warps, rot), lengths, H, Hkv, D, std, window, n_splits=1, stages=stages,
                  quant=True, warps=warps, post=(neox, norm, int(D * rot)))
    check_mma(_seed(H, D, std, 3, rot), lengths, H, Hkv, D, std, window, n_splits=3, post=(neox, norm, int(D * rot)))


@pytest.mark.parametrize("n_parts,v_in_parts", [(1, True), (3, False), (8, True), (11, True), (19, False)])
@pytest.mark.parametrize("H,Hkv,D,window", [(32, 8, 128, None), (32, 4, 128, None), (9, 3, 64, None), (8, 2, 64, 100)])
def test_post_from_partials(H, Hkv, D, window, n_parts, v_in_parts):
    """qkv_post in front, Q|K|V from a split-K GEMM's partial products (one split, chunks of
    PART_CHUNK and past them; V among them or whole), in one split with the int8 output and in two."""
    lengths = [1, 17, 130, 255, 700, 64, 33]
    for stages, warps in layouts(D):
        check_mma(_seed(H, D, n_parts, stages, warps), lengths, H, Hkv, D, 1.0, window, n_splits=1, stages=stages,
                  quant=True, warps=warps, post=(True, True, D, n_parts, v_in_parts))
    check_mma(_seed(H, D, n_parts, 2), lengths, H, Hkv, D, 3.0, window, n_splits=2,
              post=(False, True, D // 2, n_parts, v_in_parts))
