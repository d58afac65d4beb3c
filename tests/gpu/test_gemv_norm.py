"""The decode GEMV with the residual norm in its prologue (gemv_norm.py), every weight type,
against gemv_norm_ref (rms_norm in float32, dequantize + float64 matmul).

Tolerance: x' within 1e-6 relative of the reference (Gemma's post-norm adds a normalized o);
each output |y - ref| <= 1e-4 * (|W| @ |h|) with h the reference's normalized input, as
test_gemv.py. x, o Gaussian at std 0.1, 1, 10; norm weights Gaussian around 1; outputs and x'
poisoned with NaN. The check runs in the simulator too (tests/sim/test_gemv_norm.py).
"""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.gemv import DECODERS, GELU, NO_GLU, SILU
from impnb.kernels.gemv_norm import fits, gemv_norm, gemv_norm_ref
from impnb.kernels.norm import rms_norm_ref
from impnb.kernels.repack import repack
from impnb.quants import dequantize
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu

RTOL = 1e-4
EPS = 1e-6


def check_gemv_norm(ggml_type, rows, cols, post, glu, splits, std, seed):
    """rows weight rows (2F with glu); splits: output widths summing to rows (no glu)."""
    rng = np.random.default_rng(seed)
    raw = make_weight(ggml_type, rows, cols, rng)
    w = repack(raw, ggml_type).to_device()
    if not fits(w, 1, glu != NO_GLU):
        pytest.skip(f"{ggml_type.name}: no fused GLU at T = 1 (odd rows per group)")
    x = (rng.standard_normal((1, cols)) * std).astype(np.float32)
    o = (rng.standard_normal((1, cols)) * std).astype(np.float32)
    w_post = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32) if post else None
    w_norm = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    widths = [rows // 2] if glu != NO_GLU else splits
    stream = cuda.stream()
    d = {name: cuda.to_device(a, stream=stream) for name, a in
         (("x", x), ("o", o), ("w_norm", w_norm), ("x_out", np.full_like(x, np.nan)))}
    d_post = cuda.to_device(w_post, stream=stream) if post else None
    ys = [cuda.to_device(np.full((1, n), np.nan, np.float32), stream=stream) for n in widths]
    gemv_norm(w, d["x"], d["o"], d_post, d["w_norm"], d["x_out"], EPS, ys, stream, glu)
    x_out = d["x_out"].copy_to_host(stream=stream)
    got = np.concatenate([y.copy_to_host(stream=stream) for y in ys], axis=1).astype(np.float64)
    stream.synchronize()

    x_ref, y_ref = gemv_norm_ref(raw, ggml_type, x, o, w_post, w_norm, EPS)
    assert np.allclose(x_out, x_ref, rtol=1e-6, atol=1e-6 * std), "residual x' differs"
    h = np.abs(rms_norm_ref(x_ref, w_norm, EPS).astype(np.float64))
    wabs = np.abs(dequantize(raw, ggml_type).reshape(rows, cols).astype(np.float64))
    bound = RTOL * (h @ wabs.T)
    if glu != NO_GLU:  # act(gate) * up from the reference rows
        F = rows // 2
        gate, up = y_ref[:, :F], y_ref[:, F:]
        act = gate / (1 + np.exp(-gate)) if glu == SILU else \
            0.5 * gate * (1 + np.tanh(0.7978845608 * (gate + 0.044715 * gate ** 3)))
        y_ref = act * up
        bound = bound[:, :F] * (np.abs(up) + np.abs(gate)) + bound[:, F:] * np.abs(act) + 1e-30
    assert np.isfinite(got).all(), "non-finite output"
    err = np.abs(got - y_ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), f"err {err[worst]:.3e} > {bound[worst]:.3e} at {worst}"


TYPES = list(DECODERS)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("post", [False, True], ids=["add", "post_add"])
def test_gemv_norm_qkv_split(ggml_type, post):
    # SmolLM2's attn_qkv (576 + 192 + 192 rows, K 576) and a wide K with odd splits
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_gemv_norm(ggml_type, 960, 576, post, NO_GLU, [576, 192, 192], std, [int(ggml_type), i])
    check_gemv_norm(ggml_type, 19 + 38 + 55, 2048, post, NO_GLU, [19, 38, 55], 1.0, [int(ggml_type), 9])


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("glu", [SILU, GELU], ids=["silu", "gelu"])
def test_gemv_norm_glu(ggml_type, glu):
    # gate|up of SmolLM2 (2 x 1536, K 576) and Gemma3 (2 x 2048, K 640)
    for i, (rows, cols) in enumerate(((3072, 576), (4096, 640))):
        check_gemv_norm(ggml_type, rows, cols, glu == GELU, glu, None, (0.1, 10.0)[i], [int(ggml_type), glu, i])
