"""The MoE references the GPU kernels are tested against (kernels/moe/moe.py), and the grouping's
size bound: the tiles moe_group writes never exceed the buffer max_tiles sizes."""

import numpy as np
import pytest

from impnb.kernels.moe.moe import combine_ref, group_ref, max_tiles, route_ref


def test_route_ref_ties_go_to_the_lower_expert():
    logits = np.array([[1.0, 3.0, 3.0, 0.5, 3.0]], np.float32)
    experts, weights = route_ref(logits, 2, normalize=True)
    assert experts.tolist() == [[1, 2]]
    np.testing.assert_allclose(weights, [[0.5, 0.5]], rtol=1e-6)
    experts, weights = route_ref(logits, 1, normalize=False)
    p = np.exp(logits[0] - 3.0)
    assert experts.tolist() == [[1]] and np.isclose(weights[0, 0], 1 / p.sum())


@pytest.mark.parametrize("tm", [1, 7, 64])
def test_group_ref_segments_and_tiles(tm):
    rng = np.random.default_rng(tm)
    experts = np.stack([rng.choice(16, 4, replace=False) for _ in range(37)]).astype(np.int32)
    seg, tiles = group_ref(experts, 16, tm)
    assert np.array_equal(np.diff(seg), np.bincount(experts.reshape(-1), minlength=16))
    for e in range(16):  # an expert's tiles cover its segment in order, each at most tm rows
        mine = tiles[tiles[:, 0] == e]
        assert mine[:, 2].sum() == seg[e + 1] - seg[e] and (mine[:, 2] <= tm).all()
        assert np.array_equal(mine[:, 1], seg[e] + tm * np.arange(len(mine)))


@pytest.mark.parametrize("T,E,k,tm", [(1, 128, 8, 1), (512, 128, 8, 64), (19, 8, 2, 64), (100, 512, 1, 64),
                                      (33, 3, 3, 2)])
def test_max_tiles_bounds_every_routing(T, E, k, tm):
    rng = np.random.default_rng([T, E, k])
    routings = [np.stack([rng.choice(E, k, replace=False) for _ in range(T)]),
                np.tile(np.arange(k), (T, 1)),                        # every token the same experts
                (np.arange(T * k) % E).reshape(T, k)]                 # spread as thin as possible
    for experts in routings:
        n = len(group_ref(experts.astype(np.int32), E, tm)[1])
        assert n <= max_tiles(T * k, E, tm), (n, max_tiles(T * k, E, tm))


def test_combine_ref():
    y = np.arange(12, dtype=np.float32).reshape(6, 2)
    rows = np.array([5, 0, 1, 2, 3, 4], np.int32)
    weights = np.array([[0.5, 0.25], [1.0, 0.0], [0.0, 2.0]], np.float32)
    out = combine_ref(y, rows, weights)
    np.testing.assert_allclose(out, [[0.5 * y[5] + 0.25 * y[0]][0], y[1], 2 * y[4]])


def test_check_experts_refuses_what_the_kernels_cannot_route():
    from dataclasses import dataclass

    from impnb.errors import UnsupportedError
    from impnb.kernels.moe.moe import MAX_EXPERTS, MAX_K, check_experts

    @dataclass
    class Cfg:
        n_expert: int
        n_expert_used: int
        post_norms: bool = False

    check_experts(Cfg(128, 8))
    # post-norms: decode fuses the pre-norms into the expert GEMVs, with no residual tail
    for bad in (Cfg(128, MAX_K + 1), Cfg(MAX_EXPERTS + 1, 2), Cfg(8, 0), Cfg(128, 8, True)):
        with pytest.raises(UnsupportedError, match="use --device cpu"):
            check_experts(bad)


@pytest.mark.parametrize("std", [0.1, 1.0, 10.0])
def test_fold_ref_is_the_router_of_the_updated_residual(std):
    """router_fold's identity: W_r (RMSNorm(x + W_o a) * wn) = (Wx x + Wa a) / rms(x + W_o a) to
    within the fp16 rounding of Wx and Wa (2^-11 of each term), and the same experts, on Gaussian
    weights and inputs of odd sizes."""
    from impnb.kernels.elementwise.norm import rms_norm_ref
    from impnb.kernels.moe.router_fold import fold_ref

    rng = np.random.default_rng(int(std * 10))
    E, D, K, eps = 37, 96, 160, 1e-6
    w_r = (rng.standard_normal((E, D)) * D ** -0.5).astype(np.float32)
    wn = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    w_o = (rng.standard_normal((D, K)) * K ** -0.5).astype(np.float32)
    x = (rng.standard_normal((3, D)) * 3 * std).astype(np.float32)
    a = (rng.standard_normal((3, K)) * std).astype(np.float32)
    y = x + a @ w_o.T
    direct = rms_norm_ref(y, wn, eps) @ w_r.T
    fold = fold_ref(w_r, wn, w_o)
    assert fold.wx.dtype == fold.wa.dtype == np.float16
    wx, wa = fold.wx.astype(np.float64), fold.wa.astype(np.float64)
    rms = np.sqrt((y.astype(np.float64) ** 2).mean(1, keepdims=True) + eps)
    folded = (x @ wx.T + a @ wa.T) / rms
    bound = 2.0 ** -11 * (np.abs(x) @ np.abs(wx).T + np.abs(a) @ np.abs(wa).T) / rms \
        + 1e-4 * np.abs(direct) + 1e-5 * np.abs(direct).max()
    assert (np.abs(folded - direct) <= bound).all(), f"worst {np.max(np.abs(folded - direct) / bound):.2f} of the bound"
    assert np.array_equal(route_ref(folded.astype(np.float32), 4, True)[0], route_ref(direct, 4, True)[0])
