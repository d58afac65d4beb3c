"""Argument types of the quantized GEMV kernels (gemv.py's gemv_kernel and its launchers'
variants): a weight type's packed parts, and the plain, normed, tail, routed-expert, router and
gated kernels' signatures, for their builds and the build checks."""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import from_dtype, types

from impnb.kernels.common.repack import LAYOUTS


def parts_type(ggml_type: T):
    return types.Tuple(tuple(types.Array(from_dtype(np.dtype(dt)), 1, "C")
                             for _, _, _, dt in LAYOUTS[ggml_type]))


F32_2D = types.Array(types.float32, 2, "C")
_I32 = types.int32


def kernel_args(ggml_type: T, experts: bool = False, normed: bool = False, tail: int = 0,
                route: bool = False, gated: bool = False) -> tuple:
    """Argument types of gemv_kernel's kernels for a type (the plain, normed, tail, routed-expert,
    router or gated one)."""
    if tail:  # parts, x, y, n_rows, x_res, w_post, w_next, h, eps, counter
        vec = types.Array(types.float32, 1, "C")
        return (parts_type(ggml_type), F32_2D, F32_2D, _I32, F32_2D, vec, vec, F32_2D, types.float32,
                types.Array(types.uint32, 1, "C"))
    if route:  # parts, x, wn, eps, y, n_rows, n_routed, k, normalize, experts, weights, counter, q, d, s, quant
        return (parts_type(ggml_type), F32_2D, types.Array(types.float32, 1, "C"), types.float32, F32_2D, _I32,
                _I32, _I32, _I32, types.Array(types.int32, 2, "C"), F32_2D, types.Array(types.uint32, 1, "C"),
                types.Array(types.uint32, 2, "C"), F32_2D, F32_2D, _I32)
    if gated:  # parts, x, y, n_rows, accumulate, gate, gate_col
        return (parts_type(ggml_type), F32_2D, F32_2D, _I32, _I32, F32_2D, _I32)
    if experts:  # parts, x, y, n_rows, experts, x_div, accumulate
        return (parts_type(ggml_type), F32_2D, F32_2D, _I32, types.Array(types.int32, 1, "C"), _I32, _I32)
    norm = (types.Array(types.float32, 1, "C"), types.float32) if normed else ()
    return (parts_type(ggml_type), F32_2D, *norm, F32_2D, F32_2D, F32_2D, _I32, _I32, _I32, _I32)
