"""A decode GEMV whose outputs a per-token gate scales: y[t] (+)= sigmoid(gate[t, col]) W x[t], the
gate a column of a device buffer another kernel wrote (Qwen3.5's shared expert: its down projection
times sigmoid of the logit the router GEMV writes after the experts', gpu/moe.py); the kernel is
gemv.py's `gated` one. Numpy reference: gemv_gated_ref."""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import types

from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemv.gemv import aligned16, gemv_ref, kernel_args, out_per_block, variant_kernel
from impnb.kernels.gemv.gemv_units import NO_GLU
from impnb.kernels.gemv.gemv_variants import BLOCK, Variant, choose
from impnb.launch import launch


def gemv_gated(w: PackedWeight, x, y, gate, col: int, stream, accumulate: bool = False,
               variant: Variant | None = None):
    """y (T, N) float32 = sigmoid(gate[t, col]) * (W x[t]) for each token t, or y += that with
    accumulate; x (T, K) float32, T in 1..8; gate (T, G) float32 (col < G, G any width: read with
    its row stride); `variant` overrides `choose` as in gemv."""
    n_tok, K = x.shape
    assert y.shape == (n_tok, w.rows) and w.cols == K, (w.rows, w.cols, x.shape, y.shape)
    assert x.dtype == np.float32 and x.is_c_contiguous() and aligned16(x)
    assert y.dtype == np.float32 and y.is_c_contiguous()
    assert gate.dtype == np.float32 and gate.is_c_contiguous() and gate.shape[0] == n_tok and 0 <= col < gate.shape[1]
    v = variant or choose(w.ggml_type, n_tok, K, w.rows)
    grid = (w.rows + out_per_block(v, NO_GLU) - 1) // out_per_block(v, NO_GLU)
    launch(variant_kernel(w.ggml_type, n_tok, v, gated=True, cols=K), grid, BLOCK, stream, w.parts, x, y,
           np.int32(w.rows), np.int32(accumulate), gate, np.int32(col))


def gemv_gated_ref(w: np.ndarray, ggml_type: T, x: np.ndarray, gate: np.ndarray, col: int) -> np.ndarray:
    """Raw GGUF weight bytes (N, row_bytes), x (T, K), gate (T, G) -> (T, N) float64 =
    sigmoid(gate[:, col]) * gemv_ref."""
    g = gate[:, col].astype(np.float64)
    return gemv_ref(w, ggml_type, x) / (1.0 + np.exp(-g))[:, None]


# The shared expert's down of Qwen3.6-35B-A3B (D 2048 rows, F 512 columns): T 1 in the types its
# Q8_0 and Q4_K_M GGUFs give it and the float ones (wide loads), T 2 and 8 (two rows a group).
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (variant_kernel(t, n, choose(t, n, 512, 2048), gated=True, cols=512), types.void(*kernel_args(t, gated=True)),
         {"max_registers": 112})
        for t, n in ((T.Q8_0, 1), (T.Q4_K, 1), (T.Q6_K, 1), (T.F16, 1), (T.F32, 1), (T.Q8_0, 2), (T.Q4_K, 8))
    ]
