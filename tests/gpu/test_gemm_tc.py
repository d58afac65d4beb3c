"""Tensor-core GEMM tiles on the GPU against float64 on the dequantized weights.

Order of diagnosis: test_ptx.py (intrinsics, tile fragments), then test_quant_tile here (decoded
W tile and split A columns bit-exact), then the GEMMs.

Tolerance: A and the dequantized W are exactly fp16 and products of fp16 values are exact in fp32,
so all error is fp32 accumulation: each m16n8k16 step adds 16 products into the accumulator, K/16
steps in all. With at most 2 ulp (2^-22 relative) lost per step on the running sum,
|C - ref| <= (K/16 + 16) * 2^-22 * (|A| @ |W|ᵀ) per output (+ 2^-23 |C0| with accumulate). A layout
error (one wrong k or row) is larger than this by orders of magnitude. The relative RMS error must
stay under (K/16 + 16) * 2^-23: tensor cores round the running sum toward zero, a bias that grows
with the K/16 steps (~1e-5 at K = 1536); one misplaced k term alone gives ~1/sqrt(K).
"""

from functools import lru_cache

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemm.dequant import DECODERS, dequant_ref
from impnb.kernels.gemm.gemm_tc import F16_TILE, SMALL_TILE, gemm_f16, gemm_ref
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES, gemm, gemm_quant
from impnb.kernels.common.repack import repack
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu

# (M, N, K): odd M, N not a multiple of the tile, real model shapes; smaller N, K for big M
F16_SHAPES = [(1, 576, 1536), (7, 640, 2048), (19, 2048, 640), (111, 1536, 576), (989, 1024, 640),
              (4096, 256, 512), (130, 200, 96), (64, 192, 576), (300, 4096, 256)]
Q_SHAPES = [(1, 576, 1536), (7, 640, 2048), (19, 2048, 512), (111, 1536, 768), (989, 1024, 1024),
            (4096, 256, 512), (130, 200, 512)]
STDS = (0.1, 1.0, 10.0)


def check(got, ref, a, w16, K, c0=None):
    assert np.isfinite(got).all(), f"{np.count_nonzero(~np.isfinite(got))} non-finite outputs (poison left?)"
    bound = (K / 16 + 16) * 2.0 ** -22 * (np.abs(a.astype(np.float64)) @ np.abs(w16.astype(np.float64)).T)
    if c0 is not None:
        bound += 2.0 ** -23 * np.abs(c0)
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"{np.count_nonzero(err > bound)} outputs out of bound; worst at {worst}: "
                                  f"err {err[worst]:.3e} > {bound[worst]:.3e}")
    rel = np.sqrt(np.mean(err ** 2) / max(np.mean(ref ** 2), 1e-300))
    assert rel < (K / 16 + 16) * 2.0 ** -23, f"relative RMS error {rel:.2e}"


def run(fn, a, w, M, N, c0=None):
    stream = cuda.stream()
    d_c = cuda.to_device(c0 if c0 is not None else np.full((M, N), np.nan, np.float32), stream=stream)
    fn(cuda.to_device(a, stream=stream), w, d_c, stream, accumulate=c0 is not None)
    out = d_c.copy_to_host(stream=stream)
    stream.synchronize()
    return out.astype(np.float64)


@pytest.mark.parametrize("tile", [F16_TILE, SMALL_TILE, (128, 128, 2, 4, 3), (128, 128, 2, 4, 2)],
                         ids=["128x128x4", "64x128x4", "128x128x3", "128x128x2"])
@pytest.mark.parametrize("M,N,K", F16_SHAPES)
def test_gemm_f16(M, N, K, tile):
    rng = np.random.default_rng([M, N, K])
    w16 = rng.standard_normal((N, K)).astype(np.float16)
    d_w = cuda.to_device(w16)
    for std in STDS:
        a = (rng.standard_normal((M, K)) * std).astype(np.float16)
        got = run(lambda a_, w_, c_, s, accumulate: gemm_f16(a_, w_, c_, s, accumulate, tile=tile), a, d_w, M, N)
        check(got, gemm_ref(a, w16), a, w16, K)


def test_gemm_f16_4096_cube():
    rng = np.random.default_rng(0)
    M = N = K = 4096
    w16 = rng.standard_normal((N, K)).astype(np.float16)
    a = rng.standard_normal((M, K)).astype(np.float16)
    got = run(gemm_f16, a, cuda.to_device(w16), M, N)
    rows = rng.choice(M, 64, replace=False)  # float64 reference on a sample of rows
    check(got[rows], gemm_ref(a[rows], w16), a[rows], w16, K)


def test_gemm_f16_accumulate():
    rng = np.random.default_rng(1)
    M, N, K = 111, 640, 1024
    w16 = rng.standard_normal((N, K)).astype(np.float16)
    a = rng.standard_normal((M, K)).astype(np.float16)
    c0 = rng.standard_normal((M, N)).astype(np.float32) * 10
    got = run(gemm_f16, a, cuda.to_device(w16), M, N, c0)
    check(got, gemm_ref(a, w16, c=c0.astype(np.float64)), a, w16, K, c0)


@lru_cache(maxsize=4)
def weight(ggml_type, rows, cols):
    raw = make_weight(ggml_type, rows, cols, np.random.default_rng([int(ggml_type), rows, cols]))
    return raw, dequant_ref(raw, ggml_type), repack(raw, ggml_type).to_device()


TYPES = list(QUANT_TYPES) + [T.F16]


@pytest.mark.parametrize("ggml_type", list(QUANT_TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("M", [3, 128, 200])
def test_quant_tile(ggml_type, M):
    """One stage of gemm_quant: the decoded 128 x 32 W tile must equal dequant_ref's fp16 values at
    columns col(c, 0)..+16, col(c, 1)..+16 (as values: the decoders give +0 where gguf has -0, as
    test_dequant allows); the A tile must hold those columns of A bit for bit."""
    from tests.probes.ptx_probe import quant_tile_probe

    N, K = 100, 1024
    raw, w16, w = weight(ggml_type, N, K)
    col = DECODERS[ggml_type][2].py_func
    a = np.random.default_rng(M).standard_normal((M, K)).astype(np.float16)
    d_a = cuda.to_device(a)
    for c in (0, 1, 2, 5, 7, 8, 13, K // 32 - 1):
        cols = np.r_[col(c, 0):col(c, 0) + 16, col(c, 1):col(c, 1) + 16]
        a_tile = cuda.to_device(np.full((128, 16), 0xFFFFFFFF, np.uint32))
        w_tile = cuda.to_device(np.full((128, 16), 0xFFFFFFFF, np.uint32))
        quant_tile_probe(ggml_type)[1, 256](d_a, w.parts, np.int32(N), np.int32(c), a_tile, w_tile)
        got_w = w_tile.copy_to_host().view(np.float16)[:N]
        want_w = w16[:, cols]
        bad = np.argwhere(~((got_w == want_w) | (np.isnan(got_w) & np.isnan(want_w))))  # -0 == +0
        assert not len(bad), (f"chunk {c}: {len(bad)} W values differ, first (row, k slot) {bad[:4].tolist()}: "
                              f"got {got_w[tuple(bad[0])]} want {want_w[tuple(bad[0])]}")
        got_a = a_tile.copy_to_host().view(np.uint16)
        want_a = np.zeros((128, 32), np.uint16)
        want_a[:min(M, 128)] = a[:128, cols].view(np.uint16)
        bad = np.argwhere(got_a != want_a)
        assert not len(bad), f"chunk {c}: {len(bad)} A values differ, first (row, k slot) {bad[:4].tolist()}"


@pytest.mark.parametrize("ggml_type,M,N,K", [pytest.param(t, M, N, K, id=f"{t.name}-{M}x{N}x{K}")
                                             for t in TYPES for M, N, K in Q_SHAPES
                                             if K % (256 if t in (T.Q4_K, T.Q5_K, T.Q6_K) else 32) == 0])
def test_gemm_quant(ggml_type, M, N, K):
    raw, w16, w = weight(ggml_type, N, K)
    rng = np.random.default_rng([M, N, K, int(ggml_type)])
    for std in STDS:
        a = (rng.standard_normal((M, K)) * std).astype(np.float16)
        got = run(gemm, a, w, M, N)
        check(got, gemm_ref(a, raw, ggml_type), a, w16, K)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.Q6_K, T.NVFP4], ids=lambda t: t.name)
def test_gemm_quant_small_tile_and_accumulate(ggml_type):
    M, N, K = 77, 640, 1024
    raw, w16, w = weight(ggml_type, N, K)
    rng = np.random.default_rng(int(ggml_type))
    a = rng.standard_normal((M, K)).astype(np.float16)
    got = run(lambda a_, w_, c_, s, accumulate: gemm_quant(a_, w_, c_, s, accumulate, bm=64), a, w, M, N)
    check(got, gemm_ref(a, raw, ggml_type), a, w16, K)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    got = run(gemm, a, w, M, N, c0)
    check(got, gemm_ref(a, raw, ggml_type, c=c0.astype(np.float64)), a, w16, K, c0)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_gemm_quant_prefill_shape(ggml_type):
    """The benchmark shape M=512, N=4096, K=14336 (reference on a sample of rows)."""
    M, N, K = 512, 4096, 14336
    raw, w16, w = weight(ggml_type, N, K)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((M, K)).astype(np.float16)
    got = run(gemm, a, w, M, N)
    rows = rng.choice(M, 32, replace=False)
    check(got[rows], gemm_ref(a[rows], raw, ggml_type), a[rows], w16, K)


def test_gemm_rejects_bad_shapes():
    a = cuda.to_device(np.zeros((4, 100), np.float16))
    w = cuda.to_device(np.zeros((64, 100), np.float16))
    c = cuda.to_device(np.zeros((4, 64), np.float32))
    with pytest.raises(AssertionError, match="K % 32"):
        gemm_f16(a, w, c, 0)
