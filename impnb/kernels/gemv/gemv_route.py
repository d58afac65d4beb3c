"""The MoE router as a decode GEMV: gemv_route's logits = W x, then the grid's last block chooses
each token's experts (moe.route_block) among the first n_routed logits (rows of W past those: a
logit for another kernel, Qwen3.5's shared expert gate), its blocks having written the int8 input
where asked; the kernel is gemv.py's."""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import types

from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemv.gemv import aligned16, kernel_args, out_per_block, variant_kernel
from impnb.kernels.gemv.gemv_units import NO_GLU
from impnb.kernels.gemv.gemv_variants import BLOCK, Variant
from impnb.kernels.gemv.quant_x import GROUP, THREADS as QUANT_THREADS, QuantX
from impnb.kernels.moe.moe import MAX_EXPERTS, MAX_K
from impnb.launch import launch


# The router's few rows (E of K = D): a row a block spreads them over E blocks (1.9x faster than
# choose()'s 4 rows a group on 128 x 2048 F32). Its last block routes: the routing moved into
# the experts' gate|up kernel, or the whole router in one thread-block cluster, lost in the
# decode graph (docs/EXPERIMENTS.md, 'MoE decode').
ROUTER_VARIANT = Variant(128, 1, 1)
assert BLOCK == QUANT_THREADS, "the router's blocks run quantize_x's block function"


def gemv_route(w: PackedWeight, x, logits, k: int, normalize: bool, experts, weights, counter, stream,
               variant: Variant | None = None, norm: tuple | None = None, xq: QuantX | None = None,
               n_routed: int | None = None):
    """The MoE router: logits (T, N) float32 = W x as gemv (norm (wn, eps): W RMSNorm(x) wn), then
    the grid's last block writes each token's top k experts (T, k) int32 and their softmax weights
    (T, k) float32 (moe.route_ref of the logits' first E = n_routed columns (default N: every row
    of W an expert's), normalized to sum 1 with `normalize`); counter (1,) uint32, zero between
    uses. With xq, the kernel also writes the int8 form of its input (x or RMSNorm(x) wn) there,
    equal to quantize_x's (one kernel fewer before dp4a experts)."""
    n_tok, K = x.shape
    N = w.rows
    E = N if n_routed is None else n_routed
    assert logits.shape == (n_tok, N) and w.cols == K and 1 <= k <= min(MAX_K, E) and E <= min(MAX_EXPERTS, N)
    assert x.dtype == np.float32 and x.is_c_contiguous() and aligned16(x)
    assert logits.dtype == np.float32 and logits.is_c_contiguous()
    assert experts.shape == weights.shape == (n_tok, k) and experts.dtype == np.int32 and weights.dtype == np.float32
    assert counter.dtype == np.uint32 and counter.shape == (1,)
    v = variant or ROUTER_VARIANT
    grid = (N + out_per_block(v, NO_GLU) - 1) // out_per_block(v, NO_GLU)
    wn, eps = norm or (x[0], 0.0)
    assert wn.dtype == np.float32 and wn.shape == (K,) and aligned16(wn)
    if xq is not None:
        assert K % GROUP == 0 and xq.q.shape == (n_tok, K // 4) and xq.d.shape == xq.s.shape == (n_tok, K // GROUP)
    q, d, s = xq or (x.view(np.uint32), x, x)  # without xq: not written, any of the right types
    if xq is not None:  # quantize_x's blocks after the GEMV's
        grid += (K // GROUP + QUANT_THREADS - 1) // QUANT_THREADS * n_tok
    launch(variant_kernel(w.ggml_type, n_tok, v, normed=norm is not None, route=True, cols=K), grid, BLOCK,
           stream, w.parts, x, wn, np.float32(eps), logits, np.int32(N), np.int32(E), np.int32(k),
           np.int32(normalize), experts, weights, counter, q, d, s, np.int32(xq is not None))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [  # the MoE router with its routing tail (F32, as GGUF stores ffn_gate_inp), its input normed at decode
        (variant_kernel(T.F32, n, ROUTER_VARIANT, normed=normed, route=True), types.void(*kernel_args(T.F32, route=True)),
         {})
        for n in (1, 8) for normed in (False, True)
    ]
