"""warp.py's warp_sums_lanes in numba's CUDA simulator: each lane's 32 values summed over its warp
at once, lane i getting the sum of the values at i, equal bit for bit to warp_sum's of that value
(two warps, so each warp sums only its own)."""

import numpy as np
from numba import cuda, float32

from impnb.kernels.common.warp import warp_sum, warp_sums_lanes


@cuda.jit
def _sums_kernel(x, out, plain):
    tid = cuda.threadIdx.x
    v = cuda.local.array(32, float32)
    for i in range(32):
        v[i] = x[tid, i]
    out[tid] = warp_sums_lanes(v)
    for i in range(32):  # warp_sum of each value, the lane keeping its own
        s = warp_sum(x[tid, i])
        if i == tid & 31:
            plain[tid] = s


def test_warp_sums_lanes():
    rng = np.random.default_rng(3)
    for scale in (1e-3, 1.0, 1e3):
        x = (rng.standard_normal((64, 32)) * scale).astype(np.float32)
        out, plain = np.full(64, np.nan, np.float32), np.full(64, np.nan, np.float32)
        _sums_kernel[1, 64](x, out, plain)
        want = x.reshape(2, 32, 32).astype(np.float64).sum(axis=1).reshape(64)  # warp w, lane i: sum of v[i]
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * scale)
        assert np.array_equal(out, plain), "not warp_sum's additions"
