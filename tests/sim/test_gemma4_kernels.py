"""gemma4's elementwise kernels in the CUDA simulator: the GPU tests' checks, tiny shapes, small
and Gemma-sized (1e2, 1e3) magnitudes."""

import numpy as np
import pytest

from tests.gpu.test_gemma4_kernels import (check_expert_scale, check_moe_layer_end, check_per_layer_inputs,
                                           check_scale_rms_norm, check_softcap)


@pytest.mark.parametrize("R,D,std", [(1, 1, 1.0), (2, 19, 1000.0), (1, 300, 100.0)], ids=str)
def test_scale_rms_norm(R, D, std):
    check_scale_rms_norm(np.random.default_rng([R, D]), R, D, std)


@pytest.mark.parametrize("R,N,std", [(1, 1, 0.1), (2, 19, 100.0), (1, 300, 1000.0)], ids=str)
def test_softcap(R, N, std):
    check_softcap(np.random.default_rng([R, N]), R, N, std, 30.0)


@pytest.mark.parametrize("T,L,P,std", [(1, 1, 1, 1.0), (2, 3, 19, 1000.0), (3, 2, 40, 100.0)], ids=str)
def test_per_layer_inputs(T, L, P, std):
    check_per_layer_inputs(np.random.default_rng([T, L, P]), T, L, P, std)


@pytest.mark.parametrize("T,k,E", [(1, 1, 1), (3, 2, 8), (5, 8, 130)], ids=str)
def test_expert_scale(T, k, E):
    check_expert_scale(np.random.default_rng([T, k, E]), T, k, E)


@pytest.mark.parametrize("R,D,std", [(1, 1, 1.0), (2, 19, 1000.0), (1, 300, 100.0)], ids=str)
def test_moe_layer_end(R, D, std):
    check_moe_layer_end(np.random.default_rng([R, D]), R, D, std)
