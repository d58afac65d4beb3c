"""warp.py's warp_sums_lanes in numba's CUDA simulator: each lane's n values summed over its warp
at once, lane i getting the sum of the values at i >> (5 - log2 n), equal bit for bit to warp_sum's
of that value (two warps, so each warp sums only its own)."""

from functools import lru_cache

import numpy as np
import pytest
from numba import cuda, float32

from impnb.kernels.common.warp import group_sums_lanes, warp_sum, warp_sums_lanes


@lru_cache(maxsize=None)
def sums_kernel(n: int):
    shift = 5 - (n.bit_length() - 1)

    @cuda.jit
    def kernel(x, out, plain):
        tid = cuda.threadIdx.x
        v = cuda.local.array(n, float32)
        for i in range(n):
            v[i] = x[tid, i]
        out[tid] = warp_sums_lanes(v, n)
        for i in range(n):  # warp_sum of each value, the lane keeping its own
            s = warp_sum(x[tid, i])
            if i == (tid & 31) >> shift:
                plain[tid] = s
    return kernel


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32])
def test_warp_sums_lanes(n):
    rng = np.random.default_rng(n)
    idx = np.arange(32) >> (5 - (n.bit_length() - 1))
    for scale in (1e-3, 1.0, 1e3):
        x = (rng.standard_normal((64, n)) * scale).astype(np.float32)
        out, plain = np.full(64, np.nan, np.float32), np.full(64, np.nan, np.float32)
        sums_kernel(n)[1, 64](x, out, plain)
        want = x.reshape(2, 32, n).astype(np.float64).sum(axis=1)[:, idx].reshape(64)  # warp w, lane i
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * scale)
        assert np.array_equal(out, plain), "not warp_sum's additions"


@lru_cache(maxsize=None)
def group_kernel(n: int, span: int):
    @cuda.jit
    def kernel(x, out):
        tid = cuda.threadIdx.x
        v = cuda.local.array(n, float32)
        for i in range(n):
            v[i] = x[tid, i]
        out[tid] = group_sums_lanes(v, n, span)
    return kernel


@pytest.mark.parametrize("span,n", [(8, 1), (8, 2), (8, 4), (8, 8), (16, 1), (16, 4), (16, 16)])
def test_group_sums_lanes(span, n):
    """group_sums_lanes: lane i of each group of span lanes gets its group's sum of the values at
    (i mod span) >> (log2 span - log2 n)."""
    rng = np.random.default_rng(span + n)
    idx = (np.arange(span) >> ((span.bit_length() - 1) - (n.bit_length() - 1)))
    for scale in (1e-3, 1.0, 1e3):
        x = (rng.standard_normal((64, n)) * scale).astype(np.float32)
        out = np.full(64, np.nan, np.float32)
        group_kernel(n, span)[1, 64](x, out)
        want = x.reshape(64 // span, span, n).astype(np.float64).sum(axis=1)[:, idx].reshape(64)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * scale)
