"""attn_output's dp4a GEMV with the MoE router folded in (kernels/moe/router_fold.py) on the GPU
against router_fold_ref:
- y = x + W_o â within 1e-4 of |W_o| @ |â| plus 1e-6 of |x| (float32 accumulation of exact
  integer dots, one float32 add);
- z = Wx x + Wa a within 1e-4 of |Wx| @ |x| + |Wa| @ |a| (fold_ref's fp16 Wx, Wa; fp32 sums);
- the experts equal route_ref of the kernel's own z / rms(y) (chosen on z, whose order that is
  but for rounding), the weights to rtol 1e-5;
- h, the int8 form of RMSNorm(y) * wn, within half a step of its group (plus 1e-5 for the norm's
  float32 rounding), s = d * sum(q) exactly, and no row past T written;
- the two ticket counters back to zero after each call.
Outputs are poisoned (NaN, -1, 0xFF...); x and a Gaussian at std 0.1, 1, 10.
check_router_fold runs one case; tests/sim/test_router_fold.py runs it on tiny shapes.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.moe.moe import route_ref
from impnb.kernels.gemv.quant_x import GROUP, QuantX, dequantize_x_ref, quant_x_buffers, quantize_x_ref
from impnb.kernels.common.repack import repack
from impnb.kernels.moe.router_fold import Fold, fold_ref, router_fold, router_fold_ref
from impnb.quants import dequantize
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu
STDS = (0.1, 1.0, 10.0)
POISON = 0xFFFFFFFF


def _poisoned(shape, dtype):
    """A device array of a 4-byte dtype, every word 0xFFFFFFFF (NaN, -1)."""
    return cuda.to_device(np.full(shape, POISON, np.uint32).view(dtype))


def check_router_fold(rng, ggml_type, E, D, K, T_, k, normalize, std, calls=2):
    raw = make_weight(ggml_type, D, K, rng)
    w = repack(raw, ggml_type).to_device()
    w_o = dequantize(raw, ggml_type).reshape(D, K)
    w_r = (rng.standard_normal((E, D)) * D ** -0.5).astype(np.float32)
    wn = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    eps = 1e-6
    fold = fold_ref(w_r, wn, w_o)
    d_fold, d_wn = Fold(*(cuda.to_device(f) for f in fold)), cuda.to_device(wn)
    counter = cuda.to_device(np.zeros(2, np.uint32))
    for _ in range(calls):
        x = (rng.standard_normal((T_, D)) * 3 * std).astype(np.float32)
        a = (rng.standard_normal((T_, K)) * std).astype(np.float32)
        aq = quantize_x_ref(a)
        d_aq = QuantX(*(cuda.to_device(v) for v in aq))
        d_y, d_z = _poisoned((T_, D), np.float32), _poisoned((T_, E), np.float32)
        d_e, d_w = _poisoned((T_, k), np.int32), _poisoned((T_, k), np.float32)
        hq = quant_x_buffers(T_ + 1, D)  # one spare row: only the first T are written
        for v in hq:
            v.copy_to_device(np.full(v.shape, POISON, np.uint32).view(v.dtype))
        router_fold(w, d_aq, cuda.to_device(a), cuda.to_device(x), d_y, d_fold, (d_wn, eps), d_z, k, normalize,
                    d_e, d_w, counter, QuantX(*(v[:T_] for v in hq)), 0)
        y, z, experts, weights = (v.copy_to_host() for v in (d_y, d_z, d_e, d_w))
        q, d, s = (v.copy_to_host() for v in hq)
        assert np.isfinite(y).all() and np.isfinite(z).all(), "non-finite output (poison left?)"
        y_ref, z_ref = router_fold_ref(raw, ggml_type, aq[:2], a, x, fold)
        ahat = dequantize_x_ref(aq[0], aq[1])
        bound = 1e-4 * np.abs(ahat) @ np.abs(w_o.astype(np.float64)).T + 1e-6 * np.abs(x) + 1e-30
        assert (np.abs(y - y_ref) <= bound).all(), f"y: worst {np.max(np.abs(y - y_ref) / bound):.2f} of the bound"
        bound = 1e-4 * (np.abs(x) @ np.abs(fold.wx.T).astype(np.float64) + np.abs(a) @ np.abs(fold.wa.T).astype(np.float64))
        assert (np.abs(z - z_ref) <= bound).all(), f"z: worst {np.max(np.abs(z - z_ref) / bound):.2f} of the bound"
        y64 = y.astype(np.float64)
        inv = 1 / np.sqrt((y64 * y64).mean(axis=1, keepdims=True) + eps)
        ref_e, ref_w = route_ref((z * inv.astype(np.float32)).astype(np.float32), k, normalize)
        assert np.array_equal(experts, ref_e), f"experts differ at {np.argwhere(experts != ref_e)[:4].tolist()}"
        np.testing.assert_allclose(weights, ref_w, rtol=1e-5, atol=1e-7)
        h = y64 * inv * wn
        amax = np.repeat(np.abs(h).reshape(T_, -1, GROUP).max(axis=2), GROUP, axis=1)
        got = dequantize_x_ref(q[:T_], d[:T_])
        assert (np.abs(got - h) <= amax / 254 * 1.001 + 1e-5 * np.abs(h)).all(), "h's int8 form off RMSNorm(y) * wn"
        sums = q[:T_].view(np.int8).reshape(T_, -1, GROUP).astype(np.int32).sum(axis=2).astype(np.float32)
        assert np.array_equal(s[:T_], d[:T_] * sums), "s is not d * sum(q)"
        for name, v in zip("qds", (q, d, s)):
            assert (v[T_].view(np.uint32) == POISON).all(), f"h's int8 form written past T rows ({name})"
        assert (counter.copy_to_host() == 0).all()


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q4_0, T.MXFP4, T.NVFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("T_,E,D,K,k", [(1, 128, 2048, 4096, 8), (2, 60, 1024, 1536, 4), (8, 128, 2048, 4096, 2),
                                        (3, 16, 768, 256, 1)])
@pytest.mark.parametrize("normalize", [True, False])
def test_router_fold(ggml_type, T_, E, D, K, k, normalize):
    """Qwen3-30B-A3B's attn_output and router (D 2048, H Dv 4096, 128 experts, k 8), odd expert
    counts, k 1..8, T 1..8, a row of a shorter than a block's float4s (K 256, 1536)."""
    rng = np.random.default_rng([int(ggml_type), T_, E, k, normalize])
    for std in STDS:
        check_router_fold(rng, ggml_type, E, D, K, T_, k, normalize, std)
