"""The routed experts' int8 tensor-core GEMM grouped by expert (kernels/moe/gemm_mmq_grouped.py) on
the GPU against gemm_mmq_grouped_ref (x̂ · dequant(W_e) in float64: the bound is float32
summation, tests/gpu/test_gemm_mmq.check_bound's, and through a GLU its product's), every type
it takes, plain and gate|up with SiLU / GELU: x̂ of the tokens (x_div = k) or of the grouped rows
(x_div 0), experts over several tiles and experts without tokens, output rows past a block's
slab, the tile array's rows past n_tiles poisoned, outputs NaN-poisoned; Gaussian x at three
magnitudes with outlier columns."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.elementwise.activations import geglu_ref, swiglu_ref
from impnb.kernels.gemm.quant_x32 import QuantX32, quantize_x32_ref
from impnb.kernels.gemv.gemv_units import GELU, NO_GLU, SILU
from impnb.kernels.moe.gemm_mmq_grouped import TOKENS, gemm_mmq_grouped, gemm_mmq_grouped_ref
from impnb.kernels.moe.moe import max_tiles
from impnb.kernels.moe.reference import group_ref
from impnb.quants import dequantize
from tests.gpu import test_gemm_tc as gemm_tests
from tests.gpu.test_gemm_mmq import activations

pytestmark = pytest.mark.gpu


def check_grouped(ggml_type, E, n_rows, K, n_tok, k, glu, seed, x_div=True, std=1.0):
    """n_tok tokens' k routed slots (every third token on the first token's experts, so some
    experts span several tiles; experts 0 and E - 1 given none), tiles of TOKENS rows in expert
    order: y against the float64 twin within float32 summation (times |up| + |act(gate)| through
    a GLU)."""
    raw, w16, w = gemm_tests.weight(ggml_type, E * n_rows, K)
    rng = np.random.default_rng(seed)
    experts = 1 + np.argsort(rng.random((n_tok, E - 2)), axis=1)[:, :k].astype(np.int32)
    experts[::3] = experts[0]
    slots = experts.reshape(-1)
    S = slots.shape[0]
    order = np.argsort(slots, kind="stable").astype(np.int32)
    _, tiles = group_ref(slots, E, TOKENS)
    padded = np.full((max_tiles(S, E, TOKENS), 3), -1, np.int32)
    padded[:len(tiles)] = tiles
    x = activations(n_tok if x_div else S, K, std, seed)
    q, ds = quantize_x32_ref(x)
    out_rows = n_rows // 2 if glu else n_rows
    d_y = cuda.to_device(np.full((S, out_rows), np.nan, np.float32))
    gemm_mmq_grouped(QuantX32(cuda.to_device(q), cuda.to_device(ds)), w, n_rows, d_y, cuda.to_device(padded),
                     cuda.to_device(np.array([len(tiles)], np.int32)), cuda.to_device(order), k if x_div else 0, 0,
                     glu)
    got = d_y.copy_to_host().astype(np.float64)
    assert np.isfinite(got).all(), f"{np.count_nonzero(~np.isfinite(got))} non-finite outputs (poison left?)"
    # the plain products first (gate and up apart with a GLU), then through the GLU
    ref = gemm_mmq_grouped_ref(q, ds, raw, ggml_type, n_rows, order, tiles, k if x_div else 0)
    xs = np.abs(dequantize_rows(q, ds))[order // k if x_div else np.arange(S)]
    wa = np.abs(dequantize(raw.view(np.uint8).reshape(raw.shape[0], -1), ggml_type).astype(np.float64))
    mag = np.stack([xs[r] @ wa[slots[order[r]] * n_rows:(slots[order[r]] + 1) * n_rows].T for r in range(S)])
    bound = (K / 32 + 16) * 2.0 ** -21 * mag
    if glu:
        F = out_rows
        gate, up = ref[:, :F], ref[:, F:]
        want = (geglu_ref if glu == GELU else swiglu_ref)(gate, up)
        bound = 2 * (bound[:, F:] * np.abs(gate) + bound[:, :F] * np.abs(up)) + 2.0 ** -20 * np.abs(want) + 1e-30
    else:
        want = ref
    err = np.abs(got - want)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), (f"{np.count_nonzero(err > bound)} outputs out of bound; worst at {worst} "
                                  f"(slot {order[worst[0]]}): err {err[worst]:.3e} > {bound[worst]:.3e}")


def dequantize_rows(q, ds):
    from impnb.kernels.gemm.quant_x32 import dequantize_x32_ref

    return dequantize_x32_ref(q, ds)


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K, T.Q8_0])
@pytest.mark.parametrize("glu", [NO_GLU, SILU, GELU])
def test_grouped(ggml_type, glu):
    n_rows = 2 * 99 if glu else 133  # a block's slab of 64 / 128 rows left ragged
    check_grouped(ggml_type, 12, n_rows, 512, 13, 4, glu, seed=1, x_div=bool(glu), std=0.1)
    check_grouped(ggml_type, 12, n_rows, 256, 30, 8, glu, seed=2, x_div=not glu, std=10.0)


@pytest.mark.parametrize("ggml_type,K,n_rows,glu", [(T.Q4_K, 2048, 1536, SILU), (T.Q6_K, 768, 2048, NO_GLU),
                                                   (T.Q4_K, 768, 2048, NO_GLU)])
def test_30b_shapes(ggml_type, K, n_rows, glu):
    """The 30B-A3B's expert matrices (gate|up 2 x 768 x 2048, down 2048 x 768) at 32 tokens, k 8."""
    check_grouped(ggml_type, 32, n_rows, K, 32, 8, glu, seed=K, x_div=bool(glu))
