"""gemma4's elementwise kernels on the GPU against their numpy twins: the layer output scale with
the next norm, final logit softcapping, the per-layer embedding inputs, the per-expert scale
on the routing weights and the end of a layer with experts (moe_layer_end). Gaussian inputs at
several magnitudes (Gemma's residual stream reaches ~1e3), odd sizes, outputs poisoned with NaN. tests/sim/test_gemma4_kernels.py runs the same
checks on tiny shapes in the simulator.

Tolerances: scale_rms_norm: x * s bit-exact (one float32 product), the norm within
1e-5 |ref| + 1e-6; softcap within 1e-6 |ref| + 1e-6 cap (tanh's float32 error); per_layer_inputs
within 1e-5 |ref| + 1e-5 (|own| + 1); expert_scale bit-exact (one product); moe_layer_end: x within
1e-5 |ref| + 1e-5 (|x| + 1) (the added norm is O(1) whatever x's scale), h within 1e-5 |ref| + 1e-5.
"""

import numpy as np
import pytest

from impnb.kernels.elementwise.per_layer_inputs import per_layer_inputs, per_layer_inputs_ref
from impnb.kernels.elementwise.scale_norm import scale_rms_norm, scale_rms_norm_ref
from impnb.kernels.elementwise.softcap import softcap, softcap_ref
from impnb.kernels.moe.expert_scale import expert_scale, expert_scale_ref
from tests.gpu.test_norm_rope_act import assert_close, gauss, run

pytestmark = pytest.mark.gpu
EPS = 1e-6
STDS = (0.1, 1.0, 100.0, 1000.0)


def check_scale_rms_norm(rng, R, D, std):
    x = gauss(rng, (R, D), std)
    scale = (1 + gauss(rng, (1,), 0.3)).astype(np.float32)
    w = 1 + gauss(rng, (D,), 0.3)
    out = np.full((R, D), np.nan, np.float32)
    want_x, want = scale_rms_norm_ref(x, scale, w, EPS)
    got_x, _, _, got = run(lambda s, x_, sc, w_, o: scale_rms_norm(x_, sc, w_, o, EPS, s), x, scale, w, out)
    assert np.array_equal(got_x, want_x), "x * scale not exact"
    assert_close(got, want.astype(np.float64), 1e-5, 1e-6, f"scale_rms_norm {R}x{D} std {std}")


def check_softcap(rng, R, N, std, cap):
    x = gauss(rng, (R, N), std)
    want = softcap_ref(x, cap)
    got, = run(lambda s, x_: softcap(x_, cap, s), x)
    assert_close(got, want.astype(np.float64), 1e-6, 1e-6 * cap, f"softcap {R}x{N} std {std}")


def check_per_layer_inputs(rng, T, L, P, std):
    proj = gauss(rng, (T, L * P), std)
    own = gauss(rng, (T, L * P), 1.0)
    w = 1 + gauss(rng, (P,), 0.3)
    out = np.full((L, T, P), np.nan, np.float32)
    scale = 64 ** -0.5
    want = per_layer_inputs_ref(proj, own, w, scale, EPS)
    *_, got = run(lambda s, p, o, w_, out_: per_layer_inputs(p, o, w_, out_, scale, EPS, s), proj, own, w, out)
    own_lt = np.abs(own.reshape(T, L, P).transpose(1, 0, 2))
    assert_close(got, want.astype(np.float64), 1e-5, 1e-5 * (own_lt + 1), f"per_layer_inputs T{T} L{L} P{P}")


def check_expert_scale(rng, T, k, E):
    experts = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    weights = np.abs(gauss(rng, (T, k), 1.0))
    scale = 1 + gauss(rng, (E,), 0.3)
    want = expert_scale_ref(experts, weights, scale)
    _, got, _ = run(lambda s, e, w_, sc: expert_scale(e, w_, sc, s), experts, weights, scale)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("R,D", [(1, 1), (3, 19), (2, 640), (5, 2816)])
@pytest.mark.parametrize("std", STDS)
def test_scale_rms_norm(R, D, std):
    check_scale_rms_norm(np.random.default_rng([R, D, int(std * 10)]), R, D, std)


@pytest.mark.parametrize("R,N", [(1, 1), (2, 989), (1, 262144)])
@pytest.mark.parametrize("std", STDS)
def test_softcap(R, N, std):
    check_softcap(np.random.default_rng([R, N, int(std * 10)]), R, N, std, 30.0)


@pytest.mark.parametrize("T,L,P", [(1, 1, 1), (3, 5, 19), (7, 35, 256)])
@pytest.mark.parametrize("std", STDS)
def test_per_layer_inputs(T, L, P, std):
    check_per_layer_inputs(np.random.default_rng([T, L, P, int(std * 10)]), T, L, P, std)


@pytest.mark.parametrize("T,k,E", [(1, 1, 1), (3, 2, 8), (111, 8, 128)])
def test_expert_scale(T, k, E):
    check_expert_scale(np.random.default_rng([T, k, E]), T, k, E)


def check_moe_layer_end(rng, R, D, std):
    """Residual x at std, the MLP's and the experts' outputs o, y at other scales (the norms take
    any), norm weights and the scale about 1."""
    from impnb.kernels.elementwise.moe_layer_end import moe_layer_end, moe_layer_end_ref

    x, o, y = gauss(rng, (R, D), std), gauss(rng, (R, D), 3.0), gauss(rng, (R, D), 0.05)
    w1, w2, wf, wn = (1 + gauss(rng, (D,), 0.3) for _ in range(4))
    scale = (1 + gauss(rng, (1,), 0.3)).astype(np.float32)
    h = np.full((R, D), np.nan, np.float32)
    want_x, want_h = moe_layer_end_ref(x, o, y, w1, w2, wf, scale, wn, EPS)
    got = run(lambda s, *d: moe_layer_end(*d, EPS, s), x, o, y, w1, w2, wf, scale, wn, h)
    assert_close(got[0], want_x.astype(np.float64), 1e-5, 1e-5 * (np.abs(x) + 1), f"moe_layer_end x {R}x{D} std {std}")
    assert_close(got[-1], want_h.astype(np.float64), 1e-5, 1e-5, f"moe_layer_end h {R}x{D} std {std}")


@pytest.mark.parametrize("R,D", [(1, 1), (3, 19), (5, 2816), (111, 640)])
@pytest.mark.parametrize("std", STDS)
def test_moe_layer_end(R, D, std):
    check_moe_layer_end(np.random.default_rng([R, D, int(std * 10)]), R, D, std)
