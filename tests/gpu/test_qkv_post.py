"""The fused QK-norm + RoPE + KV write against rms_norm_ref -> rope_ref -> kv_write_ref.

Gaussian q/k/v at std 0.1, 1, 10 (norm weights Gaussian around 1), positions across pages with
a shuffled block table (B sequences: rows sequence by sequence, each its own positions and pages), NeoX and adjacent-pair layouts, partial rotary, padding (pos -1).
Tolerance: float32 rounding of the norm and rotation, 2e-6 relative to the head's max for q;
k and v exact to fp16 rounding of the same values (one ulp).
"""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.attention.kv_cache import kv_write_ref, pool_shape
from impnb.kernels.elementwise.norm import rms_norm_ref
from impnb.kernels.attention.qkv_post import qkv_post
from impnb.kernels.attention.rope import rope_inv_freq, rope_ref

pytestmark = pytest.mark.gpu


def check_qkv_post(rng, T, H, Hkv, D, n_rot, neox, norm, std, page_size=16, base=10000.0, B=1):
    R = B * T
    q = (rng.standard_normal((R, H, D)) * std).astype(np.float32)
    k = (rng.standard_normal((R, Hkv, D)) * std).astype(np.float32)
    v = (rng.standard_normal((R, Hkv, D)) * std).astype(np.float32)
    pos = (np.arange(T)[None] + rng.integers(0, 40, (B, 1))).astype(np.int32).reshape(R)
    if T > 2:
        pos[1] = -1  # padding: no cache write
    pages = (int(pos.max()) + 1 + page_size - 1) // page_size + 2  # a sequence's
    n_pages = B * pages
    table = rng.permutation(n_pages).astype(np.int32).reshape(B, pages)
    qn = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norm else None
    kn = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norm else None
    inv_freq = rope_inv_freq(n_rot, base)

    want_q, want_k = (rms_norm_ref(q, qn, 1e-6), rms_norm_ref(k, kn, 1e-6)) if norm else (q, k)
    want_q = rope_ref(want_q, pos, base, neox, n_rot)  # a padded query rotates by -1: unread
    want_k = rope_ref(want_k, pos, base, neox, n_rot)
    k_ref = np.full(pool_shape(n_pages, page_size, Hkv, D), np.nan, np.float16)
    v_ref = k_ref.copy()
    kv_write_ref(k_ref, v_ref, table, want_k.reshape(B, T, Hkv, D), v.reshape(B, T, Hkv, D), pos.reshape(B, T))

    stream = cuda.stream()
    d_q = cuda.to_device(q, stream=stream)
    d_kp = cuda.to_device(np.full_like(k_ref, np.nan), stream=stream)
    d_vp = cuda.to_device(np.full_like(v_ref, np.nan), stream=stream)
    dev = lambda a: None if a is None else cuda.to_device(a, stream=stream)  # noqa: E731
    qkv_post(d_q, dev(k), dev(v), dev(pos), dev(inv_freq), neox, dev(qn), dev(kn), 1e-6,
             dev(table[0] if B == 1 else table), d_kp, d_vp, stream)
    got_q, got_k, got_v = (d.copy_to_host(stream=stream) for d in (d_q, d_kp, d_vp))
    stream.synchronize()
    scale = np.abs(want_q).max(axis=-1, keepdims=True)
    assert (np.abs(got_q - want_q) <= 2e-6 * scale + 1e-30).all()
    assert np.array_equal(np.isnan(got_v), np.isnan(v_ref)) and np.array_equal(got_v, v_ref, equal_nan=True)
    assert np.array_equal(np.isnan(got_k), np.isnan(k_ref))
    kr, kg = k_ref.astype(np.float32), got_k.astype(np.float32)
    ulp = np.spacing(np.abs(np.nan_to_num(kr)).astype(np.float16)).astype(np.float32)
    assert (np.abs(np.nan_to_num(kg - kr)) <= ulp).all()


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


@pytest.mark.parametrize("B,T,H,Hkv,D,n_rot,neox,norm", [
    (5, 1, 9, 3, 64, 64, False, False),    # batched decode, SmolLM2 heads
    (3, 1, 4, 1, 256, 256, True, True),    # batched decode, Gemma3 heads
    (4, 3, 16, 8, 128, 128, True, True),   # three rows a sequence, padding in the first
])
def test_qkv_post_batched(B, T, H, Hkv, D, n_rot, neox, norm):
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_qkv_post(np.random.default_rng([B, T, H, D, i]), T, H, Hkv, D, n_rot, neox, norm, std, B=B)
