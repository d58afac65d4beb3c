"""gemv_stream in numba's CUDA simulator against dequantize + float64 matmul (as test_gemv.py):
every weight type, 1/2/4 rows a group (each type at one of them), one block taking several turns over odd row counts."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemv.gemv_stream import gemv_stream
from impnb.kernels.common.repack import repack
from tests.sim.test_gemv import check
from tests.test_repack import make_weight


@pytest.mark.parametrize("ggml_type,rows", [(T.Q8_0, 1), (T.Q5_0, 2), (T.Q4_1, 4), (T.Q4_K, 1), (T.Q6_K, 2),
                                            (T.F16, 4)], ids=lambda v: getattr(v, "name", str(v)))
def test_gemv_stream_matches_reference(ggml_type, rows):
    # each type once, each rows-a-group setting twice: the decode and the row grouping are apart
    n, cols = 37, 256 if ggml_type in (T.Q4_K, T.Q6_K) else 96
    rng = np.random.default_rng([int(ggml_type), rows])
    raw = make_weight(ggml_type, n, cols, rng)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    d_y = cuda.to_device(np.full((1, n), np.nan, np.float32))
    gemv_stream(repack(raw, ggml_type).to_device(), cuda.to_device(x), d_y, 0, rows=rows, blocks_per_sm=1)
    check(raw, ggml_type, x, d_y.copy_to_host())
