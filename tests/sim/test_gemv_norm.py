"""gemv_norm.py's fused residual-norm GEMV in numba's CUDA simulator on tiny shapes (the GPU
test's check, every weight type: split outputs, GLU, Gemma's post-norm)."""

import pytest

from impnb.kernels.gemv import DECODERS, GELU, NO_GLU, SILU
from tests.gpu.test_gemv_norm import check_gemv_norm


@pytest.mark.parametrize("ggml_type", list(DECODERS), ids=lambda t: t.name)
def test_gemv_norm(ggml_type):
    check_gemv_norm(ggml_type, 5, 256, False, NO_GLU, [2, 2, 1], 1.0, [int(ggml_type), 0])
    check_gemv_norm(ggml_type, 3, 512, True, NO_GLU, [3], 10.0, [int(ggml_type), 1])


@pytest.mark.parametrize("glu", [SILU, GELU], ids=["silu", "gelu"])
def test_gemv_norm_glu(glu):
    from gguf import GGMLQuantizationType as T
    check_gemv_norm(T.Q4_K, 8, 256, glu == GELU, glu, None, 1.0, [glu])
