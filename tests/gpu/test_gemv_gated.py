"""gemv_gated (Qwen3.5's shared expert down at decode, its sigmoid gate read from the router's
logits) on the GPU against its numpy twin gemv_gated_ref, every weight type, odd row counts.

Reference: gguf's dequantize, a float64 matmul, times sigmoid(g) in float64. Tolerance: |y - ref|
<= 1e-4 * sigmoid(g) * (|W| @ |x|) per output (gemv's bound, scaled by the gate; the sigmoid's
own rounding, a few float32 ulps, is far under it), plus 1e-6 of |y0| where the kernel adds into
y0 (one float32 add). x Gaussian at std 0.1, 1, 10; the gates Gaussian at std 4 with one saturated
at each end (+-30); y NaN-poisoned (or Gaussian y0 where accumulating), and every column of the
gate buffer but the one read NaN.

check_gemv_gated runs one case; tests/sim/test_gemv_gated.py runs it on tiny shapes in the simulator.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.common.repack import repack
from impnb.kernels.gemv.gemv import DECODERS
from impnb.kernels.gemv.gemv_gated import gemv_gated, gemv_gated_ref
from impnb.quants import dequantize
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu

RTOL = 1e-4
STDS = (0.1, 1.0, 10.0)


def gates(rng, T_: int, G: int, col: int) -> np.ndarray:
    """(T, G) float32, NaN but column col: Gaussian at std 4, its first and last rows +30 and -30
    (where T allows)."""
    g = np.full((T_, G), np.nan, np.float32)
    g[:, col] = rng.standard_normal(T_) * 4
    g[0, col] = 30.0
    if T_ > 1:
        g[-1, col] = -30.0
    return g


def check_gemv_gated(rng, ggml_type, N, K, T_, std, accumulate=False, G=5, col=3, variant=None):
    """One launch of gemv_gated on fresh Gaussian x and gates against gemv_gated_ref (the module's
    tolerance); col < G is the gate buffer's column read."""
    raw = make_weight(ggml_type, N, K, rng)
    wabs = np.abs(dequantize(raw, ggml_type).reshape(N, K).astype(np.float64))
    x = (rng.standard_normal((T_, K)) * std).astype(np.float32)
    g = gates(rng, T_, G, col)
    y0 = (rng.standard_normal((T_, N)) * 3 * std).astype(np.float32)
    d_y = cuda.to_device(y0 if accumulate else np.full((T_, N), np.nan, np.float32))
    gemv_gated(repack(raw, ggml_type).to_device(), cuda.to_device(x), d_y, cuda.to_device(g), col, 0,
               accumulate=accumulate, variant=variant)
    y = d_y.copy_to_host()
    assert np.isfinite(y).all(), "non-finite output (poison left, or a NaN gate column read)"
    got = y.astype(np.float64) - (y0 if accumulate else 0)
    sig = 1.0 / (1.0 + np.exp(-g[:, col].astype(np.float64)))
    bound = RTOL * sig[:, None] * (np.abs(x.astype(np.float64)) @ wabs.T) + (np.abs(y0) * 1e-6 if accumulate else 0)
    err = np.abs(got - gemv_gated_ref(raw, ggml_type, x, g, col))
    worst = np.unravel_index(np.argmax(err / (bound + 1e-30)), err.shape)
    assert (err <= bound + 1e-30).all(), f"err {err[worst]:.3e} > {bound[worst]:.3e} at {worst}"


@pytest.mark.parametrize("ggml_type", list(DECODERS), ids=lambda t: t.name)
@pytest.mark.parametrize("T_", [1, 2, 8])
def test_gemv_gated(ggml_type, T_):
    """Qwen3.6-35B-A3B's shared down (2048 x 512), an odd row count (19), one row, a wider K (989
    rows x 2048: two-warp row groups); added into y at T 2."""
    rng = np.random.default_rng([int(ggml_type), T_])
    for (N, K), std in zip([(2048, 512), (19, 512), (1, 256), (989, 2048)], STDS + (1.0,)):
        check_gemv_gated(rng, ggml_type, N, K, T_, std, accumulate=T_ == 2)


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q8_0, T.F32], ids=lambda t: t.name)
def test_gemv_gated_every_token_count(ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    for T_ in range(1, 9):
        for std in STDS:
            check_gemv_gated(rng, ggml_type, 111, 512, T_, std, accumulate=T_ % 2 == 1, G=257, col=256)
