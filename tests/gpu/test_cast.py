"""cast_f16 with the pre-norm (kernels/elementwise/cast.py) on the GPU: RMSNorm(x) * w in fp16
against its float64 reference within the fp16 rounding of each value, saturated where w drives it
past fp16's range; odd widths and row counts, x Gaussian at several magnitudes with a few outlier
columns, w Gaussian (not ones), the output NaN-poisoned."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.elementwise.cast import F16_MAX, cast_f16, cast_f16_ref

pytestmark = pytest.mark.gpu


def check_cast_norm(rng, T, K, std, w_std=1.0, eps=1e-6):
    x = rng.standard_normal((T, K)) * std
    x[:, rng.choice(K, max(1, K // 97), replace=False)] *= 20
    x = x.astype(np.float32)
    wn = (1.0 + rng.standard_normal(K) * w_std).astype(np.float32)
    out = cuda.to_device(np.full((T, K), np.nan, np.float16))
    cast_f16(cuda.to_device(x), out, 0, norm=(cuda.to_device(wn), eps))
    got = out.copy_to_host().astype(np.float64)
    ref = cast_f16_ref(x, (wn, eps)).astype(np.float64)
    assert np.isfinite(got).all(), "poison left in the output"
    exact = np.asarray(x, np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + eps) * wn
    saturated = np.abs(exact) >= F16_MAX
    assert np.array_equal(got[saturated], np.sign(exact[saturated]) * F16_MAX)
    # one fp16 unit of the value (the kernel's float32 norm may round the other way at a tie)
    with np.errstate(over="ignore"):  # F16_MAX's unit (saturated values: checked above)
        unit = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
    assert (np.abs(got - ref) <= unit)[~saturated].all(), np.abs(got - ref)[~saturated].max()


@pytest.mark.parametrize("T, K", [(1, 4), (9, 2048), (16, 4096), (37, 5120), (128, 516)])
def test_cast_norm(T, K):
    rng = np.random.default_rng([T, K])
    for std in (1e-3, 1.0, 300.0):
        check_cast_norm(rng, T, K, std)
    check_cast_norm(rng, T, K, 1.0, w_std=3e4)  # some values past fp16's range


def check_cast_perm(rng, T, K, std, normed):
    """cast_f16 with perm: its output without perm (with or without the norm; without it, the
    flat kernel's) with each 64-column step's columns in gemm_wgmma_rs's order, bit for bit; the
    output NaN-poisoned."""
    from impnb.kernels.gemm.gemm_wgmma_rs_block import permute_a

    x = cuda.to_device((rng.standard_normal((T, K)) * std).astype(np.float32))
    norm = (cuda.to_device((1.0 + rng.standard_normal(K)).astype(np.float32)), 1e-6) if normed else None
    want = cuda.to_device(np.full((T, K), np.nan, np.float16))
    cast_f16(x, want, 0, norm=norm) if normed else cast_f16(x.reshape(T * K), want.reshape(T * K), 0)
    got = cuda.to_device(np.full((T, K), np.nan, np.float16))
    cast_f16(x, got, 0, norm, perm=True)
    assert np.array_equal(got.copy_to_host().view(np.uint16), permute_a(want.copy_to_host()).view(np.uint16))


@pytest.mark.parametrize("T, K", [(1, 64), (17, 4096), (33, 2048)])
def test_cast_perm(T, K):
    rng = np.random.default_rng([T, K, 7])
    for normed in (True, False):
        for std in (1e-2, 1.0, 3e4):
            check_cast_perm(rng, T, K, std, normed)
