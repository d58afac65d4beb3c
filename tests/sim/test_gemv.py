"""GEMV kernels in numba's CUDA simulator, every weight type, against dequantize + float64 matmul.

Tolerance: |y - ref| <= 1e-4 * (|W| @ |x|) per output. Row groups of 1, 2 and 4 warps (32, 64,
128 chunks per row) and both rows-per-group settings (T <= 2, T > 2) run, and the T = 1 variants
(unrolled steps, more rows per group) on odd rows with chunks per row past one step. The simulator has no warp
shuffles, so there warp_sum goes through shared memory; everything else is the GPU code path.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemv.gemv import DECODERS, SILU, SWEEP_TYPES, Variant, gemv, gemv_ref, sweep
from impnb.kernels.common.repack import repack
from impnb.quants import dequantize
from tests.test_repack import make_weight

RTOL = 1e-4


def run_gemv(raw, ggml_type, x, y0=None, variant=None):
    w = repack(raw, ggml_type).to_device()
    y = np.full((x.shape[0], raw.shape[0]), np.nan, np.float32) if y0 is None else y0.copy()
    d_y = cuda.to_device(y)
    gemv(w, cuda.to_device(x), d_y, 0, accumulate=y0 is not None, variant=variant)
    return d_y.copy_to_host()


def check(raw, ggml_type, x, y):
    ref = gemv_ref(raw, ggml_type, x)
    wd = dequantize(raw, ggml_type).reshape(raw.shape[0], -1).astype(np.float64)
    bound = RTOL * (np.abs(x.astype(np.float64)) @ np.abs(wd).T) + 1e-30
    err = np.abs(y - ref)
    assert np.isfinite(y).all()
    assert (err <= bound).all(), f"max err/bound {np.max(err / bound):.3g}"


@pytest.mark.parametrize("ggml_type,rows,n_tok,cols",
                         [(t, *((3, 1, 256), (5, 3, 512))[i % 2]) for i, t in enumerate(DECODERS)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_gemv_matches_reference(ggml_type, rows, n_tok, cols):
    # odd row counts: the last block's second row is clamped, computed and dropped; each type at
    # one of the two shapes (T <= 2 and T > 2 row groups), the shapes alternating over the types
    rng = np.random.default_rng([int(ggml_type), n_tok, cols])
    raw = make_weight(ggml_type, rows, cols, rng)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    check(raw, ggml_type, x, run_gemv(raw, ggml_type, x))


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K, T.Q4_1], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok,cols", [(1, 2048), (2, 4096)])
def test_gemv_wide_rows(ggml_type, n_tok, cols):
    # 64 and 128 chunks per row: row groups of 2 and 4 warps, reduced through shared memory
    rng = np.random.default_rng([int(ggml_type), cols])
    raw = make_weight(ggml_type, 3, cols, rng)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    check(raw, ggml_type, x, run_gemv(raw, ggml_type, x))


def test_gemv_19_rows():
    rng = np.random.default_rng(19)
    raw = make_weight(T.Q4_K, 19, 256, rng)
    x = (rng.standard_normal((1, 256)) * 10).astype(np.float32)
    check(raw, T.Q4_K, x, run_gemv(raw, T.Q4_K, x))


@pytest.mark.parametrize("ggml_type,cols", [(T.Q4_K, 256), (T.Q8_0, 4096)], ids=str)
def test_gemv_accumulates_into_y(ggml_type, cols):
    rng = np.random.default_rng(5)
    raw = make_weight(ggml_type, 3, cols, rng)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    y0 = rng.standard_normal((2, 3)).astype(np.float32)
    y = run_gemv(raw, ggml_type, x, y0)
    check(raw, ggml_type, x, (y - y0).astype(np.float64))


@pytest.mark.parametrize("ggml_type,n_tok", [(T.Q4_K, 1), (T.Q6_K, 2), (T.Q8_0, 3)], ids=str)
def test_gemv_split_qkv(ggml_type, n_tok):
    from tests.gpu.test_gemv import check_fused

    check_fused(ggml_type, 256, (13, 5, 6), n_tok, 0, seed=n_tok)


@pytest.mark.parametrize("ggml_type,glu,cols", [(T.Q4_K, 1, 256), (T.Q5_0, 2, 2048)], ids=str)
def test_gemv_glu(ggml_type, glu, cols):
    from tests.gpu.test_gemv import check_fused

    check_fused(ggml_type, cols, (7, 7), 1, glu, seed=glu)


@pytest.mark.parametrize("ggml_type", SWEEP_TYPES, ids=lambda t: t.name)
def test_gemv_variants(ggml_type):
    # 7 rows, 72 chunks per row: steps of span * unroll chunks end part way, clamped loads skipped
    rng = np.random.default_rng([int(ggml_type), 72])
    raw = make_weight(ggml_type, 7, 2304, rng)
    for i, v in enumerate(sweep(ggml_type)):
        x = (rng.standard_normal((1, 2304)) * (0.1, 1.0, 10.0)[i % 3]).astype(np.float32)
        check(raw, ggml_type, x, run_gemv(raw, ggml_type, x, variant=v))


@pytest.mark.parametrize("ggml_type", [t for t in DECODERS if t not in SWEEP_TYPES], ids=lambda t: t.name)
def test_gemv_unrolled_other_types(ggml_type):
    rng = np.random.default_rng([int(ggml_type), 9])
    raw = make_weight(ggml_type, 5, 768, rng)
    x = rng.standard_normal((1, 768)).astype(np.float32)
    check(raw, ggml_type, x, run_gemv(raw, ggml_type, x, variant=Variant(32, 4, 2)))


@pytest.mark.parametrize("ggml_type,variant", [(T.Q4_K, Variant(32, 2, 4)), (T.Q6_K, Variant(64, 1, 4)),
                                               (T.Q8_0, Variant(32, 4, 8))], ids=str)
def test_gemv_variant_fused(ggml_type, variant):
    from tests.gpu.test_gemv import check_fused
    from tests.gpu.test_moe import check_gemv_experts

    check_fused(ggml_type, 2304, (13, 5, 6), 1, 0, seed=1, variant=variant)
    # gate|up at K = 768 and experts' SiLU at small x: the simulator's exp overflows on large sums
    check_fused(ggml_type, 768, (9, 9), 1, SILU, seed=2, variant=variant)
    rng = np.random.default_rng(3)
    check_gemv_experts(rng, ggml_type, 3, 10, 2304, 2, 2, SILU, 0.1, variant)
    check_gemv_experts(rng, ggml_type, 3, 5, 2304, 1, 2, 0, 10.0, variant)


@pytest.mark.parametrize("ggml_type,n_tok", [(T.Q4_1, 1), (T.Q4_K, 2), (T.Q8_0, 8)], ids=str)
def test_gemv_norm(ggml_type, n_tok):
    """The pre-norm fused (W RMSNorm(x) wn): plain with accumulation, Q|K|V splits, gate|up."""
    from tests.gpu.test_gemv import check_gemv_norm

    check_gemv_norm(ggml_type, 256, (5,), n_tok, 0, 10.0, seed=1, accumulate=True)
    check_gemv_norm(ggml_type, 2048, (3, 2, 2), n_tok, 0, 0.1, seed=2)
    if n_tok <= 2:
        check_gemv_norm(ggml_type, 256, (4, 4), n_tok, SILU, 1.0, seed=3)


def test_gemv_pair():
    """Two weight types in one launch (Q|K Q4_K, V Q6_K), the pre-norm fused."""
    from tests.gpu.test_gemv import check_gemv_pair

    check_gemv_pair(T.Q4_K, T.Q6_K, 256, (5, 3), 3, 1, 1.0, seed=4)
    check_gemv_pair(T.Q8_0, T.Q4_1, 256, (4, 2), 5, 2, 10.0, seed=5)


@pytest.mark.parametrize("ggml_type,rows,cols,n_tok,post", [(T.Q4_K, 12, 256, 1, True), (T.Q8_0, 20, 512, 2, False),
                                                            (T.Q6_K, 4, 256, 3, True)], ids=str)
def test_gemv_residual(ggml_type, rows, cols, n_tok, post):
    """The residual tail run by the grid's last block (grids of 1 and 2+ blocks), twice."""
    from tests.gpu.test_gemv import check_gemv_residual

    check_gemv_residual(ggml_type, rows, cols, n_tok, post, 1.0, seed=rows)
