"""The dp4a GEMV and its int8 activations on the GPU, every dp4a type, real model shapes, odd rows.

quantize_x must equal quantize_x_ref bit for bit. The GEMV is checked twice per output:
- against gemv_dp4a_ref (gguf's dequantize, float64 matmul on the dequantized x̂):
  |y - ref| <= 1e-4 * (|W| @ |x̂|), float32 accumulation of exact integer dots;
- against the float64 product with x itself: the error may grow by at most |W| @ e, e[k] =
  amax of k's 16-column group / 254 (x̂'s rounding bound), so a wrong scale or group shows.
The normed quantize_x (RMSNorm(x) * w fused) is held to x̂'s rounding bound around the float64
norm; gate|up (GLU) to act(gate) * up of gemv_dp4a_ref's rows. Outputs are NaN-poisoned; x is Gaussian at std 0.1, 1, 10.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.elementwise.activations import geglu_ref, swiglu_ref
from impnb.kernels.gemv.gemv import gemv_ref
from impnb.kernels.gemv.gemv_dp4a import GELU, NO_GLU, SILU, Variant, gemv_dp4a, gemv_dp4a_ref
from impnb.kernels.gemv.gemv_dp4a_experts import gemv_dp4a_experts
from impnb.kernels.gemv.gemv_dp4a_units import DP4A_TYPES
from impnb.kernels.gemv.gemv_dp4a_variants import T1_CAPPED, choose_capped
from impnb.kernels.elementwise.norm import rms_norm_ref
from impnb.kernels.gemv.quant_x import GROUP, quant_x_buffers, quantize_x, quantize_x_ref
from tests.gpu.cases import fitting
from tests.gpu.test_gemv import weight

pytestmark = pytest.mark.gpu

RTOL = 1e-4
SHAPES = [(576, 1536), (2048, 640), (19, 576), (111, 2048), (989, 640), (640, 1024), (19, 2048)]


def check_quantize_x(x, stream=0):
    """quantize_x on the device equals quantize_x_ref; returns the reference (q, d, s)."""
    n_tok, K = x.shape
    out = quant_x_buffers(n_tok + 1, K)  # one spare row: only the first T are written
    for a in out:
        a.copy_to_device(np.full(a.shape, 0xFFFFFFFF, np.uint32).view(a.dtype), stream=stream)
    quantize_x(cuda.to_device(x, stream=stream), out, stream)
    got = [a.copy_to_host(stream=stream) for a in out]
    if hasattr(stream, "synchronize"):
        stream.synchronize()
    ref = quantize_x_ref(x)
    for name, g, r in zip(("q", "d", "s"), got, ref):
        assert np.array_equal(g[:n_tok].view(np.uint32), r.view(np.uint32)), f"quantize_x {name} differs"
        assert (g[n_tok].view(np.uint32) == 0xFFFFFFFF).all(), f"quantize_x wrote past T rows ({name})"
    return out, ref


def check_gemv_dp4a(raw, wabs, w, x, accumulate=False, variant=None, rng=None, run=None):
    """One gemv_dp4a call (or run, of gemv_dp4a's arguments) on x (T, K) against both references;
    the weight as test_gemv.weight."""
    n_tok, K = x.shape
    rows = raw.shape[0]
    stream = cuda.stream()
    xq, (q, d, _) = check_quantize_x(x, stream)
    y0 = (rng.standard_normal((n_tok, rows)) if accumulate else np.full((n_tok, rows), np.nan)).astype(np.float32)
    d_y = cuda.to_device(y0, stream=stream)
    (run or gemv_dp4a)(w, xq, d_y, stream, accumulate=accumulate, variant=variant)
    y = d_y.copy_to_host(stream=stream)
    stream.synchronize()
    assert np.isfinite(y).all(), "non-finite output"
    got = y.astype(np.float64) - (y0 if accumulate else 0)
    xhat = q.view(np.int8).reshape(n_tok, -1, GROUP).astype(np.float64) * d[:, :, None]
    xhat = xhat.reshape(n_tok, K)
    slack = np.abs(y0) * 1e-6 if accumulate else 0
    ref = gemv_dp4a_ref(raw, w.ggml_type, q, d)
    bound = RTOL * (np.abs(xhat) @ wabs.T) + slack
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), f"vs x̂: err {err[worst]:.3e} > {bound[worst]:.3e} at {worst}"
    e = np.repeat(np.abs(x.astype(np.float64)).reshape(n_tok, -1, GROUP).max(axis=2), GROUP, axis=1) / 254
    bound_x = (e * 1.001) @ wabs.T + RTOL * (np.abs(x.astype(np.float64)) @ wabs.T) + slack
    err_x = np.abs(got - gemv_ref(raw, w.ggml_type, x))
    worst = np.unravel_index(np.argmax(err_x / bound_x), err_x.shape)
    assert (err_x <= bound_x).all(), f"vs x: err {err_x[worst]:.3e} > {bound_x[worst]:.3e} at {worst}"


def check_quantize_x_norm(x, wn, eps):
    """The normed quantize_x: every x̂ within half its group's step of RMSNorm(x) * wn (plus the
    norm's float32 rounding), and s = d * sum(q) exactly."""
    n_tok, K = x.shape
    out = quant_x_buffers(n_tok, K)
    for a in out:
        a.copy_to_device(np.full(a.shape, 0xFFFFFFFF, np.uint32).view(a.dtype))
    quantize_x(cuda.to_device(x), out, 0, norm=(cuda.to_device(wn), eps))
    assert_normed_int8(out, x, wn, eps)


def assert_normed_int8(xq, x, wn, eps):
    """xq (QuantX on the device) is RMSNorm(x) * wn in int8: every x̂ within half its group's step
    (plus the norm's float32 rounding), s = d * sum(q) exactly, nothing poisoned left."""
    n_tok = x.shape[0]
    q, d, s = (a.copy_to_host() for a in xq)
    assert np.isfinite(d).all() and np.isfinite(s).all()
    qv = q.view(np.int8).reshape(n_tok, -1, GROUP)
    assert np.array_equal(s, d * qv.astype(np.int32).sum(axis=2).astype(np.float32))
    xn = rms_norm_ref(x, wn, eps).astype(np.float64).reshape(n_tok, -1, GROUP)
    err = np.abs(qv * d[:, :, None].astype(np.float64) - xn)
    assert (err <= d[:, :, None] / 2 * 1.001 + 1e-5 * np.abs(xn)).all(), f"max err {err.max():.3g}"


def check_glu(ggml_type, F, cols, n_tok, glu, seed, variant=None, run=None, std=1.0, w=None):
    """gate|up stacked (2F, cols): act(gate x̂) * up x̂ against the float64 rows of gemv_dp4a_ref;
    run: another launcher of gemv_dp4a's arguments; w: the weight's (raw, wabs, packed), else a
    fresh one."""
    raw, wabs, w = w or weight(ggml_type, 2 * F, cols)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_tok, cols)) * std).astype(np.float32)
    xq, (q, d, _) = check_quantize_x(x)
    d_y = cuda.to_device(np.full((n_tok, F), np.nan, np.float32))
    (run or gemv_dp4a)(w, xq, d_y, 0, variant=variant, glu=glu)
    y = d_y.copy_to_host()
    ref = gemv_dp4a_ref(raw, ggml_type, q, d)
    gate, up = ref[:, :F].astype(np.float32), ref[:, F:].astype(np.float32)
    want = (geglu_ref if glu == GELU else swiglu_ref)(gate, up)
    xhat = np.abs((q.view(np.int8).reshape(n_tok, -1, GROUP) * d[:, :, None]).reshape(n_tok, cols))
    bound = RTOL * 10 * (np.abs(want) + np.abs(up) * (xhat @ wabs[:F].T) + np.abs(gate) * (xhat @ wabs[F:].T))
    assert np.isfinite(y).all() and (np.abs(y - want) <= bound + 1e-6).all()


def check_experts(ggml_type, E, n_rows, cols, n_tok, k, glu, seed):
    """Routed experts, T tokens with k slots each (x̂ row s // k), some experts chosen twice:
    each slot against gemv_dp4a_ref of its expert's rows (act(gate) * up with glu)."""
    raw, wabs, w = weight(ggml_type, E * n_rows, cols)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    xq, (q, d, _) = check_quantize_x(x)
    slots = rng.integers(0, E, n_tok * k).astype(np.int32)
    slots[-1] = slots[0]
    out_rows = n_rows // 2 if glu else n_rows
    d_y = cuda.to_device(np.full((n_tok * k, out_rows), np.nan, np.float32))
    gemv_dp4a_experts(w, n_rows, xq, d_y, cuda.to_device(slots), k, 0, glu=glu)
    y = d_y.copy_to_host()
    assert np.isfinite(y).all(), "non-finite output"
    for s_, e in enumerate(slots):
        assert_expert_row(y[s_], raw, wabs, ggml_type, e, n_rows, q, d, s_ // k, glu, f"slot {s_} (expert {e})")


def assert_expert_row(y, raw, wabs, ggml_type, e, n_rows, q, d, xrow, glu, what):
    """y (one output row) = expert e's rows (n_rows of raw) times x̂ row xrow (q, d) within the
    dp4a bound of gemv_dp4a_ref (act(gate) * up's with glu)."""
    cols = wabs.shape[1]
    xhat = np.abs((q[xrow].view(np.int8).reshape(-1, GROUP) * d[xrow][:, None]).reshape(cols))
    rows = slice(e * n_rows, (e + 1) * n_rows)
    ref = gemv_dp4a_ref(raw[rows], ggml_type, q[xrow:xrow + 1], d[xrow:xrow + 1])[0]
    bound = RTOL * (xhat @ wabs[rows].T)
    if glu:
        F = n_rows // 2
        gate, up = ref[:F].astype(np.float32), ref[F:].astype(np.float32)
        want = (geglu_ref if glu == GELU else swiglu_ref)(gate, up)
        tol = 10 * (np.abs(want) * RTOL + np.abs(up) * bound[:F] + np.abs(gate) * bound[F:]) + 1e-6
        assert np.isfinite(y).all() and (np.abs(y - want) <= tol).all(), what
    else:
        assert np.isfinite(y).all() and (np.abs(y - ref) <= bound).all(), what


def check_dp4a_residual(ggml_type, rows, cols, n_tok, post, std, seed, calls=2, variant=None):
    """gemv_dp4a_residual: y bit-equal to gemv_dp4a's on the same x̂ (held to the references
    above), then x_res and h as gemv_residual's test holds its tail (test_gemv.tail_calls)."""
    from impnb.kernels.gemv.gemv_dp4a import gemv_dp4a_residual
    from tests.gpu.test_gemv import tail_calls

    _, _, w = weight(ggml_type, rows, cols)
    plain = {}

    def run(x, d_y, res, stream):
        xq = quant_x_buffers(*x.shape)
        quantize_x(cuda.to_device(x, stream=stream), xq, stream)
        d_plain = cuda.to_device(np.full(d_y.shape, np.nan, np.float32), stream=stream)
        gemv_dp4a(w, xq, d_plain, stream, variant=variant)
        plain["y"] = d_plain
        gemv_dp4a_residual(w, xq, d_y, res, stream, variant=variant)

    def check_y(x, y):
        want = plain["y"].copy_to_host()
        assert np.isfinite(want).all() and np.array_equal(y.view(np.uint32), want.view(np.uint32))

    tail_calls(run, check_y, rows, cols, n_tok, post, std, seed, calls)


def check_case(ggml_type, rows, cols, n_tok, std, seed, **kw):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_tok, cols)) * std).astype(np.float32)
    check_gemv_dp4a(*weight(ggml_type, rows, cols), x, rng=rng, **kw)


@pytest.mark.parametrize("n_tok,K", [(1, 16), (1, 640), (3, 2048), (8, 14336)])
def test_quantize_x(n_tok, K):
    rng = np.random.default_rng([n_tok, K])
    for std in (0.1, 1.0, 10.0):
        x = (rng.standard_normal((n_tok, K)) * std).astype(np.float32)
        x[0, :GROUP] = 0.0  # an all-zero group: scale 0, quants 0
        x[-1, -1] = 1e4  # one outlier in the last group
        check_quantize_x(x)


@pytest.mark.parametrize("ggml_type,rows,cols", fitting(DP4A_TYPES, SHAPES))
@pytest.mark.parametrize("n_tok", [1, 2, 3, 8])
def test_gemv_dp4a(ggml_type, rows, cols, n_tok):
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_case(ggml_type, rows, cols, n_tok, std, seed=[rows, cols, n_tok, i])


@pytest.mark.parametrize("ggml_type", DP4A_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 8])
def test_gemv_dp4a_4096x14336(ggml_type, n_tok):
    check_case(ggml_type, 4096, 14336, n_tok, 1.0, seed=n_tok)


@pytest.mark.parametrize("ggml_type,glu,long", list(T1_CAPPED), ids=str)
def test_gemv_dp4a_register_capped(ggml_type, glu, long):
    """The kernels choose_capped caps (T = 1, K from 4096, or from LONG_K), odd rows; plain: stored
    and added."""
    rows = 1 + max(T1_CAPPED[ggml_type, glu, long][2], 1000)
    cols = 14336 if long else 4096
    assert choose_capped(ggml_type, 1, cols, SILU if glu else NO_GLU, rows)[1]
    for i, std in enumerate((0.1, 1.0, 10.0)):
        if glu:
            check_glu(ggml_type, rows, cols, 1, SILU, seed=[rows, i])
        else:
            check_case(ggml_type, rows, cols, 1, std, seed=[rows, i], accumulate=i == 1)


@pytest.mark.parametrize("ggml_type", DP4A_TYPES, ids=lambda t: t.name)
def test_gemv_dp4a_accumulate_and_variants(ggml_type):
    check_case(ggml_type, 989, 1024, 1, 1.0, seed=7, accumulate=True)
    for v in (Variant(32, 1, 4), Variant(64, 1, 8), Variant(128, 1, 2), Variant(128, 1, 8), Variant(64, 2, 4),
              Variant(128, 2, 4), Variant(32, 2, 8), Variant(64, 3, 2), Variant(32, 4, 2), Variant(128, 3, 4)):
        check_case(ggml_type, 111, 2048, 1, 1.0, seed=[8, v.span, v.rows, v.unroll], variant=v)
    # depth 3 and 4 at a long row: windows that turn over several times (14 and 7 steps a thread)
    for v in (Variant(32, 3, 2), Variant(64, 4, 2)):
        check_case(ggml_type, 37, 14336, 1, 1.0, seed=[9, v.span, v.unroll], variant=v)


@pytest.mark.parametrize("n_tok,K", [(1, 576), (8, 576), (5, 960), (3, 2048), (8, 2064), (8, 4096)])
def test_quantize_x_norm(n_tok, K):
    """A block a row up to 2048 columns (SmolLM2's 576), rows over several blocks past it."""
    rng = np.random.default_rng([n_tok, K, 1])
    wn = (1 + 0.3 * rng.standard_normal(K)).astype(np.float32)
    for std in (0.1, 1.0, 10.0):
        check_quantize_x_norm((rng.standard_normal((n_tok, K)) * std).astype(np.float32), wn, 1e-6)


@pytest.mark.parametrize("ggml_type", DP4A_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok,glu", [(1, SILU), (2, GELU), (8, SILU)])
def test_gemv_dp4a_glu(ggml_type, n_tok, glu):
    check_glu(ggml_type, 771, 1024, n_tok, glu, seed=[int(ggml_type), n_tok])


@pytest.mark.parametrize("ggml_type", DP4A_TYPES, ids=lambda t: t.name)
def test_gemv_dp4a_experts(ggml_type):
    check_experts(ggml_type, 8, 2 * 77, 2048, 1, 8, SILU, seed=[int(ggml_type), 1])
    check_experts(ggml_type, 16, 130, 768 if ggml_type not in (T.Q4_K, T.Q5_K, T.Q6_K) else 1024, 3, 4, NO_GLU,
                  seed=[int(ggml_type), 2])
    # Gemma-4-26B-A4B's: GELU, 704 rows an expert over 2816 columns, two tokens of 8 slots
    check_experts(ggml_type, 12, 2 * 704, 2816, 2, 8, GELU, seed=[int(ggml_type), 3])


@pytest.mark.parametrize("ggml_type", DP4A_TYPES, ids=lambda t: t.name)
def test_gemv_dp4a_residual(ggml_type):
    """The residual tail on the dp4a GEMV: Gemma 4's attn_output (2816 x 4096, post-norm) and a
    down of 2112 columns (K-quants: 2304), a plain add at three tokens on 780 rows (a multiple of
    4, as the tail takes, and not of a block's rows), a grid of one block; x at three magnitudes."""
    down = 2112 if ggml_type not in (T.Q4_K, T.Q5_K, T.Q6_K) else 2304
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_dp4a_residual(ggml_type, 2816, 4096, 1, True, std, seed=[int(ggml_type), i])
    check_dp4a_residual(ggml_type, 2816, down, 1, True, 1.0, seed=[int(ggml_type), 3])
    check_dp4a_residual(ggml_type, 780, 2048, 3, False, 1.0, seed=[int(ggml_type), 4])
    check_dp4a_residual(ggml_type, 4, 2048, 1, True, 1.0, seed=[int(ggml_type), 5], variant=Variant(32, 1, 2))


def test_real_activation_outliers():
    """A residual-stream-like x: mostly small, a few huge columns (Gemma's), on Q4_K."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((1, 2048)) * 0.5).astype(np.float32)
    x[0, rng.choice(2048, 6, replace=False)] = rng.choice([-1, 1], 6) * 3000.0
    check_gemv_dp4a(*weight(T.Q4_K, 111, 2048), x, rng=rng)
