"""The int8 few-row GEMM (kernels/gemm/gemm_mmq.py) on the GPU: x̂'s int8 form bit for bit against
quantize_x32_ref, the product against gemm_mmq_ref (x̂ · dequant(W) in float64, so the bound is
float32 summation alone), through split-K (1..many parts, uneven shares), ragged token slabs,
W rows past N, accumulate and stacked outputs, for every type it takes; outputs, x̂'s buffers and
the partial scratch NaN-poisoned; x Gaussian at std 0.1, 1 and 10 with a few outlier columns."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemm.gemm_mmq import MT, TYPES, W_RING_TYPES, gemm_mmq, gemm_mmq_ref, gemm_mmq_split, slab_rows, splits_for
from impnb.kernels.gemm.gemm_mmq_pair import gemm_mmq_pair, pair_splits
from impnb.kernels.gemm.quant_x32 import QuantX32, dequantize_x32_ref, quantize_x32, quantize_x32_ref
from impnb.quants import dequantize
from tests.gpu import test_gemm_tc as gemm_tests

pytestmark = pytest.mark.gpu


def activations(M, K, std, seed):
    """Gaussian rows with a few columns 20x larger (the outlier channels of real activations)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)) * std
    x[:, rng.choice(K, max(1, K // 97), replace=False)] *= 20
    return x.astype(np.float32)


def poisoned_xq(MP, K) -> QuantX32:
    return QuantX32(cuda.to_device(np.full((MP, K // 4), 0xDEADBEEF, np.uint32)),
                    cuda.to_device(np.full((K // 32, MP, 2), np.nan, np.float32)))


def check_bound(got, x, raw, w16, ggml_type, c0=None):
    """got within float32 summation of gemm_mmq_ref (plus the products' rounding in float32)."""
    ref = gemm_mmq_ref(x, raw, ggml_type, None if c0 is None else c0.astype(np.float64))
    assert np.isfinite(got).all(), f"{np.count_nonzero(~np.isfinite(got))} non-finite outputs (poison left?)"
    K = x.shape[1]
    mag = np.abs(x.astype(np.float64)) @ np.abs(w16.astype(np.float64)).T
    bound = (K / 32 + 16) * 2.0 ** -21 * mag + (0 if c0 is None else 2.0 ** -23 * np.abs(c0))
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"{np.count_nonzero(err > bound)} outputs out of bound; worst at {worst}: "
                                  f"err {err[worst]:.3e} > {bound[worst]:.3e}")


def check_mmq(ggml_type, M, N, K, splits, std, seed, accumulate=False, mt=None, ring=False):
    raw, w16, w = gemm_tests.weight(ggml_type, N, K)
    x = activations(M, K, std, seed)
    c0 = np.random.default_rng(seed + 1).standard_normal((M, N)).astype(np.float32) if accumulate else None
    MP = slab_rows(M)
    xq = poisoned_xq(MP, K)
    part = cuda.to_device(np.full((splits, M, N), np.nan, np.float32))
    c = cuda.to_device(c0 if accumulate else np.full((M, N), np.nan, np.float32))
    gemm_mmq(cuda.to_device(x), xq, w, c, part, 0, splits, accumulate, mt=mt, ring=ring)
    got = c.copy_to_host().astype(np.float64)
    q, ds = quantize_x32_ref(x, MP)
    assert (xq.q.copy_to_host() == q).all(), "x̂'s int8 words differ from quantize_x32_ref"
    assert np.array_equal(xq.ds.copy_to_host(), ds), "x̂'s scales or sums differ from quantize_x32_ref"
    check_bound(got, x, raw, w16, ggml_type, c0)


def check_mmq_split(ggml_type, M, sizes, K, splits, seed):
    N = sum(sizes)
    raw, w16, w = gemm_tests.weight(ggml_type, N, K)
    x = activations(M, K, 1.0, seed)
    part = cuda.to_device(np.full((splits, M, N), np.nan, np.float32))
    ys = [cuda.to_device(np.full((M, n), np.nan, np.float32)) for n in sizes]
    gemm_mmq_split(cuda.to_device(x), poisoned_xq(slab_rows(M), K), w, ys, part, 0, splits)
    got = np.concatenate([y.copy_to_host() for y in ys], axis=1).astype(np.float64)
    check_bound(got, x, raw, w16, ggml_type)


def check_mmq_pair(M, nq, nk, nv, K, splits, std, seed):
    """gemm_mmq_pair: a Q4_K Q|K (nq + nk rows) and a Q6_K V (nv rows) in one launch, each output
    against gemm_mmq_ref of its own weight, outputs, x̂ and the partial scratch poisoned."""
    raw1, w16_1, w1 = gemm_tests.weight(T.Q4_K, nq + nk, K)
    raw2, w16_2, w2 = gemm_tests.weight(T.Q6_K, nv, K)
    x = activations(M, K, std, seed)
    part = cuda.to_device(np.full((splits, M, nq + nk + nv), np.nan, np.float32))
    ys = [cuda.to_device(np.full((M, n), np.nan, np.float32)) for n in (nq, nk, nv)]
    gemm_mmq_pair(cuda.to_device(x), poisoned_xq(slab_rows(M), K), w1, w2, ys, part, 0, splits)
    got = [y.copy_to_host().astype(np.float64) for y in ys]
    check_bound(np.concatenate(got[:2], axis=1), x, raw1, w16_1, T.Q4_K)
    check_bound(got[2], x, raw2, w16_2, T.Q6_K)


@pytest.mark.parametrize("M,nq,nk,nv,K", [(8, 4096, 512, 512, 2048), (16, 4096, 1024, 1024, 4096),
                                          (5, 136, 36, 36, 512), (13, 264, 72, 200, 1024), (3, 512, 128, 72, 768)])
def test_mmq_pair(M, nq, nk, nv, K):
    """The 30B-A3B's and the 8B's Q|K|V shapes, and small ones whose block rows split inside a
    weight and end past it."""
    check_mmq_pair(M, nq, nk, nv, K, pair_splits(M, nq + nk, nv, K), (0.1, 1.0, 10.0)[M % 3], seed=M)


@pytest.mark.parametrize("ggml_type", TYPES)
@pytest.mark.parametrize("M,splits", [(2, 3), (8, 1), (9, 5), (19, 3), (32, 2), (64, 1), (111, 4), (256, 2)])
def test_mmq(ggml_type, M, splits):
    check_mmq(ggml_type, M, 264, 1024, splits, (0.1, 1.0, 10.0)[M % 3], seed=M)


@pytest.mark.parametrize("ggml_type", TYPES)
@pytest.mark.parametrize("mt", [1, MT])
def test_mmq_w_tiles_either_way(ggml_type, mt):
    """One or MT m16 tiles of W a warp at one and two token tiles, whichever mt_for would pick."""
    check_mmq(ggml_type, 6, 200, 768, 2, 1.0, seed=11, mt=mt)
    check_mmq(ggml_type, 13, 136, 512, 4, 0.1, seed=12, mt=mt)


@pytest.mark.parametrize("ggml_type", W_RING_TYPES)
@pytest.mark.parametrize("M,N,K,splits,mt", [(16, 24576, 4096, 2, MT), (16, 4096, 12288, 8, 1), (8, 5120, 4096, 3, 1),
                                              (5, 200, 2048, 1, MT), (13, 136, 1280, 2, MT), (33, 264, 1024, 3, 1),
                                              (100, 72, 768, 2, 1)])
def test_mmq_w_ring(ggml_type, M, N, K, splits, mt):
    """W through the cp.async ring: the 8B's gate|up, down and the 30B-A3B's Q|K|V at their splits,
    and rows past N, the ring wrapping many times in one split (K 2048 in one), odd splits, one to
    four token tiles a block."""
    check_mmq(ggml_type, M, N, K, splits, (0.1, 1.0, 10.0)[M % 3], seed=M + N, accumulate=M % 2 == 1, mt=mt,
              ring=True)


@pytest.mark.parametrize("M", [3, 16, 33, 100])
def test_mmq_accumulate_and_model_shapes(M):
    check_mmq(T.Q4_K, M, 4096, 4096, splits_for(M, 4096, 4096), 1.0, seed=M, accumulate=True)
    check_mmq(T.Q6_K, M, 1024, 12288, splits_for(M, 1024, 12288), 1.0, seed=M + 1)
    check_mmq(T.Q8_0, M, 1024, 4096, splits_for(M, 1024, 4096), 1.0, seed=M + 2)


@pytest.mark.parametrize("M,sizes", [(17, (4096, 1024, 1024)), (64, (4096, 512)), (9, (136, 36, 36))])
def test_mmq_split_qkv(M, sizes):
    check_mmq_split(T.Q4_K, M, sizes, 2048, 4, seed=M)


def test_quantize_x32_zero_rows_and_ties():
    """Rows of zeros (scale 0, all q 0), exact ties (x * 127 / amax at .5) round to even, and the
    slab's padding rows are written as zeros over the poison."""
    K = 256
    x = activations(5, K, 1.0, 3)
    x[1] = 0.0
    x[2, :32] = np.arange(32) - 15.5  # q = rint(x · 127 / 127): every value a tie
    x[2, 0] = -127.0
    xq = poisoned_xq(8, K)
    quantize_x32(cuda.to_device(x), xq, 0)
    q, ds = quantize_x32_ref(x, 8)
    assert (xq.q.copy_to_host() == q).all() and np.array_equal(xq.ds.copy_to_host(), ds)
    assert (q[5:] == 0).all() and (ds[:, 5:] == 0).all() and (q[1] == 0).all()


def check_mmq_normed(ggml_type, M, N, K, seed):
    """The pre-norm fused into x's quantization: x̂ within half a step of RMSNorm(x) * wn's int8
    rounding (the block sums the row in another order), and the product exactly x̂'s."""
    raw, w16, w = gemm_tests.weight(ggml_type, N, K)
    x = activations(M, K, 3.0, seed)
    wn = (1.0 + 0.5 * np.random.default_rng(seed + 5).standard_normal(K)).astype(np.float32)
    eps = 1e-6
    MP = slab_rows(M)
    xq = poisoned_xq(MP, K)
    part = cuda.to_device(np.full((2, M, N), np.nan, np.float32))
    c = cuda.to_device(np.full((M, N), np.nan, np.float32))
    gemm_mmq(cuda.to_device(x), xq, w, c, part, 0, 2, norm=(cuda.to_device(wn), eps))
    q, ds = xq.q.copy_to_host(), xq.ds.copy_to_host()
    xd = dequantize_x32_ref(q, ds)[:M]
    x64 = x.astype(np.float64)
    xn = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps) * wn
    step = np.repeat(ds[:, :M, 0].T, 32, axis=1)
    assert (np.abs(xd - xn) <= 0.5 * step * (1 + 1e-4) + 1e-6 * np.abs(xn)).all(), "x̂ off RMSNorm(x) * wn"
    assert (q[M:] == 0).all() and (ds[:, M:] == 0).all()
    ref = xd @ dequantize(np.asarray(raw).view(np.uint8).reshape(N, -1), ggml_type).reshape(N, K).astype(np.float64).T
    got = c.copy_to_host().astype(np.float64)
    mag = np.abs(xd) @ np.abs(w16.astype(np.float64)).T
    assert (np.abs(got - ref) <= (K / 32 + 16) * 2.0 ** -21 * mag).all()


@pytest.mark.parametrize("ggml_type", TYPES)
def test_mmq_normed(ggml_type):
    check_mmq_normed(ggml_type, 11, 136, 2048, seed=3)
