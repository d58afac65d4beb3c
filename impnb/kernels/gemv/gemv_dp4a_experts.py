"""Routed experts on dp4a: gemv_dp4a_experts' y[s] = W_e x̂ (or a gate|up's act(gate) * up) for
each slot's expert e, one token a slot; the kernel is gemv_dp4a.py's."""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import types

from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemv.gemv_dp4a import gemv_dp4a_kernel, kernel_args
from impnb.kernels.gemv.gemv_dp4a_units import DOTS
from impnb.kernels.gemv.gemv_dp4a_variants import choose_experts
from impnb.kernels.gemv.gemv_units import GELU, NO_GLU, SILU
from impnb.kernels.gemv.gemv_variants import BLOCK, Variant
from impnb.kernels.gemv.quant_x import GROUP, QuantX
from impnb.launch import launch


def gemv_dp4a_experts(w: PackedWeight, n_rows: int, x: QuantX, y, experts, x_div: int, stream, glu: int = NO_GLU,
                      variant: Variant | None = None):
    """Routed experts, one token a slot: y[s] = W_e x̂[s // x_div] with e = experts[s], or with glu
    (SILU, GELU) y[s] = act(gate_e x̂) * up_e x̂ for gate|up stacked per expert.

    w: E experts of n_rows rows stacked, (E * n_rows, K); x̂ (quant_x.quantize_x) of the inputs;
    experts (S,) int32 in 0..E-1; y (S, n_rows) float32, or (S, n_rows / 2) with glu.
    """
    S, K = experts.shape[0], w.cols
    out_rows = n_rows // 2 if glu else n_rows
    assert w.ggml_type in DOTS and w.rows % n_rows == 0 and y.shape == (S, out_rows) and x_div >= 1
    assert x.q.shape[1] == K // 4 and x.d.shape[1] == K // GROUP
    assert y.dtype == np.float32 and y.is_c_contiguous() and experts.dtype == np.int32
    v = variant or choose_experts(w.ggml_type, K, glu, out_rows)
    assert v.rows // (2 if glu else 1) <= out_rows, "more rows a group than an expert has"
    per_block = v.rows // (2 if glu else 1) * (BLOCK // v.span)
    launch(gemv_dp4a_kernel(w.ggml_type, K, 1, v.span, v.rows, glu, True, v.unroll),
           ((out_rows + per_block - 1) // per_block, S),
           BLOCK, stream, w.parts, x.q, x.d, x.s, y, np.int32(n_rows), experts, np.int32(x_div), np.int32(0))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [  # qwen3moe's routed gate|up experts
        (gemv_dp4a_kernel(t, 2048, 1, v.span, v.rows, SILU, True, v.unroll), types.void(*kernel_args(t, True)),
         {"max_registers": 128})
        for t in (T.Q4_K, T.Q8_0) for v in (choose_experts(t, 2048, SILU, 768),)
    ] + [  # gemma4's (26B-A4B: 2816 columns, 704 rows an expert, GELU)
        (gemv_dp4a_kernel(T.Q4_K, 2816, 1, v.span, v.rows, GELU, True, v.unroll),
         types.void(*kernel_args(T.Q4_K, True)), {"max_registers": 128})
        for v in (choose_experts(T.Q4_K, 2816, GELU, 704),)
    ]
