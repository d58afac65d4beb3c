"""sigmoid_gate in the CUDA simulator: the GPU test's checks, tiny shapes."""

import numpy as np
import pytest

from tests.gpu.test_sigmoid_gate import check_rejects_bad_shapes, check_sigmoid_gate


@pytest.mark.parametrize("R,N,std,per_row", [(1, 1, 1.0, False), (2, 19, 30.0, False), (3, 300, 0.1, True),
                                             (1, 257, 1.0, True)])
def test_sigmoid_gate(R, N, std, per_row):
    check_sigmoid_gate(np.random.default_rng([R, N, int(std * 10)]), R, N, std, per_row)


def test_sigmoid_gate_rejects_bad_shapes():
    check_rejects_bad_shapes()
