"""A decode GEMV with the residual tail: gemv_residual's y = W x, then the grid's last block
updates the residual stream and writes the next normed input (gemv_tail.py); the kernel is gemv.py's."""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import types

from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemv.gemv import aligned16, kernel_args, out_per_block, variant_kernel
from impnb.kernels.gemv.gemv_tail import ADD, POST_ADD, Residual
from impnb.kernels.gemv.gemv_units import NO_GLU
from impnb.kernels.gemv.gemv_variants import BLOCK, WIDE_K, Variant, choose
from impnb.launch import launch


def gemv_residual(w: PackedWeight, x, y, res: Residual, stream, variant: Variant | None = None):
    """y (T, N) float32 = W x as gemv, then the grid's last block applies res to y: res.x +=
    y (or RMSNorm(y) * res.w_post), res.h = RMSNorm(res.x) * res.w_next (gemv_tail.py)."""
    n_tok, K = x.shape
    assert y.shape == (n_tok, w.rows) and w.cols == K, (w.rows, w.cols, x.shape, y.shape)
    assert x.dtype == np.float32 and x.is_c_contiguous() and aligned16(x)
    assert y.dtype == np.float32 and y.is_c_contiguous() and aligned16(y)
    v = variant or choose(w.ggml_type, n_tok, K, w.rows)
    grid = (w.rows + out_per_block(v, NO_GLU) - 1) // out_per_block(v, NO_GLU)
    launch(variant_kernel(w.ggml_type, n_tok, v, tail=res.mode, cols=K), grid, BLOCK, stream, w.parts, x, y,
           np.int32(w.rows), *res.args(y))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [  # tails: Gemma3's attn_output (K 1024) and ffn_down (K 2048); ADD (no post-norm) at K 4096
        # and T 2, a mode no model's decode takes since qwen3moe moved to the fused norms (tested, kept)
        (variant_kernel(t, n, choose(t, n, K, 1), tail=mode, cols=K), types.void(*kernel_args(t, tail=mode)),
         {"max_registers": 128})
        for t, n, K, mode in ((T.Q4_K, 1, 1024, POST_ADD), (T.Q6_K, 1, 2048, POST_ADD), (T.Q4_K, 8, 2048, POST_ADD),
                              (T.Q4_K, 1, WIDE_K, ADD), (T.Q8_0, 2, 2048, ADD))
    ]
