"""Paged KV write and decode attention on the GPU against the numpy references (prefill:
test_attention_fa2.py, which shares paged_cache).

The check_* functions run one case; tests/sim/test_attention.py runs them on tiny shapes in
the simulator. Every case: Gaussian q/k/v, a shuffled block table, pool slots that hold no live
position (including table entries past the live length) filled with fp16 NaN, outputs and
scratch poisoned with NaN.

Tolerances (max abs error, std = the q/k/v standard deviation):
  kv_write         bit-exact against kv_write_ref (float32 -> fp16 round to nearest even).
  attention        vs attention_ref (float64) on the fp16 K/V the cache holds: 1e-4 std max(1, std²)
                   (the kernels' own float32 error);
                   vs attention_ref on the float32 K/V before caching: 5e-3 std max(1, std²)
                   (fp16 rounding of K/V; measured up to 1.5e-3 std max(1, std²)).
"""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.attention.attention import attention_ref
from impnb.kernels.attention.attention_decode import attention_decode, counters_shape, num_splits, partials_shape
from impnb.kernels.attention.attention_decode_short import attention_decode_short
from impnb.kernels.attention.kv_cache import kv_gather_ref, kv_write, kv_write_ref, pages_needed
from impnb.kernels.elementwise.norm import rms_norm_ref
from impnb.kernels.gemv.quant_x import QuantX, quantize_x_ref
from impnb.kernels.attention.rope import rope_inv_freq, rope_ref

pytestmark = pytest.mark.gpu

TIGHT, LOOSE = 1e-4, 5e-3


def gauss(rng, shape, std) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def paged_cache(rng, lengths, Hkv, D, page_size, std):
    """NaN pools holding K/V for positions 0..L-1 of each sequence through a shuffled block table."""
    B = len(lengths)
    max_pages = pages_needed(max(lengths), page_size) + 1  # one table entry past every length
    n_pages = B * max_pages + 2
    block_table = rng.permutation(n_pages)[: B * max_pages].reshape(B, max_pages).astype(np.int32)
    k_pool = np.full((n_pages, page_size, Hkv, D), np.nan, np.float16)
    v_pool = np.full_like(k_pool, np.nan)
    ks, vs = [], []
    for b, L in enumerate(lengths):
        ks.append(gauss(rng, (L, Hkv, D), std))
        vs.append(gauss(rng, (L, Hkv, D), std))
        kv_write_ref(k_pool, v_pool, block_table[b], ks[b], vs[b], np.arange(L, dtype=np.int32))
    return k_pool, v_pool, block_table, ks, vs


def assert_attention(got, q, k_pool, v_pool, table_row, k32, v32, pos, scale, window, softcap, std, what):
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    L = k32.shape[0]
    k16, v16 = kv_gather_ref(k_pool, table_row, L), kv_gather_ref(v_pool, table_row, L)
    unit = std * max(1.0, std * std)
    err16 = np.abs(got - attention_ref(q, k16, v16, pos, scale, window, softcap)).max()
    err32 = np.abs(got - attention_ref(q, k32, v32, pos, scale, window, softcap)).max()
    assert err16 <= TIGHT * unit, f"{what}: {err16:.3e} from the fp16-K/V reference"
    assert err32 <= LOOSE * unit, f"{what}: {err32:.3e} from the float32-K/V reference"


# ---------------------------------------------------------------- checks

def check_kv_write(rng, B, T, Hkv, D, page_size, std=1.0):
    """T new rows at the end of B sequences of random lengths, over stale random pool contents;
    the last row of sequence 0 is padding (pos -1) and writes nothing. Whole pools compared."""
    lengths = [int(x) for x in rng.integers(T, T + 3 * page_size, B)]
    max_pages = pages_needed(max(lengths), page_size)
    n_pages = B * max_pages + 1
    block_table = rng.permutation(n_pages)[: B * max_pages].reshape(B, max_pages).astype(np.int32)
    k_pool = gauss(rng, (n_pages, page_size, Hkv, D), 1.0).astype(np.float16)
    v_pool = gauss(rng, k_pool.shape, 1.0).astype(np.float16)
    k, v = gauss(rng, (B, T, Hkv, D), std), gauss(rng, (B, T, Hkv, D), std)
    pos = np.array([[L - T + t for t in range(T)] for L in lengths], np.int32)
    pos[0, T - 1] = -1
    want_k, want_v = k_pool.copy(), v_pool.copy()
    kv_write_ref(want_k, want_v, block_table, k, v, pos)
    stream = cuda.stream()
    dev = [cuda.to_device(a, stream=stream) for a in (k, v, pos, block_table, k_pool, v_pool)]
    kv_write(*dev, stream)
    got_k, got_v = dev[4].copy_to_host(stream=stream), dev[5].copy_to_host(stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(got_k.view(np.uint16), want_k.view(np.uint16))
    np.testing.assert_array_equal(got_v.view(np.uint16), want_v.view(np.uint16))


def poisoned_xq(rows, K, stream) -> QuantX:
    """quant_x buffers of (rows, K) filled with garbage (0xffffffff words, NaN scales and sums)."""
    return QuantX(cuda.to_device(np.full((rows, K // 4), 0xFFFFFFFF, np.uint32), stream=stream),
                  cuda.to_device(np.full((rows, K // 16), np.nan, np.float32), stream=stream),
                  cuda.to_device(np.full((rows, K // 16), np.nan, np.float32), stream=stream))


def assert_quantized(xq: QuantX, out: np.ndarray) -> None:
    """The int8 form the kernel wrote is quantize_x_ref's of its output, bit for bit."""
    for got, want, name in zip((a.copy_to_host() for a in xq), quantize_x_ref(out), ("q", "d", "s")):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=name)


def check_decode(rng, lengths, T, H, Hkv, D, std, window=None, softcap=None, page_size=16,
                 n_splits=None, split_keys=None, short=False, warps=None, cluster=1, quant=False):
    """B = len(lengths) sequences, T queries each at positions L - T .. L - 1; split_keys: the
    keys a split takes at least (default the kernel's); short: attention_decode_short instead
    of the split kernel, with blocks of `warps` warps (default its own), `cluster` blocks a row;
    quant: its output's int8 form too, which must equal quantize_x_ref's of the output."""
    B = len(lengths)
    k_pool, v_pool, block_table, ks, vs = paged_cache(rng, lengths, Hkv, D, page_size, std)
    q = gauss(rng, (B, T, H, D), std)
    pos = np.array([[L - T + t for t in range(T)] for L in lengths], np.int32)
    scale = D ** -0.5
    n_splits = n_splits or num_splits(max(lengths), H, Hkv, T, B, window, head_dim=D)
    out = np.full(q.shape, np.nan, np.float32)
    partials = np.full(partials_shape(B, n_splits, T, H, D), np.nan, np.float32)
    stream = cuda.stream()
    counters = np.zeros(counters_shape(B, T, H), np.int32)
    dev = [cuda.to_device(a, stream=stream)
           for a in (q, k_pool, v_pool, block_table, pos, out, partials, counters)]
    xq = poisoned_xq(B * T, H * D, stream) if quant else None
    if short:
        attention_decode_short(*dev[:6], scale, window, softcap, stream, warps, splits=cluster, xq=xq)
    else:
        attention_decode(*dev, n_splits, scale, window, softcap, stream, split_keys=split_keys)
    got = dev[5].copy_to_host(stream=stream)
    stream.synchronize()
    if quant:
        assert_quantized(xq, got.reshape(B * T, H * D))
    for b, L in enumerate(lengths):
        assert_attention(got[b], q[b], k_pool, v_pool, block_table[b], ks[b], vs[b], pos[b], scale,
                         window, softcap, std, f"decode L={L} T={T} H={H}/{Hkv} D={D} std={std} "
                         f"{f'short cluster={cluster}' if short else f'splits={n_splits} split_keys={split_keys}'}")


def check_decode_post(rng, L, T, H, Hkv, D, std, window=None, neox=True, norm=True, n_rot=None,
                      warps=None, page_size=16, cluster=1, quant=False):
    """attention_decode_short with qkv_post fused: the step's T tokens at L - T .. L - 1 come
    raw (q, k, v Gaussian at std, QK-norm weights around 1, RoPE over n_rot dims), the keys before
    them are cached, the step's cache rows poisoned. The output is held to check_decode's bounds
    against rms_norm_ref -> rope_ref -> attention_ref, the written K within an fp16 ulp of
    rope_ref's, V exact."""
    n_rot, eps, base = n_rot or D, 1e-6, 10000.0
    k_pool, v_pool, table, ks, vs = paged_cache(rng, [L], Hkv, D, page_size, std)
    pos = np.arange(L - T, L, dtype=np.int32)
    for p in pos:
        k_pool[table[0, p // page_size], p % page_size] = np.nan
        v_pool[table[0, p // page_size], p % page_size] = np.nan
    q, k, v = gauss(rng, (T, H, D), std), gauss(rng, (T, Hkv, D), std), gauss(rng, (T, Hkv, D), std)
    qn = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norm else None
    kn = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norm else None
    inv_freq = rope_inv_freq(n_rot, base)
    want_q, want_k = (rms_norm_ref(q, qn, eps), rms_norm_ref(k, kn, eps)) if norm else (q, k)
    want_q = rope_ref(want_q, pos, base, neox, n_rot)
    want_k = rope_ref(want_k, pos, base, neox, n_rot)
    k_ref, v_ref = k_pool.copy(), v_pool.copy()
    kv_write_ref(k_ref, v_ref, table[0], want_k, v, pos)
    k32, v32 = np.concatenate([ks[0][:L - T], want_k]), np.concatenate([vs[0][:L - T], v])

    stream = cuda.stream()
    dev = lambda a: None if a is None else cuda.to_device(a, stream=stream)  # noqa: E731
    d_kp, d_vp, d_out = dev(k_pool), dev(v_pool), dev(np.full(q.shape, np.nan, np.float32))
    xq = poisoned_xq(T, H * D, stream) if quant else None
    attention_decode_short(dev(q), d_kp, d_vp, dev(table[0]), dev(pos), d_out, D ** -0.5, window,
                           None, stream, warps,
                           post=(dev(k), dev(v), dev(inv_freq), neox, dev(qn), dev(kn), eps), splits=cluster,
                           xq=xq)
    got, got_k, got_v = (d.copy_to_host(stream=stream) for d in (d_out, d_kp, d_vp))
    stream.synchronize()
    if quant:
        assert_quantized(xq, got.reshape(T, H * D))
    what = (f"decode+post L={L} T={T} H={H}/{Hkv} D={D} std={std} window={window} neox={neox} norm={norm}"
            f" cluster={cluster}")
    assert np.array_equal(got_v, v_ref, equal_nan=True), what
    assert np.array_equal(np.isnan(got_k), np.isnan(k_ref)), what
    kr, kg = k_ref.astype(np.float32), got_k.astype(np.float32)
    ulp = np.spacing(np.abs(np.nan_to_num(kr)).astype(np.float16)).astype(np.float32)
    assert (np.abs(np.nan_to_num(kg - kr)) <= ulp).all(), what
    assert_attention(got, want_q, k_ref, v_ref, table[0], k32, v32, pos, D ** -0.5, window, None,
                     std, what)


def check_decode_growing(rng, first, steps, H, Hkv, D, window, n_splits, page_size=16, std=1.0,
                         short=False):
    """One set of device buffers and launch arguments (as a captured graph holds them) while the
    context grows a token per step from `first` to `steps`: kv_write then decode (short: the
    short-context kernel), the position only on the device. Positions before `first` are cached
    up front."""
    k_all, v_all = gauss(rng, (steps, Hkv, D), std), gauss(rng, (steps, Hkv, D), std)
    k_pool, v_pool, block_table, _, _ = paged_cache(rng, [steps], Hkv, D, page_size, std)
    k_pool[:] = np.nan
    v_pool[:] = np.nan
    kv_write_ref(k_pool, v_pool, block_table[0], k_all[:first], v_all[:first],
                 np.arange(first, dtype=np.int32))
    stream = cuda.stream()
    d_k_pool, d_v_pool = cuda.to_device(k_pool, stream=stream), cuda.to_device(v_pool, stream=stream)
    d_table = cuda.to_device(block_table, stream=stream)
    d_pos = cuda.to_device(np.zeros((1, 1), np.int32), stream=stream)
    d_q = cuda.device_array((1, 1, H, D), np.float32, stream=stream)
    d_k = cuda.device_array((1, 1, Hkv, D), np.float32, stream=stream)
    d_v = cuda.device_array((1, 1, Hkv, D), np.float32, stream=stream)
    d_out = cuda.to_device(np.full((1, 1, H, D), np.nan, np.float32), stream=stream)
    d_part = cuda.to_device(np.full(partials_shape(1, n_splits, 1, H, D), np.nan, np.float32), stream=stream)
    d_counters = cuda.to_device(np.zeros(counters_shape(1, 1, H), np.int32), stream=stream)
    for p in range(first, steps):
        q = gauss(rng, (1, 1, H, D), std)
        d_pos.copy_to_device(np.array([[p]], np.int32), stream=stream)
        d_q.copy_to_device(q, stream=stream)
        d_k.copy_to_device(k_all[p].reshape(1, 1, Hkv, D), stream=stream)
        d_v.copy_to_device(v_all[p].reshape(1, 1, Hkv, D), stream=stream)
        kv_write(d_k, d_v, d_pos, d_table, d_k_pool, d_v_pool, stream)
        if short:
            attention_decode_short(d_q, d_k_pool, d_v_pool, d_table, d_pos, d_out, D ** -0.5, window,
                                   None, stream)
        else:
            attention_decode(d_q, d_k_pool, d_v_pool, d_table, d_pos, d_out, d_part, d_counters,
                             n_splits, D ** -0.5, window, None, stream)
        got = d_out.copy_to_host(stream=stream)
        kp, vp = d_k_pool.copy_to_host(stream=stream), d_v_pool.copy_to_host(stream=stream)
        stream.synchronize()
        assert_attention(got[0], q[0], kp, vp, block_table[0], k_all[: p + 1], v_all[: p + 1],
                         np.array([p]), D ** -0.5, window, None, std, f"growing step {p}")


# ---------------------------------------------------------------- GPU cases

# (H, Hkv, D, window): SmolLM2, Gemma3 local layers, 8/1 and 32/8 at D 128
SHAPES = [(9, 3, 64, None), (4, 1, 256, 512), (8, 1, 128, None), (32, 8, 128, None)]
CONTEXTS = (1, 17, 255, 1000, 4097)
STDS = (0.1, 1.0, 3.0)


def _seed(*xs):
    return np.random.default_rng([int(x * 10) if isinstance(x, float) else int(x or 0) for x in xs])


@pytest.mark.parametrize("page_size", (16, 32))
@pytest.mark.parametrize("B,T,Hkv,D", [(1, 1, 3, 64), (1, 19, 1, 256), (3, 1, 8, 128), (2, 5, 1, 128)])
def test_kv_write(B, T, Hkv, D, page_size):
    check_kv_write(_seed(B, T, Hkv, D, page_size), B, T, Hkv, D, page_size)


@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("L", CONTEXTS)
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_decode(H, Hkv, D, window, L, std):
    check_decode(_seed(H, D, L, std), [L], 1, H, Hkv, D, std, window)
    # the largest split count a graph for an 8k bucket would use: most splits idle at short L
    check_decode(_seed(H, D, L, std, 1), [L], 1, H, Hkv, D, std, window, page_size=32,
                 n_splits=num_splits(8192, H, Hkv, 1, 1, window, head_dim=D))


@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
@pytest.mark.parametrize("T", (2, 5, 8))
def test_decode_multi_token_batch(H, Hkv, D, window, T):
    check_decode(_seed(H, D, T), [T, 600, 1000], T, H, Hkv, D, 1.0, window)


@pytest.mark.parametrize("softcap", (5.0, 30.0))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_decode_softcap(H, Hkv, D, window, softcap):
    check_decode(_seed(H, D, softcap), [1000], 1, H, Hkv, D, 3.0, window, softcap)


@pytest.mark.parametrize("H,Hkv,D,window", [(9, 3, 64, None), (4, 1, 256, 40)])
def test_decode_growing_context(H, Hkv, D, window):
    check_decode_growing(_seed(H, D), 0, 70, H, Hkv, D, window, n_splits=4)


@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("L", (1, 17, 255, 1000, 4096))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_decode_short(H, Hkv, D, window, L, std):
    check_decode(_seed(H, D, L, std, 2), [L], 1, H, Hkv, D, std, window, short=True)


@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
@pytest.mark.parametrize("T", (2, 5, 8))
def test_decode_short_warps_and_tokens(H, Hkv, D, window, T):
    """Multi-token batches at every block size built for the head dim."""
    from impnb.kernels.attention.attention_decode_short import WARPS
    for nw in WARPS:
        if nw * 32 >= D:
            check_decode(_seed(H, D, T, nw), [T, 300, 700], T, H, Hkv, D, 1.0, window, short=True,
                         warps=nw)


@pytest.mark.parametrize("softcap", (5.0, 30.0))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_decode_short_softcap(H, Hkv, D, window, softcap):
    check_decode(_seed(H, D, softcap, 2), [1000], 1, H, Hkv, D, 3.0, window, softcap, short=True)


@pytest.mark.parametrize("H,Hkv,D,window", [(9, 3, 64, None), (4, 1, 256, 40)])
def test_decode_short_growing_context(H, Hkv, D, window):
    check_decode_growing(_seed(H, D, 2), 0, 70, H, Hkv, D, window, n_splits=1, short=True)


@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("L", (1, 17, 131, 1000))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_decode_short_post(H, Hkv, D, window, L, std):
    """qkv_post fused, one token: QK-norm and NeoX RoPE (qwen3, gemma3)."""
    check_decode_post(_seed(H, D, L, std, 3), L, 1, H, Hkv, D, std, window)


@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
@pytest.mark.parametrize("T,neox,norm,warps", [(1, False, False, 4), (3, True, True, 8),
                                               (8, False, True, 8)])
def test_decode_short_post_variants(H, Hkv, D, window, T, neox, norm, warps):
    """Adjacent-pair RoPE without QK-norm (llama), several tokens, partial rotary at T = 8."""
    if warps * 32 < D:
        warps = 8
    check_decode_post(_seed(H, D, T, warps, 4), 300 + T, T, H, Hkv, D, 1.0, window, neox, norm,
                      n_rot=D // 2 if T == 8 else D, warps=warps)


@pytest.mark.parametrize("post", (False, True))
@pytest.mark.parametrize("cluster,T,L", ((1, 1, 131), (2, 1, 1000), (8, 3, 300), (1, 8, 700)))
def test_decode_short_quant(post, cluster, T, L):
    """The output's int8 form beside it (Qwen3's attn_output input for dp4a): H 32 over 4 KV heads,
    D 128, with and without qkv_post fused, one block or a cluster a row, several tokens."""
    rng = _seed(T, cluster, L, post, 8)
    for std in STDS:
        if post:
            check_decode_post(rng, L, T, 32, 4, 128, std, cluster=cluster, quant=True)
        else:
            check_decode(rng, [L], T, 32, 4, 128, std, short=True, cluster=cluster, quant=True)


@pytest.mark.parametrize("post", (False, True))
@pytest.mark.parametrize("T,L", ((1, 131), (3, 300)))
def test_decode_short_quant_gemma3(post, T, L):
    """The int8 form at Gemma3-270M's heads (H 4 over 1 KV head, D 256): one sequence with
    qkv_post fused, or a batch of five at different lengths."""
    rng = _seed(T, L, post, 256)
    for std in STDS:
        if post:
            check_decode_post(rng, L, T, 4, 1, 256, std, quant=True)
        else:
            check_decode(rng, [L, 7, L + 33, 64, T], T, 4, 1, 256, std, short=True, warps=8, quant=True)


# -- the short kernel with a thread-block cluster of 2, 4 or 8 blocks a query row (key ranges
#    split, merged in distributed shared memory): contexts shorter than the cluster (empty
#    parts), odd lengths, windows, several tokens and block sizes, qkv_post fused --

@pytest.mark.parametrize("cluster", (2, 4, 8))
@pytest.mark.parametrize("L", (1, 5, 131, 1000, 4096))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_decode_short_cluster(H, Hkv, D, window, L, cluster):
    for i, std in enumerate(STDS):
        check_decode(_seed(H, D, L, cluster, i, 5), [L], 1, H, Hkv, D, std, window, short=True,
                     cluster=cluster)


@pytest.mark.parametrize("cluster", (2, 8))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_decode_short_cluster_tokens(H, Hkv, D, window, cluster):
    from impnb.kernels.attention.attention_decode_short import WARPS
    for nw in WARPS:
        if nw * 32 >= D:
            check_decode(_seed(H, D, nw, cluster, 6), [5, 300, 700], 5, H, Hkv, D, 1.0, window, short=True,
                         warps=nw, cluster=cluster)


@pytest.mark.parametrize("cluster", (2, 4, 8))
@pytest.mark.parametrize("L,T", ((1, 1), (131, 1), (300, 3), (1000, 8)))
@pytest.mark.parametrize("H,Hkv,D,window", SHAPES)
def test_decode_short_post_cluster(H, Hkv, D, window, L, T, cluster):
    check_decode_post(_seed(H, D, L, T, cluster, 7), L, T, H, Hkv, D, 1.0, window, cluster=cluster)
