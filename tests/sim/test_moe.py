"""MoE kernels in numba's CUDA simulator on tiny shapes, through tests/gpu/test_moe.py's checks."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from impnb import tuning
from impnb.kernels.gemv.gemv import SILU
from impnb.kernels.moe.router_batch import OWN, RANKED, SCAN
from tests.gpu import test_moe as moe


def test_route_ties_and_k():
    rng = np.random.default_rng(0)
    for k, normalize in ((1, True), (2, False), (8, True)):
        moe.check_route(rng, 3, 40, k, normalize, 1.0)
    moe.check_route(rng, 2, 40, 4, True, 1.0, ties=True)
    for E in (128, 97, 160):  # a lane's queue full, ragged, and past it (the rescanning form)
        moe.check_route(rng, 2, E, 8, True, 1.0, ties=True)
        moe.check_route(rng, 2, E, 8, False, 3.0)


def test_gemv_route():
    rng = np.random.default_rng(5)
    moe.check_gemv_route(rng, T.F32, 40, 64, 2, 3, True, 1.0)
    moe.check_gemv_route(rng, T.Q8_0, 8, 32, 1, 2, False, 1.0, calls=1)
    moe.check_gemv_route(rng, T.F32, 12, 64, 1, 4, True, 3.0, calls=1, normed=True, quant=True)
    moe.check_gemv_route(rng, T.F32, 2, 32, 3, 1, True, 1.0, calls=1, quant=True)  # fewer blocks than tokens
    moe.check_gemv_route(rng, T.F32, 21, 64, 2, 8, False, 1.0, calls=1, ties=True)


def test_gemv_route_stacked():
    """A shared expert gate's row under the experts' (n_routed E): logit E written, the route
    and its softmax over the first E alone (the extra logit made to lead in the float types)."""
    rng = np.random.default_rng(8)
    moe.check_gemv_route(rng, T.F32, 9, 64, 3, 2, False, 1.0, calls=1, stacked=True)
    moe.check_gemv_route(rng, T.F32, 12, 64, 1, 4, True, 3.0, calls=1, normed=True, quant=True, stacked=True)
    moe.check_gemv_route(rng, T.F16, 7, 64, 2, 3, False, 10.0, calls=1, normed=True, stacked=True)
    moe.check_gemv_route(rng, T.Q8_0, 8, 32, 1, 2, True, 0.1, calls=1, stacked=True)
    moe.check_gemv_route(rng, T.F32, 21, 64, 2, 8, False, 1.0, calls=1, ties=True, stacked=True)


@pytest.mark.parametrize("direct", [SCAN, OWN, RANKED])
def test_router_batch(direct, monkeypatch):
    """Fewer rows than a pass, two passes, two groupings, ties; with and without h in int8; a
    token a tile grouped by scans, each slot its own tile, or by ranks (direct)."""
    monkeypatch.setattr(tuning, "ROUTER_DIRECT", direct)
    rng = np.random.default_rng(9)
    moe.check_router_batch(rng, 6, 64, 3, 2, True, 1.0, (2, 1), calls=1)
    moe.check_router_batch(rng, 5, 32, 9, 3, False, 3.0, (4,), quant=False, calls=1)
    moe.check_router_batch(rng, 8, 48, 2, 2, True, 1.0, (1,), calls=1, ties=True)


def test_down_sum():
    rng = np.random.default_rng(6)
    moe.check_down_sum(rng, T.Q8_0, 4, 8, 64, 2, 3, 1.0, accumulate=True)
    moe.check_down_sum(rng, T.Q4_K, 3, 5, 256, 1, 2, 1.0)


def test_down_sum_dp4a():
    rng = np.random.default_rng(7)
    moe.check_down_sum(rng, T.Q8_0, 4, 9, 64, 2, 3, 1.0, accumulate=True, dp4a=True)
    moe.check_down_sum(rng, T.Q4_K, 3, 8, 256, 1, 2, 3.0, dp4a=True)
    moe.check_down_sum(rng, T.Q6_K, 3, 10, 256, 1, 1, 0.1, dp4a=True)
    moe.check_down_sum(rng, T.Q4_0, 3, 9, 1280, 1, 2, 1.0, dp4a=True)  # F past the early builds'


def test_down_sum_dp4a_next_input():
    """The tail writing the next layer's int8 input: one block; 4 blocks a token, 2 tokens."""
    rng = np.random.default_rng(8)
    moe.check_down_next_input(rng, T.Q8_0, 3, 16, 64, 1, 2, 1.0)
    moe.check_down_next_input(rng, T.NVFP4, 4, 32, 128, 2, 2, 3.0)


def test_group_invariants():
    rng = np.random.default_rng(1)
    moe.check_group(rng, 5, 8, 2, 3)
    moe.check_group(rng, 4, 8, 2, 64, same=True)
    moe.check_group(rng, 1, 16, 8, 1)
    moe.check_group(rng, 7, 37, 3, 2)  # E past a power of two: the scan's last round


def test_gemv_experts():
    rng = np.random.default_rng(2)
    moe.check_gemv_experts(rng, T.Q8_0, 4, 8, 64, 2, 2, SILU, 1.0)
    moe.check_gemv_experts(rng, T.Q4_K, 3, 6, 256, 1, 2, 0, 1.0)


def test_gemm_grouped():
    rng = np.random.default_rng(3)
    moe.check_gemm_grouped(rng, T.Q8_0, 4, 8, 64, 5, 2, 1.0)
    moe.check_gemm_grouped(rng, T.F32, 4, 16, 32, 3, 2, 1.0, gathered=False)


def test_combine():
    moe.check_combine(np.random.default_rng(4), 3, 2, 200, 1.0)
    moe.check_combine(np.random.default_rng(5), 2, 3, 130, 4.0, accumulate=True)


def test_combine_next():
    moe.check_combine_next(np.random.default_rng(6), 3, 2, 512, 1.0, True, 2)
    moe.check_combine_next(np.random.default_rng(7), 2, 3, 512, 10.0, False, 0)
    moe.check_combine_next(np.random.default_rng(8), 3, 2, 512, 1.0, True, 1, vq=True)
    moe.check_combine_next(np.random.default_rng(9), 3, 2, 512, 1.0, True, 1, vq=True, early=True)
