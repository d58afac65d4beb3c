"""The tensor-core chunked Gated DeltaNet prefill (kernels/deltanet/gdn_chunked.py) against its numpy
twin (reference.gdn_chunked_ref with fp16 operands, as the kernel rounds them) and against the
token-by-token recurrence (gdn_ref), at Qwen3.6's shapes (16 QK heads, 32 V heads, dk = dv = 128).

Inputs as tests/gpu/test_deltanet_kernels.py draws them (Gaussian at std 0.1, 1, 10, spread decays
and betas, random states carried in and out, outputs poisoned with NaN). Tolerances, of each (row,
head)'s largest output and each (slot, head)'s largest state entry: 2e-3 against the twin (the
same fp16 operands, sums in another order), 2e-2 against the recurrence (fp16 operands keep 11
bits; the twin is within 6e-3 of the recurrence at these shapes).
"""

import functools

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.deltanet.gdn_chunked import gdn_chunked
from impnb.kernels.deltanet.reference import gdn_chunked_ref
from tests.gpu.test_deltanet_kernels import (EPS, QWEN36, STDS, Layer, assert_close, pair_slots,
                                             slots_for)

pytestmark = pytest.mark.gpu

TWIN_TOL = 2e-3
RECURRENCE_TOL = 2e-2


def run(layer, inputs, d_state, slots, lengths=None, pos=None, chunk=64):
    return layer.run(functools.partial(gdn_chunked, chunk=chunk), inputs, d_state, slots, lengths, pos)


def check_chunked(rng, layer, B, T, std, chunk=64, lengths=None, padded=False, with_pos=False):
    """A prompt chunk of T rows of B sequences against the twin and the recurrence, outputs and states."""
    if with_pos:
        slots = pair_slots(rng, B, B + 1)
        n_slots = 2 * B + 2
        pos = np.concatenate([np.arange(p, p + T) for p in rng.integers(0, 1000, B)]).astype(np.int32)
    else:
        n_slots = B + 2
        slots = slots_for(rng, B, n_slots, padded)
        pos = None
    state = layer.state(rng, n_slots, std)
    inputs = layer.inputs(rng, B * T, std)
    d_state = cuda.to_device(state)
    got = run(layer, inputs, d_state, slots, lengths, pos, chunk).reshape(B * T, layer.Hv, -1)
    got_state = d_state.copy_to_host()
    args = (layer.ssm_a, layer.dt_bias, layer.norm_w, EPS)
    twin_state, rec_state = state.copy(), state.copy()
    twin = gdn_chunked_ref(*inputs, *args, twin_state, slots, layer.Hk, layer.v_tiled, lengths, pos,
                           chunk=chunk, operand=np.float16).reshape(got.shape)
    rec = layer.ref(inputs, rec_state, slots, lengths, pos).reshape(got.shape)
    assert_close(got, twin, TWIN_TOL, 2)
    assert_close(got_state, twin_state, TWIN_TOL, (2, 3))
    assert_close(got, rec, RECURRENCE_TOL, 2)
    assert_close(got_state, rec_state, RECURRENCE_TOL, (2, 3))


def check_chunked_split(rng, layer, T, splits, std, chunk=64):
    """A prompt chunk split at `splits` (the state carried between launches) == the recurrence."""
    slots = np.array([1], np.int32)
    state = layer.state(rng, 2, std)
    inputs = layer.inputs(rng, T, std)
    d_state = cuda.to_device(state)
    edges = [0, *splits, T]
    got = np.concatenate([run(layer, [x[lo:hi] for x in inputs], d_state, slots, chunk=chunk)
                          for lo, hi in zip(edges, edges[1:])])
    want_state = state.copy()
    want = layer.ref(inputs, want_state, slots)
    assert_close(got.reshape(T, layer.Hv, -1), want.reshape(T, layer.Hv, -1), RECURRENCE_TOL, 2)
    assert_close(d_state.copy_to_host(), want_state, RECURRENCE_TOL, (2, 3))


@pytest.mark.parametrize("B,T", [(1, 1), (1, 19), (1, 63), (1, 64), (1, 65), (1, 111), (1, 300), (2, 130)])
def test_gdn_chunked(B, T):
    for i, std in enumerate(STDS):
        rng = np.random.default_rng([B, T, i, 64])
        check_chunked(rng, Layer.random(rng, **QWEN36, v_tiled=i != 1), B, T, std)


def test_gdn_chunked_long_prompt():
    """1000 tokens in one launch: 16 chunks, the state carried through them in registers."""
    rng = np.random.default_rng(1000)
    check_chunked(rng, Layer.random(rng, **QWEN36), 1, 1000, 1.0)


def test_gdn_chunked_lengths_and_padding():
    rng = np.random.default_rng(5)
    layer = Layer.random(rng, **QWEN36, v_tiled=False)
    check_chunked(rng, layer, 3, 96, 1.0, lengths=np.array([96, 17, 0], np.int32))
    check_chunked(rng, layer, 3, 70, 1.0, padded=True)


def test_gdn_chunked_split_anywhere():
    rng = np.random.default_rng(8)
    layer = Layer.random(rng, **QWEN36)
    check_chunked_split(rng, layer, 300, (1, 63, 64, 200), 1.0)


def test_gdn_chunked_slot_pairs():
    rng = np.random.default_rng(9)
    layer = Layer.random(rng, **QWEN36)
    check_chunked(rng, layer, 1, 65, 1.0, with_pos=True)
    check_chunked(rng, layer, 2, 48, 0.1, lengths=np.array([31, 48], np.int32), with_pos=True)
