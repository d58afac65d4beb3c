"""The Gated DeltaNet kernels against their numpy twins (kernels/deltanet/reference.py) at
Qwen3.5 / Qwen3.6 shapes (16 QK heads, 32 V heads, dk = dv = 128, 8192 conv channels).

Gaussian q/k/v and z at std 0.1, 1, 10 (b, a as gates: beta and exp(g) spread over (0.05, 0.95)
and (0.27, 0.99)), states carried in (random) and out, slots shuffled in a larger buffer, padded
rows and sequences, outputs poisoned (NaN) before each launch.
Tolerances: the conv within 1e-5 of the step's largest output (float32 sums of 4 products), its
state exact (copies of inputs); the delta rule within 2e-5 of each (row, head)'s largest output
and of each (slot, head)'s largest state entry, across repeated steps; between the kernels
(prefill == repeated decode) 4e-6 of the same scales; a chunk split anywhere equals the whole
chunk bit for bit (the same kernel, the same arithmetic a token). With positions (slot pairs read
and written by parity): against the twins, the slot read left as it was, and a step run twice at
the same positions (the engine's dropped look-ahead step) giving the same output bit for bit.
"""

import functools
from dataclasses import dataclass

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.deltanet.conv1d import WIDTH, conv1d
from impnb.kernels.deltanet.gdn_decode import gdn_decode
from impnb.kernels.deltanet.gdn_prefill import gdn_prefill
from impnb.kernels.deltanet.reference import conv1d_ref, gdn_ref

pytestmark = pytest.mark.gpu

F32 = np.float32
EPS = 1e-6


def assert_close(got, want, tol, axes):
    """|got - want| within tol of want's largest |value| over `axes` (each slice its own scale)."""
    assert np.isfinite(got).all(), "non-finite output"
    scale = np.abs(want).max(axis=axes, keepdims=True)
    err = np.abs(got - want)
    worst = float((err / (scale + 1e-30)).max())
    assert (err <= tol * scale + 1e-30).all(), f"error {worst:.3g} of the scale"


def slots_for(rng, B, n_slots, padded=False):
    slots = rng.permutation(n_slots)[:B].astype(np.int32)
    if padded and B > 1:
        slots[B // 2] = -1
    return slots


# ---------------------------------------------------------------- conv1d

def run_conv(x, weight, d_state, slots, lengths=None, in_place=False, pos=None):
    """conv1d on the device state d_state (updated) -> out on the host."""
    stream = cuda.stream()
    d_x = cuda.to_device(x, stream=stream)
    d_out = d_x if in_place else cuda.to_device(np.full_like(x, np.nan), stream=stream)
    d_len = None if lengths is None else cuda.to_device(lengths, stream=stream)
    d_pos = None if pos is None else cuda.to_device(pos, stream=stream)
    conv1d(d_x, cuda.to_device(weight, stream=stream), d_state, cuda.to_device(slots, stream=stream),
           d_out, stream, d_len, d_pos)
    out = d_out.copy_to_host(stream=stream)
    stream.synchronize()
    return out


def check_conv1d(rng, B, T, C, std, n_slots=5, padded=False, lengths=None, in_place=False):
    x = (rng.standard_normal((B * T, C)) * std).astype(F32)
    weight = (rng.standard_normal((C, WIDTH)) * 0.5).astype(F32)
    state = (rng.standard_normal((n_slots, C, WIDTH - 1)) * std).astype(F32)
    slots = slots_for(rng, B, n_slots, padded)
    d_state = cuda.to_device(state)
    got = run_conv(x, weight, d_state, slots, lengths, in_place)
    want_state = state.copy()
    want = conv1d_ref(x, weight, want_state, slots, lengths)
    assert_close(got, want, 1e-5, None)
    assert np.array_equal(d_state.copy_to_host(), want_state)


def check_conv1d_chunks(rng, T, C, splits, std=1.0):
    """One sequence's T rows in chunks (state carried) == the whole chunk, bit for bit."""
    x = (rng.standard_normal((T, C)) * std).astype(F32)
    weight = (rng.standard_normal((C, WIDTH)) * 0.5).astype(F32)
    state = (rng.standard_normal((2, C, WIDTH - 1)) * std).astype(F32)
    slots = np.array([1], np.int32)
    whole_state = cuda.to_device(state)
    whole = run_conv(x, weight, whole_state, slots)
    parts_state = cuda.to_device(state)
    edges = [0, *splits, T]
    parts = np.concatenate([run_conv(x[lo:hi], weight, parts_state, slots)
                            for lo, hi in zip(edges, edges[1:])])
    assert np.array_equal(parts, whole)
    assert np.array_equal(parts_state.copy_to_host(), whole_state.copy_to_host())


# ---------------------------------------------------------------- the delta rule

@dataclass
class Layer:
    """A Gated DeltaNet layer's shape and the small weights its kernels read."""
    Hk: int
    Hv: int
    dk: int
    dv: int
    v_tiled: bool
    ssm_a: np.ndarray    # (Hv,) -exp(A_log), as the file stores it
    dt_bias: np.ndarray  # (Hv,)
    norm_w: np.ndarray   # (dv,)

    @classmethod
    def random(cls, rng, Hk, Hv, dk, dv, v_tiled=True):
        dt_bias = rng.permutation(np.linspace(-3, 0.3, Hv))  # with a, exp(g) over (0.27, 0.99)
        return cls(Hk, Hv, dk, dv, v_tiled, (-np.exp(rng.uniform(-1, 0, Hv))).astype(F32),
                   dt_bias.astype(F32), (1 + 0.3 * rng.standard_normal(dv)).astype(F32))

    @property
    def channels(self):
        return 2 * self.Hk * self.dk + self.Hv * self.dv

    def inputs(self, rng, R, std):
        """qkv (R, C) as the conv gives it, z (R, Hv dv), b, a (R, Hv)."""
        qkv = (rng.standard_normal((R, self.channels)) * std).astype(F32)
        z = (rng.standard_normal((R, self.Hv * self.dv)) * std).astype(F32)
        b = (rng.standard_normal((R, self.Hv)) * 1.5).astype(F32)
        a = (rng.standard_normal((R, self.Hv)) * 0.5).astype(F32)
        return qkv, z, b, a

    def state(self, rng, n_slots, std):
        return (rng.standard_normal((n_slots, self.Hv, self.dk, self.dv)) * 0.3 * std).astype(F32)

    def ref(self, inputs, state, slots, lengths=None, pos=None):
        return gdn_ref(*inputs, self.ssm_a, self.dt_bias, self.norm_w, EPS, state, slots, self.Hk,
                       self.v_tiled, lengths, pos)

    def run(self, kernel, inputs, d_state, slots, lengths=None, pos=None):
        """gdn_decode or gdn_prefill on the device state d_state (updated) -> out on the host."""
        stream = cuda.stream()
        dev = lambda x: cuda.to_device(x, stream=stream)  # noqa: E731
        R = inputs[0].shape[0]
        d_out = dev(np.full((R, self.Hv * self.dv), np.nan, F32))
        extra = {} if lengths is None else {"lengths": dev(lengths)}
        if pos is not None:
            extra["pos"] = dev(pos)
        kernel(*map(dev, inputs), dev(self.ssm_a), dev(self.dt_bias), dev(self.norm_w), EPS, d_state,
               dev(slots), self.Hk, self.v_tiled, d_out, stream, **extra)
        out = d_out.copy_to_host(stream=stream)
        stream.synchronize()
        return out


def decays(layer, a):
    """exp(g) of the inputs' a."""
    x = a + layer.dt_bias
    return np.exp(layer.ssm_a * np.logaddexp(0, x))


def check_state(d_state, want, tol=2e-5):
    assert_close(d_state.copy_to_host(), want, tol, (2, 3))


def check_decode(rng, layer, B, steps, std, n_slots=None, padded=False):
    """`steps` decode steps of B sequences against the recurrence, the state on the device throughout."""
    n_slots = n_slots or B + 2
    slots = slots_for(rng, B, n_slots, padded)
    state = layer.state(rng, n_slots, std)
    d_state = cuda.to_device(state)
    spread = []
    for _ in range(steps):
        inputs = layer.inputs(rng, B, std)
        spread.append(decays(layer, inputs[3]))
        got = layer.run(gdn_decode, inputs, d_state, slots)
        want = layer.ref(inputs, state, slots)
        assert_close(got.reshape(B, layer.Hv, -1), want.reshape(B, layer.Hv, -1), 2e-5, 2)
        check_state(d_state, state)
    spread = np.concatenate(spread, axis=None)
    assert spread.min() < 0.6 and spread.max() > 0.9, "decays not spread"


def check_prefill(rng, layer, B, T, std, lengths=None, padded=False, n_slots=None):
    """A chunk of T rows of B sequences against the recurrence."""
    n_slots = n_slots or B + 1
    slots = slots_for(rng, B, n_slots, padded)
    state = layer.state(rng, n_slots, std)
    d_state = cuda.to_device(state)
    inputs = layer.inputs(rng, B * T, std)
    got = layer.run(gdn_prefill, inputs, d_state, slots, lengths)
    want = layer.ref(inputs, state, slots, lengths)
    assert_close(got.reshape(B * T, layer.Hv, -1), want.reshape(B * T, layer.Hv, -1), 2e-5, 2)
    check_state(d_state, state)


def check_prefill_is_decode(rng, layer, T, std):
    """A chunk of T rows of one sequence == T decode steps, outputs and state."""
    slots = np.array([0], np.int32)
    state = layer.state(rng, 1, std)
    inputs = layer.inputs(rng, T, std)
    d_chunk, d_steps = cuda.to_device(state), cuda.to_device(state)
    chunk = layer.run(gdn_prefill, inputs, d_chunk, slots)
    steps = np.concatenate([layer.run(gdn_decode, [x[t:t + 1] for x in inputs], d_steps, slots)
                            for t in range(T)])
    assert_close(chunk.reshape(T, layer.Hv, -1), steps.reshape(T, layer.Hv, -1), 4e-6, 2)
    assert_close(d_chunk.copy_to_host(), d_steps.copy_to_host(), 4e-6, (2, 3))


def check_prefill_split(rng, layer, T, splits, std):
    """A chunk split at `splits` (the state carried between) == the whole chunk, bit for bit."""
    slots = np.array([1], np.int32)
    state = layer.state(rng, 2, std)
    inputs = layer.inputs(rng, T, std)
    d_whole, d_parts = cuda.to_device(state), cuda.to_device(state)
    whole = layer.run(gdn_prefill, inputs, d_whole, slots)
    edges = [0, *splits, T]
    parts = np.concatenate([layer.run(gdn_prefill, [x[lo:hi] for x in inputs], d_parts, slots)
                            for lo, hi in zip(edges, edges[1:])])
    assert np.array_equal(parts, whole)
    assert np.array_equal(d_parts.copy_to_host(), d_whole.copy_to_host())


# ---------------------------------------------------------------- slot pairs by position

def pair_slots(rng, B, n_pairs):
    """B sequences' pair bases (even slots) in a buffer of n_pairs pairs, shuffled."""
    return (2 * rng.permutation(n_pairs)[:B]).astype(np.int32)


def odd_rows(B, T, lengths):
    """(the sequences whose chunk has an odd number of real rows, and those sequences' rows): a
    chunk of odd length writes the other slot of its pair, so it can run again on what it read."""
    n = np.full(B, T) if lengths is None else np.minimum(lengths, T)
    odd = n % 2 == 1
    return odd, np.repeat(odd, T)


def check_conv1d_pairs(rng, B, T, C, std, lengths=None):
    """A chunk of T rows a sequence at odd and even positions: against the twin; where a chunk is
    of odd length, the slot it read unchanged and the chunk run again at the same positions giving
    the same output bit for bit."""
    x = (rng.standard_normal((B * T, C)) * std).astype(F32)
    weight = (rng.standard_normal((C, WIDTH)) * 0.5).astype(F32)
    state = (rng.standard_normal((2 * B + 2, C, WIDTH - 1)) * std).astype(F32)
    slots = pair_slots(rng, B, B + 1)
    starts = rng.integers(0, 1000, B)
    pos = np.concatenate([np.arange(p, p + T) for p in starts]).astype(np.int32)
    d_state = cuda.to_device(state)
    got = run_conv(x, weight, d_state, slots, lengths, pos=pos)
    want_state = state.copy()
    want = conv1d_ref(x, weight, want_state, slots, lengths, pos)
    assert_close(got, want, 1e-5, None)
    assert np.array_equal(d_state.copy_to_host(), want_state)
    odd, rows = odd_rows(B, T, lengths)
    read = (slots + starts % 2)[odd]
    assert odd.any() and np.array_equal(d_state.copy_to_host()[read], state[read])
    assert np.array_equal(run_conv(x, weight, d_state, slots, lengths, pos=pos)[rows], got[rows])


def check_decode_pairs(rng, layer, B, steps, std):
    """`steps` decode steps of B sequences at their positions, each also run a first time on other
    inputs (a look-ahead step the engine drops): the second run against the twin from the state
    the first left unread; the slot read by a step is never written by it."""
    slots = pair_slots(rng, B, B + 1)
    state = layer.state(rng, 2 * B + 2, std)
    d_state = cuda.to_device(state)
    pos = rng.integers(0, 1000, B).astype(np.int32)
    for _ in range(steps):
        read = slots + pos % 2
        before = d_state.copy_to_host()[read]
        layer.run(gdn_decode, layer.inputs(rng, B, std), d_state, slots, pos=pos)  # dropped
        assert np.array_equal(d_state.copy_to_host()[read], before)
        inputs = layer.inputs(rng, B, std)
        got = layer.run(gdn_decode, inputs, d_state, slots, pos=pos)
        want = layer.ref(inputs, state, slots, pos=pos)
        assert_close(got.reshape(B, layer.Hv, -1), want.reshape(B, layer.Hv, -1), 2e-5, 2)
        written = slots + (pos + 1) % 2
        assert_close(d_state.copy_to_host()[written], state[written], 2e-5, (2, 3))
        pos = pos + 1


def check_decode_conv_fused(rng, layer, B, steps, std, padded=False):
    """`steps` decode steps of B sequences at their positions with the conv inside gdn_decode
    (conv=...) against conv1d then gdn_decode on copies of the same states: outputs and delta-rule
    states within 1e-6 of each slice's scale (the same float operations, contracted alike or not),
    conv states bit for bit; a padded row's slots untouched."""
    slots = pair_slots(rng, B, B + 1)
    if padded and B > 1:
        slots[B // 2] = -1
    state = layer.state(rng, 2 * B + 2, std)
    conv_state = (rng.standard_normal((2 * B + 2, layer.channels, WIDTH - 1)) * std).astype(F32)
    weight = (rng.standard_normal((layer.channels, WIDTH)) * 0.5).astype(F32)
    d_w = cuda.to_device(weight)
    fused = (cuda.to_device(state), cuda.to_device(conv_state))  # (delta-rule state, conv state)
    apart = (cuda.to_device(state), cuda.to_device(conv_state))
    pos = rng.integers(0, 1000, B).astype(np.int32)
    for _ in range(steps):
        inputs = layer.inputs(rng, B, std)
        got = layer.run(functools.partial(gdn_decode, conv=(d_w, fused[1])), inputs, fused[0], slots, pos=pos)
        conved = run_conv(inputs[0], weight, apart[1], slots, pos=pos)
        want = layer.run(gdn_decode, (conved, *inputs[1:]), apart[0], slots, pos=pos)
        assert_close(got.reshape(B, layer.Hv, -1), want.reshape(B, layer.Hv, -1), 1e-6, 2)
        assert_close(fused[0].copy_to_host(), apart[0].copy_to_host(), 1e-6, (2, 3))
        assert np.array_equal(fused[1].copy_to_host(), apart[1].copy_to_host())
        pos = pos + 1
    live = np.concatenate([slots[slots >= 0], slots[slots >= 0] + 1])
    untouched = np.setdiff1d(np.arange(2 * B + 2), live)  # the spare pair, and a padded row's
    assert np.array_equal(fused[1].copy_to_host()[untouched], conv_state[untouched])
    assert np.array_equal(fused[0].copy_to_host()[untouched], state[untouched])


def check_prefill_pairs(rng, layer, B, T, std, lengths=None):
    """A chunk of T rows a sequence at their positions against the twin (the slot of the first
    position's parity read, that after the last real row's written); a chunk of odd length run
    twice gives the same output bit for bit."""
    slots = pair_slots(rng, B, B + 1)
    state = layer.state(rng, 2 * B + 2, std)
    d_state = cuda.to_device(state)
    starts = rng.integers(0, 1000, B)
    pos = np.concatenate([np.arange(p, p + T) for p in starts]).astype(np.int32)
    inputs = layer.inputs(rng, B * T, std)
    got = layer.run(gdn_prefill, inputs, d_state, slots, lengths, pos=pos)
    want_state = state.copy()
    want = layer.ref(inputs, want_state, slots, lengths, pos=pos)
    assert_close(got.reshape(B * T, layer.Hv, -1), want.reshape(B * T, layer.Hv, -1), 2e-5, 2)
    check_state(d_state, want_state)
    odd, rows = odd_rows(B, T, lengths)
    assert odd.any() and np.array_equal(layer.run(gdn_prefill, inputs, d_state, slots, lengths, pos=pos)[rows],
                                        got[rows])


# ---------------------------------------------------------------- at Qwen3.6's shapes

QWEN36 = dict(Hk=16, Hv=32, dk=128, dv=128)
C36 = 2 * 16 * 128 + 32 * 128
STDS = (0.1, 1.0, 10.0)


@pytest.mark.parametrize("B,T", [(1, 1), (7, 1), (1, 37), (1, 300), (3, 19)])
def test_conv1d(B, T):
    for i, std in enumerate(STDS):
        check_conv1d(np.random.default_rng([B, T, i]), B, T, C36, std, n_slots=B + 3, padded=i == 1)


def test_conv1d_in_place_and_lengths():
    rng = np.random.default_rng(11)
    check_conv1d(rng, 1, 1, C36, 1.0, in_place=True)
    check_conv1d(rng, 2, 64, C36, 1.0, lengths=np.array([37, 2], np.int32), in_place=True)
    check_conv1d(rng, 2, 200, C36, 1.0, lengths=np.array([130, 200], np.int32))


def test_conv1d_chunks():
    check_conv1d_chunks(np.random.default_rng(3), 300, C36, (1, 2, 130, 299))


@pytest.mark.parametrize("B,v_tiled", [(1, True), (5, True), (3, False)])
def test_gdn_decode(B, v_tiled):
    for i, std in enumerate(STDS):
        rng = np.random.default_rng([B, i])
        layer = Layer.random(rng, **QWEN36, v_tiled=v_tiled)
        check_decode(rng, layer, B, steps=6, std=std, padded=i == 2)


@pytest.mark.parametrize("B,T", [(1, 1), (1, 64), (1, 200), (2, 33)])
def test_gdn_prefill(B, T):
    for i, std in enumerate(STDS):
        rng = np.random.default_rng([B, T, i])
        check_prefill(rng, Layer.random(rng, **QWEN36), B, T, std)


def test_gdn_prefill_lengths_and_padding():
    rng = np.random.default_rng(5)
    layer = Layer.random(rng, **QWEN36, v_tiled=False)
    check_prefill(rng, layer, 3, 48, 1.0, lengths=np.array([48, 17, 0], np.int32))
    check_prefill(rng, layer, 3, 16, 1.0, padded=True)


def test_gdn_prefill_is_repeated_decode():
    rng = np.random.default_rng(6)
    check_prefill_is_decode(rng, Layer.random(rng, **QWEN36), 24, 1.0)


def test_gdn_prefill_split_anywhere():
    rng = np.random.default_rng(8)
    layer = Layer.random(rng, **QWEN36)
    for splits in ((1,), (63,), (5, 6, 100)):
        check_prefill_split(rng, layer, 128, splits, 1.0)


@pytest.mark.parametrize("B,v_tiled", [(1, True), (4, True), (3, False)])
def test_gdn_decode_conv_fused(B, v_tiled):
    for i, std in enumerate(STDS):
        rng = np.random.default_rng([B, i, 4])
        check_decode_conv_fused(rng, Layer.random(rng, **QWEN36, v_tiled=v_tiled), B, 3, std, padded=i == 1)


def test_slot_pairs_by_position():
    rng = np.random.default_rng(9)
    layer = Layer.random(rng, **QWEN36)
    check_conv1d_pairs(rng, 1, 1, C36, 1.0)
    check_conv1d_pairs(rng, 3, 37, C36, 10.0, lengths=np.array([37, 20, 5], np.int32))
    check_decode_pairs(rng, layer, 3, 4, 1.0)
    check_prefill_pairs(rng, layer, 1, 65, 1.0)
    check_prefill_pairs(rng, layer, 2, 48, 0.1, lengths=np.array([31, 48], np.int32))
