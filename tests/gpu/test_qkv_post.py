"""The fused QK-norm + RoPE + KV write against rms_norm_ref -> rope_ref -> kv_write_ref.

Gaussian q/k/v at std 0.1, 1, 10 (norm weights Gaussian around 1), positions across pages with
a shuffled block table, NeoX and adjacent-pair layouts, partial rotary, padding (pos -1).
The same work as the Q|K|V GEMV's tail (gemv_tail.py) on the GEMV's own outputs.
Tolerance: float32 rounding of the norm and rotation, 2e-6 relative to the head's max for q;
k and v exact to fp16 rounding of the same values (one ulp).
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.kv_cache import kv_write_ref, pool_shape
from impnb.kernels.norm import rms_norm_ref
from impnb.kernels.qkv_post import qkv_post
from impnb.kernels.rope import rope_inv_freq, rope_ref

pytestmark = pytest.mark.gpu


def check_qkv_post(rng, T, H, Hkv, D, n_rot, neox, norm, std, page_size=16, base=10000.0, ggml_type=None):
    """qkv_post on Gaussian q, k, v; with ggml_type, q|k|v come from a Q|K|V GEMV of that type on a
    Gaussian x and the work is the GEMV's tail (gemv.gemv_split_post), checked on the GEMV's
    own outputs (gemv_split, the same kernel body without the tail: k and v must equal them)."""
    q, k, v = ((rng.standard_normal((T, n, D)) * std).astype(np.float32) for n in (H, Hkv, Hkv))
    pos = (np.arange(T) + rng.integers(0, 40)).astype(np.int32)
    if T > 2:
        pos[1] = -1  # padding: no cache write
    n_pages = (int(pos.max()) + 1 + page_size - 1) // page_size + 2
    table = rng.permutation(n_pages).astype(np.int32)
    qn = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norm else None
    kn = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norm else None
    inv_freq = rope_inv_freq(n_rot, base)
    stream = cuda.stream()
    dev = lambda a: None if a is None else cuda.to_device(a, stream=stream)  # noqa: E731
    if ggml_type is not None:
        w, d_x, q, k, v = _qkv_gemv(rng, ggml_type, T, H, Hkv, D, std, stream)

    want_q, want_k = (rms_norm_ref(q, qn, 1e-6), rms_norm_ref(k, kn, 1e-6)) if norm else (q, k)
    want_q = rope_ref(want_q, pos, base, neox, n_rot)  # a padded query rotates by -1: unread
    want_k = rope_ref(want_k, pos, base, neox, n_rot)
    k_ref = np.full(pool_shape(n_pages, page_size, Hkv, D), np.nan, np.float16)
    v_ref = k_ref.copy()
    kv_write_ref(k_ref, v_ref, table[None], want_k[None], v[None], pos[None])

    d_kp = cuda.to_device(np.full_like(k_ref, np.nan), stream=stream)
    d_vp = cuda.to_device(np.full_like(v_ref, np.nan), stream=stream)
    args = (dev(pos), dev(inv_freq), neox, dev(qn), dev(kn), 1e-6, dev(table), d_kp, d_vp)
    if ggml_type is None:
        d_q, d_k, d_v = dev(q), dev(k), dev(v)
        qkv_post(d_q, d_k, d_v, *args, stream)
    else:
        from impnb.kernels.gemv import gemv_split_post
        from impnb.kernels.gemv_tail import QkvPost

        d_q, d_k, d_v = (cuda.to_device(np.full(a.shape, np.nan, np.float32), stream=stream) for a in (q, k, v))
        counter = cuda.to_device(np.zeros(1, np.uint32), stream=stream)
        ys = [a.reshape(T, -1) for a in (d_q, d_k, d_v)]
        gemv_split_post(w, d_x, ys, QkvPost(d_q, d_k, d_v, *args, counter), stream)
        assert np.array_equal(d_k.copy_to_host(stream=stream), k)
        assert np.array_equal(d_v.copy_to_host(stream=stream), v)
        assert counter.copy_to_host(stream=stream)[0] == 0
    got_q, got_k, got_v = (d.copy_to_host(stream=stream) for d in (d_q, d_kp, d_vp))
    stream.synchronize()
    scale = np.abs(want_q).max(axis=-1, keepdims=True)
    assert (np.abs(got_q - want_q) <= 2e-6 * scale + 1e-30).all()
    assert np.array_equal(np.isnan(got_v), np.isnan(v_ref)) and np.array_equal(got_v, v_ref, equal_nan=True)
    assert np.array_equal(np.isnan(got_k), np.isnan(k_ref))
    kr, kg = k_ref.astype(np.float32), got_k.astype(np.float32)
    ulp = np.spacing(np.abs(np.nan_to_num(kr)).astype(np.float16)).astype(np.float32)
    assert (np.abs(np.nan_to_num(kg - kr)) <= ulp).all()


def _qkv_gemv(rng, ggml_type, T, H, Hkv, D, std, stream):
    """A random Q|K|V weight (K 256 columns a head, odd enough), x, and the plain GEMV's q, k, v."""
    from impnb.kernels.gemv import gemv_split
    from impnb.kernels.repack import repack
    from tests.test_repack import make_weight

    K = 768
    w = repack(make_weight(ggml_type, (H + 2 * Hkv) * D, K, rng), ggml_type).to_device(stream)
    d_x = cuda.to_device((rng.standard_normal((T, K)) * std).astype(np.float32), stream=stream)
    ys = [cuda.to_device(np.full((T, n * D), np.nan, np.float32), stream=stream) for n in (H, Hkv, Hkv)]
    gemv_split(w, d_x, ys, stream)
    q, k, v = (y.copy_to_host(stream=stream).reshape(T, n, D) for y, n in zip(ys, (H, Hkv, Hkv)))
    stream.synchronize()
    return w, d_x, q, k, v


@pytest.mark.parametrize("T,H,Hkv,D,n_rot,neox,norm", [
    (1, 9, 3, 64, 64, False, False),      # SmolLM2 decode
    (1, 4, 1, 256, 256, True, True),      # Gemma3 decode
    (5, 16, 8, 128, 128, True, True),     # qwen3-style, a chunk with padding
    (3, 8, 2, 128, 64, True, False),      # partial rotary
    (7, 6, 3, 64, 32, False, True),       # partial rotary, adjacent pairs
])
def test_qkv_post(T, H, Hkv, D, n_rot, neox, norm):
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_qkv_post(np.random.default_rng([T, H, D, i]), T, H, Hkv, D, n_rot, neox, norm, std)


@pytest.mark.parametrize("ggml_type", [T.Q5_0, T.Q4_K, T.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("T_,H,Hkv,D,n_rot,neox,norm", [
    (1, 4, 1, 256, 256, True, True),      # Gemma3 decode
    (1, 32, 4, 128, 128, True, True),     # Qwen3-30B-A3B decode: 40 heads over the block's 4 warps
    (3, 9, 3, 64, 64, False, False),      # SmolLM2's shape, three tokens
    (8, 6, 3, 64, 32, False, True),       # eight tokens, partial rotary, adjacent pairs, padding
])
def test_qkv_post_gemv_tail(ggml_type, T_, H, Hkv, D, n_rot, neox, norm):
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_qkv_post(np.random.default_rng([T_, H, D, i, 1]), T_, H, Hkv, D, n_rot, neox, norm, std,
                       ggml_type=ggml_type)


def test_qkv_post_gemv_tail_v_only():
    """The tail on attn_v's GEMV alone (q and k from earlier kernels: Gemma3's layers whose V type
    differs from Q and K): q, k in place from the host, v from the GEMV."""
    from impnb.kernels.gemv import gemv_split, gemv_split_post
    from impnb.kernels.gemv_tail import QkvPost
    from impnb.kernels.repack import repack
    from tests.test_repack import make_weight

    rng = np.random.default_rng(11)
    H, Hkv, D, Tn, K, page_size = 4, 1, 256, 2, 640, 16
    w = repack(make_weight(T.Q8_0, Hkv * D, K, rng), T.Q8_0).to_device()
    x = rng.standard_normal((Tn, K)).astype(np.float32)
    q = rng.standard_normal((Tn, H, D)).astype(np.float32)
    k = rng.standard_normal((Tn, Hkv, D)).astype(np.float32)
    pos = np.array([37, 38], np.int32)
    table = rng.permutation(4).astype(np.int32)
    qn, kn = ((1 + 0.3 * rng.standard_normal(D)).astype(np.float32) for _ in range(2))
    inv_freq = rope_inv_freq(D, 1e6)
    d_v = cuda.to_device(np.full((Tn, Hkv * D), np.nan, np.float32))
    gemv_split(w, cuda.to_device(x), [d_v], 0)
    v = d_v.copy_to_host().reshape(Tn, Hkv, D)

    k_ref = np.full(pool_shape(4, page_size, Hkv, D), np.nan, np.float16)
    v_ref = k_ref.copy()
    want_q = rope_ref(rms_norm_ref(q, qn, 1e-6), pos, 1e6, True, D)
    kv_write_ref(k_ref, v_ref, table[None], rope_ref(rms_norm_ref(k, kn, 1e-6), pos, 1e6, True, D)[None],
                 v[None], pos[None])
    d_q, d_k = cuda.to_device(q), cuda.to_device(k)
    d_v = cuda.to_device(np.full((Tn, Hkv, D), np.nan, np.float32))
    d_kp, d_vp = cuda.to_device(np.full_like(k_ref, np.nan)), cuda.to_device(np.full_like(v_ref, np.nan))
    counter = cuda.to_device(np.zeros(1, np.uint32))
    post = QkvPost(d_q, d_k, d_v, cuda.to_device(pos), cuda.to_device(inv_freq), True, cuda.to_device(qn),
                   cuda.to_device(kn), 1e-6, cuda.to_device(table), d_kp, d_vp, counter)
    gemv_split_post(w, cuda.to_device(x), [d_v.reshape(Tn, Hkv * D)], post, 0)
    got_q, got_k, got_v = d_q.copy_to_host(), d_kp.copy_to_host(), d_vp.copy_to_host()
    assert (np.abs(got_q - want_q) <= 2e-6 * np.abs(want_q).max(axis=-1, keepdims=True)).all()
    assert np.array_equal(got_v, v_ref, equal_nan=True)
    kr = k_ref.astype(np.float32)
    ulp = np.spacing(np.abs(np.nan_to_num(kr)).astype(np.float16)).astype(np.float32)
    assert np.array_equal(np.isnan(got_k), np.isnan(k_ref))
    assert (np.abs(np.nan_to_num(got_k.astype(np.float32) - kr)) <= ulp).all()
    assert counter.copy_to_host()[0] == 0
