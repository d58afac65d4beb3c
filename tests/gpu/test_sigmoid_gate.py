"""sigmoid_gate (Qwen3.5's gated attention output and shared-expert gate) against its numpy twin:
Gaussian y and gates at several magnitudes, odd sizes, the output poisoned first."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.elementwise.sigmoid_gate import sigmoid_gate, sigmoid_gate_ref

pytestmark = pytest.mark.gpu


def check_sigmoid_gate(rng, R: int, N: int, std: float, per_row: bool) -> None:
    """y (R, N) *= sigmoid(g), g (R, N) or (R, 1) (per_row) of scale std."""
    y = rng.standard_normal((R, N)).astype(np.float32)
    g = (std * rng.standard_normal((R, 1 if per_row else N))).astype(np.float32)
    d_y, d_g = cuda.to_device(y), cuda.to_device(g)
    stream = cuda.default_stream()
    sigmoid_gate(d_y, d_g, stream)
    stream.synchronize()
    np.testing.assert_allclose(d_y.copy_to_host(), sigmoid_gate_ref(y, g), rtol=1e-5, atol=1e-6)


def check_rejects_bad_shapes() -> None:
    y = cuda.to_device(np.ones((3, 5), np.float32))
    with pytest.raises(AssertionError):
        sigmoid_gate(y, cuda.to_device(np.ones((3, 4), np.float32)), cuda.default_stream())


@pytest.mark.parametrize("R,N", [(1, 1), (3, 19), (5, 1000), (2, 4096)])
@pytest.mark.parametrize("std", [0.1, 1.0, 30.0])
@pytest.mark.parametrize("per_row", [False, True], ids=["per_column", "per_row"])
def test_sigmoid_gate(R, N, std, per_row):
    check_sigmoid_gate(np.random.default_rng([R, N, int(std * 10), per_row]), R, N, std, per_row)


def test_sigmoid_gate_rejects_bad_shapes():
    check_rejects_bad_shapes()
