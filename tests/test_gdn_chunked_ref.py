"""The chunked numpy twin of the Gated DeltaNet prefill (reference.gdn_chunked_ref, the form
gdn_chunked.py computes) against the token-by-token one (gdn_ref): Gaussian q/k/v/z at std 0.1, 1,
10, random decays and betas, a random initial state, lengths that end inside, on and past a
chunk's edge. In float32 within 2e-4 of each (row, head)'s largest output and each head's largest
state entry; with the kernel's fp16 operands within 2e-2 (fp16 keeps 11 bits of each operand)."""

import numpy as np
import pytest

from impnb.kernels.deltanet.reference import gdn_chunked_ref, gdn_ref
from tests.gpu.test_deltanet_kernels import EPS, Layer, assert_close

SHAPES = (dict(Hk=1, Hv=3, dk=32, dv=32), dict(Hk=2, Hv=4, dk=16, dv=48, v_tiled=False))


def compare(layer, T, std, seed, operand, tol, chunk=64, lengths=None, B=1):
    rng = np.random.default_rng(seed)
    slots = rng.permutation(B + 1)[:B].astype(np.int32)
    state = layer.state(rng, B + 1, std)
    inputs = layer.inputs(rng, B * T, std)
    args = (layer.ssm_a, layer.dt_bias, layer.norm_w, EPS)
    s_tok, s_chunk = state.copy(), state.copy()
    want = gdn_ref(*inputs, *args, s_tok, slots, layer.Hk, layer.v_tiled, lengths)
    got = gdn_chunked_ref(*inputs, *args, s_chunk, slots, layer.Hk, layer.v_tiled, lengths,
                          chunk=chunk, operand=operand)
    assert_close(got.reshape(B * T, layer.Hv, -1), want.reshape(B * T, layer.Hv, -1), tol, 2)
    assert_close(s_chunk, s_tok, tol, (2, 3))
    assert not np.array_equal(s_chunk, state)


@pytest.mark.parametrize("T", [1, 19, 64, 65, 111, 300])
@pytest.mark.parametrize("shape", [0, 1], ids=["tiled", "grouped"])
def test_chunked_twin_equals_recurrence(T, shape):
    for i, std in enumerate((0.1, 1.0, 10.0)):
        layer = Layer.random(np.random.default_rng([T, shape, i]), **SHAPES[shape])
        compare(layer, T, std, [T, shape, i, 1], np.float32, 2e-4)


@pytest.mark.parametrize("T,chunk", [(65, 64), (111, 16), (300, 64)])
def test_chunked_twin_fp16_operands(T, chunk):
    for i, std in enumerate((0.1, 1.0, 10.0)):
        layer = Layer.random(np.random.default_rng([T, i]), **SHAPES[0])
        compare(layer, T, std, [T, i, 2], np.float16, 2e-2, chunk)


def test_chunked_twin_lengths_and_slots():
    layer = Layer.random(np.random.default_rng(4), **SHAPES[1])
    compare(layer, 70, 1.0, 5, np.float32, 2e-4, lengths=np.array([70, 3, 0], np.int32), B=3)


def test_strong_decay_forgets_the_state():
    """With exp(g) near 0 every token sees only itself: o is v's direction through the norm alone."""
    layer = Layer.random(np.random.default_rng(6), **SHAPES[0])
    layer.ssm_a[:] = -60.0
    compare(layer, 65, 1.0, 7, np.float32, 2e-4)
