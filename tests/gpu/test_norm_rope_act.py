"""RMSNorm, RoPE and the gated activations on the GPU against their numpy references.

The check_* functions run one case (fresh Gaussian inputs, NaN-poisoned outputs, one launch,
compare); tests/sim/test_norm_rope_act.py runs the same checks on tiny shapes in the simulator.

Tolerances:
  rms_norm*    vs rms_norm_ref:  |err| <= 1e-5 |ref| + 1e-6 (outputs are O(|w|) at any input scale);
               the residual x + h is bit-exact; x + rms_norm(h) w_post within 1e-5 (|x| + |n|) + 1e-6.
  rope         vs rope_ref (float64 angles): max |err| <= 2e-6 max|x| for positions up to 32768
               (the kernel's angle is exact to ~1e-7 rad; a plain float32 angle is off by 2e-3).
  swiglu/geglu vs *_ref: |err| <= 1e-5 |ref| + 1e-6 |gate * up|
               (GELU's 1 + tanh cancels for negative gates: absolute, not relative, accuracy there);
               with a float16 out, bit-equal to the float32 kernel's result through cast_f16_ref.
"""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.elementwise.activations import (geglu, geglu_fused, geglu_ref, swiglu, swiglu_fused,
                                       swiglu_ref)
from impnb.kernels.elementwise.cast import cast_f16_ref
from impnb.kernels.elementwise.norm import rms_norm, rms_norm_add, rms_norm_post_add, rms_norm_ref
from impnb.kernels.attention.rope import rope, rope_inv_freq, rope_ref

pytestmark = pytest.mark.gpu

EPS = 1e-6
STDS = (0.1, 1.0, 10.0)
ODD = (1, 19, 111, 989)
MODEL_DIMS = (576, 640, 2048)  # SmolLM2 d, Gemma3 d, Gemma3 ffn


def gauss(rng, shape, std) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def run(launch, *arrays):
    """Upload arrays, launch(stream, *device_arrays), return them all back on the host."""
    stream = cuda.stream()
    dev = [cuda.to_device(a, stream=stream) for a in arrays]
    launch(stream, *dev)
    out = [d.copy_to_host(stream=stream) for d in dev]
    stream.synchronize()
    return out


def assert_close(got, ref, rtol, atol, what):
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    err = np.abs(got.astype(np.float64) - ref)
    bound = rtol * np.abs(ref) + atol
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"{what}: err {err[worst]:.3e} > {bound[worst]:.3e} at {worst}"


# ---------------------------------------------------------------- checks

def check_rms_norm(rng, shape, std, in_place=False):
    x = gauss(rng, shape, std)
    w = 1 + gauss(rng, shape[-1:], 0.3)
    out = np.full(shape, np.nan, np.float32)
    if in_place:
        got, _ = run(lambda s, x_, w_: rms_norm(x_, w_, x_, EPS, s), x, w)
    else:
        _, _, got = run(lambda s, x_, w_, o_: rms_norm(x_, w_, o_, EPS, s), x, w, out)
    assert_close(got, rms_norm_ref(x, w, EPS), 1e-5, 1e-6, f"rms_norm {shape} std {std}")


def check_rms_norm_add(rng, shape, std):
    x, h = gauss(rng, shape, std), gauss(rng, shape, std)
    w = 1 + gauss(rng, shape[-1:], 0.3)
    out = np.full(shape, np.nan, np.float32)
    x_new, _, _, got = run(lambda s, *a: rms_norm_add(*a, EPS, s), x, h, w, out)
    np.testing.assert_array_equal(x_new, x + h)
    assert_close(got, rms_norm_ref(x + h, w, EPS), 1e-5, 1e-6, f"rms_norm_add {shape} std {std}")


def check_rms_norm_post_add(rng, shape, std, quant=False):
    """quant: out's int8 form too (into poisoned buffers a row longer), quantize_x_ref's of the
    out written, bit for bit."""
    from impnb.kernels.gemv.quant_x import QuantX, quantize_x_ref

    x, h = gauss(rng, shape, std), gauss(rng, shape, 3 * std)
    w_post, w = 1 + gauss(rng, shape[-1:], 0.3), 1 + gauss(rng, shape[-1:], 0.3)
    out = np.full(shape, np.nan, np.float32)
    T, D = shape
    poison = [np.full((T + 1, n), 0xFFFFFFFF, np.uint32) for n in (D // 4, D // 16, D // 16)]
    if quant:
        x_new, _, _, _, got, *oq = run(lambda s, *a: rms_norm_post_add(*a[:5], EPS, s, out_q=QuantX(*a[5:])),
                                       x, h, w_post, w, out, poison[0], *(p.view(np.float32) for p in poison[1:]))
        for name, g, r in zip("qds", oq, quantize_x_ref(got)):
            assert np.array_equal(g[:T].view(np.uint32), r.view(np.uint32)), f"post_add out's int8 form: {name}"
            assert (g[T].view(np.uint32) == 0xFFFFFFFF).all(), f"post_add out's int8 form past T rows ({name})"
    else:
        x_new, _, _, _, got = run(lambda s, *a: rms_norm_post_add(*a, EPS, s), x, h, w_post, w, out)
    n = rms_norm_ref(h.astype(np.float64), w_post, EPS)
    assert_close(x_new, x + n, 0, 1e-5 * (np.abs(x) + np.abs(n)) + 1e-6, f"post_add x {shape}")
    assert_close(got, rms_norm_ref(x_new, w, EPS), 1e-5, 1e-6, f"post_add out {shape} std {std}")


def check_rope(rng, T, H, Hkv, D, n_rot, base, neox, std, max_pos=32768):
    q, k = gauss(rng, (T, H, D), std), gauss(rng, (T, Hkv, D), std)
    pos = rng.integers(0, max_pos + 1, T).astype(np.int32)
    pos[: min(T, 2)] = [max_pos, 0][: min(T, 2)]
    inv_freq = rope_inv_freq(n_rot, base)
    q_got, k_got, _, _ = run(lambda s, *a: rope(*a, neox, s), q, k, pos, inv_freq)
    for got, x in ((q_got, q), (k_got, k)):
        ref = rope_ref(x, pos, base, neox, n_rot)
        assert_close(got, ref, 0, 2e-6 * np.abs(x).max(), f"rope {x.shape} n_rot {n_rot} neox {neox}")


def check_glu(rng, T, F, std, act):
    plain, fused, ref_fn = {"silu": (swiglu, swiglu_fused, swiglu_ref),
                            "gelu": (geglu, geglu_fused, geglu_ref)}[act]
    gate, up = gauss(rng, (T, F), std), gauss(rng, (T, F), std)
    ref = ref_fn(gate, up).astype(np.float64)
    atol = 1e-6 * np.abs(gate.astype(np.float64) * up)
    out = np.full((T, F), np.nan, np.float32)
    _, _, got = run(lambda s, *a: plain(*a, s), gate, up, out)
    assert_close(got, ref, 1e-5, atol, f"{act} ({T}, {F}) std {std}")
    _, got_fused = run(lambda s, *a: fused(*a, s), np.concatenate([gate, up], axis=1), out)
    assert_close(got_fused, ref, 1e-5, atol, f"{act} fused ({T}, {F}) std {std}")
    # float16 out (the next GEMM's A operand): the float32 result as cast_f16 rounds it, and at
    # 300x the scale (products past 65504) as it saturates it
    out16 = np.full((T, F), np.nan, np.float16)
    for scale in (1, 300):
        g, u = gate, up * np.float32(scale)
        _, _, f32 = run(lambda s, *a: plain(*a, s), g, u, out)
        _, _, got16 = run(lambda s, *a: plain(*a, s), g, u, out16)
        np.testing.assert_array_equal(got16, cast_f16_ref(f32), f"{act} f16 ({T}, {F}) x{scale}")
        _, got16 = run(lambda s, *a: fused(*a, s), np.concatenate([g, u], axis=1), out16)
        np.testing.assert_array_equal(got16, cast_f16_ref(f32), f"{act} fused f16 ({T}, {F}) x{scale}")


# ---------------------------------------------------------------- GPU cases

@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("D", ODD + MODEL_DIMS)
@pytest.mark.parametrize("T", (1, 7))
def test_rms_norm(T, D, std):
    rng = np.random.default_rng([T, D, int(std * 10)])
    check_rms_norm(rng, (T, D), std)
    check_rms_norm(rng, (T, D), std, in_place=True)
    check_rms_norm_add(rng, (T, D), std)
    check_rms_norm_post_add(rng, (T, D), std)
    if D % 16 == 0:
        check_rms_norm_post_add(rng, (T, D), std, quant=True)


@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("T,H,Dh", [(1, 9, 64), (19, 3, 64), (1, 4, 256), (111, 1, 256), (5, 32, 128)])
def test_rms_norm_per_head(T, H, Dh, std):
    check_rms_norm(np.random.default_rng([T, H, Dh, int(std * 10)]), (T, H, Dh), std)


@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("neox", (False, True))
@pytest.mark.parametrize("T,H,Hkv,D,n_rot,base", [
    (1, 9, 3, 64, 64, 10000.0), (19, 9, 3, 64, 64, 100000.0), (111, 4, 1, 256, 256, 10000.0),
    (7, 4, 1, 256, 256, 1000000.0), (5, 32, 8, 128, 64, 500000.0), (3, 8, 1, 128, 128, 10000.0)])
def test_rope(T, H, Hkv, D, n_rot, base, neox, std):
    check_rope(np.random.default_rng([T, H, D, n_rot, int(neox), int(std * 10)]),
               T, H, Hkv, D, n_rot, base, neox, std)


@pytest.mark.parametrize("act", ("silu", "gelu"))
@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("F", ODD + (1536, 2048))
@pytest.mark.parametrize("T", (1, 19))
def test_glu(T, F, std, act):
    check_glu(np.random.default_rng([T, F, int(std * 10), len(act)]), T, F, std, act)
