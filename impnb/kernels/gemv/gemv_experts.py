"""Routed experts as a decode GEMV: gemv_experts' y[s] = W_e x (or a gate|up's act(gate) * up) for
each slot's expert e, one token a slot; the kernel is gemv.py's."""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import types

from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemv.gemv import aligned16, gemv_kernel, kernel_args, out_per_block, variant_kernel
from impnb.kernels.gemv.gemv_units import DECODERS, NO_GLU, SILU
from impnb.kernels.gemv.gemv_variants import BLOCK, WIDE_K, WIDE_MIN_ROWS, Variant, choose
from impnb.launch import launch


def gemv_experts(w: PackedWeight, n_rows: int, x, y, experts, x_div: int, stream, glu: int = NO_GLU,
                 variant: Variant | None = None):
    """Routed experts, one token per slot: y[s] = W_e x[s // x_div] with e = experts[s], or with
    glu (SILU, GELU) y[s] = act(gate_e x) * up_e x for gate|up stacked per expert.

    w: E experts of n_rows rows stacked, (E * n_rows, K); x (rows, K) float32; experts (S,) int32
    in 0..E-1; y (S, n_rows) float32, or (S, n_rows / 2) with glu; `variant` overrides `choose`.
    """
    S, K = experts.shape[0], x.shape[1]
    out_rows = n_rows // 2 if glu else n_rows
    assert w.cols == K and w.rows % n_rows == 0 and y.shape == (S, out_rows), (w.rows, n_rows, x.shape, y.shape)
    assert x.dtype == np.float32 and x.is_c_contiguous() and aligned16(x) and x_div >= 1
    assert y.dtype == np.float32 and y.is_c_contiguous() and experts.dtype == np.int32
    v = variant or choose(w.ggml_type, 1, K, n_rows)
    assert not glu or v.rows % 2 == 0
    per_block = out_per_block(v, glu)
    launch(variant_kernel(w.ggml_type, 1, v, glu, True), ((out_rows + per_block - 1) // per_block, S),
           BLOCK, stream, w.parts, x, y, np.int32(n_rows), experts, np.int32(x_div), np.int32(0))


# Registers as gemv.py's plain kernels. The build checks take every type gate|up with SiLU (two rows
# with a GLU, the heaviest) and a plain span of 32 or 128 in turn (each of those with half the types).
def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemv_kernel(t, 1, span, glu, True), types.void(*kernel_args(t, True)), {"max_registers": 112})
        for i, t in enumerate(DECODERS) for span, glu in ((64, SILU), ((32, NO_GLU), (BLOCK, NO_GLU))[i % 2])
    ] + [
        (variant_kernel(T.Q4_K, 1, choose(T.Q4_K, 1, WIDE_K, WIDE_MIN_ROWS), SILU, True),
         types.void(*kernel_args(T.Q4_K, True)), {})
    ]
