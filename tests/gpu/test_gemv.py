"""Quantized GEMV on the GPU, every weight type, real model shapes and odd row counts.

Reference: gguf's dequantize, then a float64 matmul. Tolerance: |y - ref| <= 1e-4 * (|W| @ |x|)
per output (the kernel accumulates in float32 from exact weights; its sum-of-x factoring rounds
relative to |x|). Outputs are NaN-poisoned before each launch; x is Gaussian at std 0.1, 1, 10.
"""

from functools import lru_cache

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemv.gemv import DECODERS, SILU, SWEEP_TYPES, gemv, gemv_ref, sweep
from impnb.kernels.common.repack import repack
from impnb.quants import dequantize
from tests.gpu.cases import fitting
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu

RTOL = 1e-4
TYPES = list(DECODERS)
# (N rows, K): SmolLM2 ffn_down, Gemma3 ffn_gate, odd row counts; K/32 chunks per row pick row groups
# of one warp (K <= 1024), two (<= 2048) or four (the 14336 case below)
SHAPES = [(576, 1536), (2048, 640), (19, 576), (111, 2048), (989, 640), (640, 1024), (19, 2048)]


@lru_cache(maxsize=4)
def weight(ggml_type, rows, cols):
    raw = make_weight(ggml_type, rows, cols, np.random.default_rng([int(ggml_type), rows, cols]))
    wd = dequantize(raw, ggml_type).reshape(rows, cols).astype(np.float64)
    return raw, np.abs(wd), repack(raw, ggml_type).to_device()


def check_gemv(ggml_type, rows, cols, n_tok, std, seed, accumulate=False, variant=None):
    raw, wabs, w = weight(ggml_type, rows, cols)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_tok, cols)) * std).astype(np.float32)
    y0 = (rng.standard_normal((n_tok, rows)) * std).astype(np.float32)
    stream = cuda.stream()
    d_y = cuda.to_device(y0 if accumulate else np.full((n_tok, rows), np.nan, np.float32), stream=stream)
    gemv(w, cuda.to_device(x, stream=stream), d_y, stream, accumulate=accumulate, variant=variant)
    y = d_y.copy_to_host(stream=stream)
    stream.synchronize()
    assert np.isfinite(y).all(), "non-finite output"
    got = y.astype(np.float64) - (y0 if accumulate else 0)
    ref = gemv_ref(raw, ggml_type, x)
    bound = RTOL * (np.abs(x.astype(np.float64)) @ wabs.T) + (np.abs(y0) * 1e-6 if accumulate else 0)
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), f"err {err[worst]:.3e} > {bound[worst]:.3e} at {worst}"


@pytest.mark.parametrize("ggml_type,rows,cols", fitting(TYPES, SHAPES))
@pytest.mark.parametrize("n_tok", [1, 3, 8])
def test_gemv(ggml_type, rows, cols, n_tok):
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_gemv(ggml_type, rows, cols, n_tok, std, seed=[rows, cols, n_tok, i])


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 8])
def test_gemv_4096x14336(ggml_type, n_tok):
    check_gemv(ggml_type, 4096, 14336, n_tok, 1.0, seed=n_tok)
    check_gemv(ggml_type, 2047, 4096, n_tok, 3.0, seed=n_tok + 1)  # wide K, under WIDE_MIN_ROWS rows


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q8_0, T.Q6_K], ids=lambda t: t.name)
def test_gemv_every_token_count(ggml_type):
    for n_tok in range(1, 9):
        check_gemv(ggml_type, 111, 512, n_tok, 1.0, seed=n_tok)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_gemv_accumulate(ggml_type):
    for n_tok in (1, 3):
        check_gemv(ggml_type, 989, 1024, n_tok, 1.0, seed=[7, n_tok], accumulate=True)


def check_fused(ggml_type, cols, splits, n_tok, glu, seed, variant=None):
    """Stacked rows (Q|K|V splits, or gate|up with glu) against the unfused float64 reference."""
    from impnb.kernels.elementwise.activations import geglu_ref, swiglu_ref
    from impnb.kernels.gemv.gemv import GELU
    from impnb.kernels.gemv.gemv_stacked import gemv_glu, gemv_split

    rows = sum(splits)
    raw, wabs, w = weight(ggml_type, rows, cols)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    ref = gemv_ref(raw, ggml_type, x)
    stream = cuda.stream()
    d_x = cuda.to_device(x, stream=stream)
    if glu:
        F = rows // 2
        d_y = cuda.to_device(np.full((n_tok, F), np.nan, np.float32), stream=stream)
        gemv_glu(w, d_x, d_y, glu, stream, variant)
        y = d_y.copy_to_host(stream=stream)
        gate, up = ref[:, :F].astype(np.float32), ref[:, F:].astype(np.float32)
        want = (geglu_ref if glu == GELU else swiglu_ref)(gate, up)
        bound = RTOL * 10 * (np.abs(want) + np.abs(up) * (np.abs(x.astype(np.float64)) @ wabs[:F].T))
        assert np.isfinite(y).all() and (np.abs(y - want) <= bound + 1e-6).all()
        return
    ys = [cuda.to_device(np.full((n_tok, n), np.nan, np.float32), stream=stream) for n in splits]
    gemv_split(w, d_x, ys, stream, variant)
    y = np.concatenate([d.copy_to_host(stream=stream) for d in ys], axis=1)
    bound = RTOL * (np.abs(x.astype(np.float64)) @ wabs.T)
    assert np.isfinite(y).all() and (np.abs(y - ref) <= bound).all()


def check_gemv_norm(ggml_type, cols, splits, n_tok, glu, std, seed, accumulate=False):
    """The normed kernels (the pre-norm fused: W RMSNorm(x) wn) against RMSNorm in float64, then
    the float64 GEMV: plain (one split, optionally accumulating), Q|K|V splits or gate|up (glu)."""
    from impnb.kernels.elementwise.activations import swiglu_ref
    from impnb.kernels.gemv.gemv_stacked import gemv_glu, gemv_split
    from impnb.kernels.elementwise.norm import rms_norm_ref

    rows = sum(splits)
    raw, wabs, w = weight(ggml_type, rows, cols)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_tok, cols)) * std).astype(np.float32)
    wn = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    eps = 1e-5
    xn = rms_norm_ref(x, wn, eps)
    ref = gemv_ref(raw, ggml_type, xn)
    bound = RTOL * (np.abs(xn.astype(np.float64)) @ wabs.T) + 1e-5 * np.abs(ref)
    stream = cuda.stream()
    d_x, d_wn = cuda.to_device(x, stream=stream), cuda.to_device(wn, stream=stream)
    if glu:
        F = rows // 2
        d_y = cuda.to_device(np.full((n_tok, F), np.nan, np.float32), stream=stream)
        gemv_glu(w, d_x, d_y, glu, stream, norm=(d_wn, eps))
        y = d_y.copy_to_host(stream=stream)
        gate, up = ref[:, :F], ref[:, F:]
        want = swiglu_ref(gate.astype(np.float32), up.astype(np.float32))
        tol = 10 * (np.abs(want) * 1e-5 + np.abs(up) * bound[:, :F] + np.abs(gate) * bound[:, F:])
        assert np.isfinite(y).all() and (np.abs(y - want) <= tol + 1e-6).all()
        return
    y0 = (rng.standard_normal((n_tok, rows)) * std).astype(np.float32)
    ys = [cuda.to_device(np.full((n_tok, n), np.nan, np.float32) if not accumulate else y0, stream=stream)
          for n in splits]
    if len(splits) == 1:
        gemv(w, d_x, ys[0], stream, accumulate, norm=(d_wn, eps))
    else:
        gemv_split(w, d_x, ys, stream, norm=(d_wn, eps))
    y = np.concatenate([d.copy_to_host(stream=stream) for d in ys], axis=1).astype(np.float64)
    got = y - (y0 if accumulate else 0)
    assert np.isfinite(y).all()
    err = np.abs(got - ref)
    assert (err <= bound + (np.abs(y0) * 1e-6 if accumulate else 0)).all(), f"max err/bound {np.max(err / bound):.3g}"


def check_gemv_pair(type_a, type_b, cols, splits, rows_b, n_tok, std, seed):
    """gemv_pair: W_a (rows split into two outputs) and W_b of another type, both times
    RMSNorm(x) wn in one launch, each against RMSNorm in float64 then the float64 GEMV."""
    from impnb.kernels.gemv.gemv_stacked import gemv_pair
    from impnb.kernels.elementwise.norm import rms_norm_ref

    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_tok, cols)) * std).astype(np.float32)
    wn = (1 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    eps = 1e-6
    xn = rms_norm_ref(x, wn, eps)
    stream = cuda.stream()
    (raw_a, wabs_a, wa), (raw_b, wabs_b, wb) = weight(type_a, sum(splits), cols), weight(type_b, rows_b, cols)
    ys = [cuda.to_device(np.full((n_tok, n), np.nan, np.float32), stream=stream) for n in (*splits, rows_b)]
    gemv_pair(wa, ys[:2], wb, ys[2], cuda.to_device(x, stream=stream), (cuda.to_device(wn, stream=stream), eps),
              stream)
    y = [d.copy_to_host(stream=stream).astype(np.float64) for d in ys]
    for got, raw, t, wabs in ((np.concatenate(y[:2], axis=1), raw_a, type_a, wabs_a), (y[2], raw_b, type_b, wabs_b)):
        ref = gemv_ref(raw, t, xn)
        bound = RTOL * (np.abs(xn.astype(np.float64)) @ wabs.T) + 1e-5 * np.abs(ref)
        assert np.isfinite(got).all() and (np.abs(got - ref) <= bound).all(), \
            f"{t.name}: max err/bound {np.max(np.abs(got - ref) / bound):.3g}"


@pytest.mark.parametrize("types", [(T.Q4_K, T.Q6_K), (T.Q8_0, T.Q4_1), (T.Q6_K, T.Q8_0)], ids=str)
@pytest.mark.parametrize("n_tok", [1, 2, 5])
def test_gemv_pair(types, n_tok):
    """Qwen3-30B-A3B Q4_K_M's Q|K (Q4_K) and V (Q6_K) at K 2048, the tiny qwen3moe's Q8_0 and
    Q4_1, and B's rows odd; x at three magnitudes."""
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_gemv_pair(*types, 2048, (4096, 512), 512, n_tok, std, seed=[n_tok, i])
        check_gemv_pair(*types, 768, (576, 192), 191, n_tok, std, seed=[n_tok, i, 1])


@pytest.mark.parametrize("ggml_type", (T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.F16), ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 2, 8])
def test_gemv_norm(ggml_type, n_tok):
    """SmolLM2's Q|K|V and gate|up (K 768 where 576 is no whole K-quant block), a wide K;
    x at three magnitudes; o-proj style accumulation."""
    K = 576 if ggml_type not in (T.Q4_K, T.Q6_K) else 768
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_gemv_norm(ggml_type, K, (576, 192, 192), n_tok, 0, std, seed=[n_tok, i])
        check_gemv_norm(ggml_type, 2048, (989,), n_tok, 0, std, seed=[n_tok, i, 1], accumulate=i == 1)
    if n_tok <= 2:  # gate|up runs as one GEMV where the row groups are even (glu_fits)
        check_gemv_norm(ggml_type, K, (1536, 1536), n_tok, SILU, 1.0, seed=[n_tok, 2])


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 2, 5])
def test_gemv_split_qkv(ggml_type, n_tok):
    check_fused(ggml_type, 768, (576, 192, 192), n_tok, 0, seed=[int(ggml_type), n_tok])


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok,glu,cols", [(1, 1, 768), (1, 2, 2048), (2, 1, 1536)])
def test_gemv_glu(ggml_type, n_tok, glu, cols):
    check_fused(ggml_type, cols, (1538 // 2, 1538 // 2), n_tok, glu, seed=[int(ggml_type), glu])


# -- T = 1 kernel variants (span, unroll, rows; gemv_variants.sweep), each against the reference:
#    every type on plain rows at real shapes, odd rows and chunks per row past one step, and Q|K|V
#    splits; gate|up with SiLU for the swept types; routed experts with and without SiLU for the
#    expert types (Q4_K, Q6_K) and Q8_0. First run: ~130 kernels to compile (bench_gemv --sweep
#    leaves the swept types' in the disk cache). --

def variant_cases(types):
    return [pytest.param(t, v, id=f"{t.name}-{v.name}") for t in types for v in sweep(t)]


@pytest.mark.parametrize("ggml_type,variant", variant_cases(TYPES))
def test_gemv_variant(ggml_type, variant):
    for i, (rows, cols) in enumerate(((576, 1536), (111, 2048), (19, 14336), (989, 768))):
        check_gemv(ggml_type, rows, cols, 1, (0.1, 1.0, 10.0)[i % 3], seed=[rows, i], variant=variant)
    check_gemv(ggml_type, 111, 2304, 1, 1.0, seed=3, accumulate=True, variant=variant)
    check_fused(ggml_type, 768, (576, 192, 192), 1, 0, seed=int(ggml_type), variant=variant)


@pytest.mark.parametrize("ggml_type,variant", variant_cases(SWEEP_TYPES))
def test_gemv_glu_variant(ggml_type, variant):
    check_fused(ggml_type, 2048, (769, 769), 1, SILU, seed=int(ggml_type), variant=variant)


@pytest.mark.parametrize("ggml_type,variant", variant_cases((T.Q4_K, T.Q6_K, T.Q8_0)))
def test_gemv_experts_variant(ggml_type, variant):
    from tests.gpu.test_moe import check_gemv_experts

    rng = np.random.default_rng([int(ggml_type), variant.span, variant.unroll])
    for E, N, K, T_, k, glu, std in ((8, 2 * 77, 2048, 1, 8, SILU, 1.0), (16, 130, 768, 3, 4, 0, 0.1),
                                     (4, 64, 2304, 2, 2, SILU, 10.0)):
        check_gemv_experts(rng, ggml_type, E, N, K, T_, k, glu, std, variant)


def check_gemv_residual(ggml_type, rows, cols, n_tok, post, std, seed, calls=2):
    """The residual tail (gemv_tail.py): y = W x against the float64 GEMV, then x_res and h against
    float64 math on the kernel's own y (tail_calls)."""
    from impnb.kernels.gemv.gemv_residual import gemv_residual

    raw, wabs, w = weight(ggml_type, rows, cols)

    def run(x, d_y, res, stream):
        gemv_residual(w, cuda.to_device(x, stream=stream), d_y, res, stream)

    def check_y(x, y):
        assert (np.abs(y - gemv_ref(raw, ggml_type, x)) <= RTOL * (np.abs(x.astype(np.float64)) @ wabs.T)).all()

    tail_calls(run, check_y, rows, cols, n_tok, post, std, seed, calls)


def tail_calls(run, check_y, rows, cols, n_tok, post, std, seed, calls):
    """`calls` runs of a GEMV with the residual tail on fresh Gaussian inputs: run(x, d_y, res,
    stream) launches it (x on the host), check_y(x, y) holds its y, then x_res and h against float64
    math on that y: x_res += y (or RMSNorm(y) * w_post), h = RMSNorm(x_res) * w_next; the ticket
    counter must come back to zero after each."""
    from impnb.kernels.gemv.gemv_tail import Residual

    rng = np.random.default_rng(seed)
    stream = cuda.stream()
    eps = 1e-6
    w_post, w_next = ((1 + 0.3 * rng.standard_normal(rows)).astype(np.float32) for _ in range(2))
    d_wp, d_wn = cuda.to_device(w_post, stream=stream), cuda.to_device(w_next, stream=stream)
    counter = cuda.to_device(np.zeros(1, np.uint32), stream=stream)
    for _ in range(calls):
        x = (rng.standard_normal((n_tok, cols)) * std).astype(np.float32)
        xr = (rng.standard_normal((n_tok, rows)) * 3 * std).astype(np.float32)
        d_y, d_h = (cuda.to_device(np.full((n_tok, rows), np.nan, np.float32), stream=stream) for _ in range(2))
        d_xr = cuda.to_device(xr, stream=stream)
        run(x, d_y, Residual(d_xr, d_h, d_wn, d_wp if post else None, eps, counter), stream)
        y, x_new, h = (d.copy_to_host(stream=stream) for d in (d_y, d_xr, d_h))
        stream.synchronize()
        assert np.isfinite(y).all() and np.isfinite(x_new).all() and np.isfinite(h).all()
        check_y(x, y)
        check_residual_update(xr, y.astype(np.float64), x_new.astype(np.float64), h.astype(np.float64),
                              w_post if post else None, w_next, eps)
        assert counter.copy_to_host()[0] == 0


def check_residual_update(xr, y, x_new, h, w_post, w_next, eps):
    """gemv_tail's update of x_res (xr before, x_new after) and h against float64 math on the
    kernel's own output y: x_res += y (or RMSNorm(y) * w_post), h = RMSNorm(x_res) * w_next."""
    term = y / np.sqrt(np.mean(y * y, axis=1, keepdims=True) + eps) * w_post if w_post is not None else y
    x_ref = xr + term
    mag = np.abs(xr) + np.abs(term)
    assert (np.abs(x_new - x_ref) <= 1e-5 * mag + 1e-30).all(), np.max(np.abs(x_new - x_ref) / mag)
    inv = 1 / np.sqrt(np.mean(x_ref * x_ref, axis=1, keepdims=True) + eps)
    h_ref = x_ref * inv * w_next
    assert (np.abs(h - h_ref) <= 1e-5 * (mag * inv * np.abs(w_next) + np.abs(h_ref)) + 1e-30).all()


@pytest.mark.parametrize("ggml_type,rows,cols,post", [
    (T.Q4_K, 640, 1024, True), (T.Q6_K, 640, 2048, True), (T.Q4_K, 2048, 4096, False),
    (T.Q8_0, 644, 768, False), (T.Q4_1, 12, 256, True), (T.Q5_0, 20, 576, False), (T.Q4_K, 2816, 512, True)],
    ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("n_tok", [1, 3, 8])
def test_gemv_residual(ggml_type, rows, cols, post, n_tok):
    """Gemma3's attn_output / ffn_down (post-norm), Qwen3-30B-A3B's attn_output (wide K, add), odd
    row counts, a grid of one block (12 rows), Gemma-4's width (2816, several float4s a tail
    thread); x at three magnitudes."""
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_gemv_residual(ggml_type, rows, cols, n_tok, post, std, seed=[rows, n_tok, i])
