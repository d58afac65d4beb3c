"""gemv_stream on the GPU against dequantize + float64 matmul, as test_gemv.py (same tolerance):
every type it serves, 1/2/4 rows a group, tall odd shapes at K <= 1024, x at std 0.1, 1, 10,
grids of 1 and 8 blocks an SM (many turns, and none), outputs NaN-poisoned."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemv.gemv import gemv_ref
from impnb.kernels.gemv.gemv_stream import gemv_stream
from tests.gpu.cases import fitting
from tests.gpu.test_gemv import RTOL, weight

pytestmark = pytest.mark.gpu

TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K, T.F16, T.F32]
SHAPES = [(49152, 576), (20011, 640), (989, 1024), (19, 256), (4099, 32)]


@pytest.mark.parametrize("ggml_type,n,cols", fitting(TYPES, SHAPES))
@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("bps", [1, 8])
def test_gemv_stream(ggml_type, n, cols, rows, bps):
    raw, wabs, w = weight(ggml_type, n, cols)
    for seed, std in enumerate((0.1, 1.0, 10.0)):
        x = (np.random.default_rng([seed, n, rows]).standard_normal((1, cols)) * std).astype(np.float32)
        stream = cuda.stream()
        d_y = cuda.to_device(np.full((1, n), np.nan, np.float32), stream=stream)
        gemv_stream(w, cuda.to_device(x, stream=stream), d_y, stream, rows, bps)
        y = d_y.copy_to_host(stream=stream)
        stream.synchronize()
        assert np.isfinite(y).all(), "non-finite output"
        err = np.abs(y - gemv_ref(raw, ggml_type, x))
        bound = RTOL * (np.abs(x.astype(np.float64)) @ wabs.T)
        assert (err <= bound).all(), f"std {std}: max err/bound {np.max(err / bound):.3g}"
