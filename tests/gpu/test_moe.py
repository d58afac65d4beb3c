"""MoE kernels on the GPU against their numpy references: the router (ties, k = 1, 2, 8) alone and
as the router GEMV's tail (its input normed or not; with a shared expert gate's row stacked under
the experts', routed among the experts' logits alone), grouping invariants, the routed-expert GEMV,
the fused down projection with the weighted sum (stored or added), the grouped tensor-core GEMM and
the weighted combine.

check_* run one case; tests/sim/test_moe.py runs them on tiny shapes in the simulator.
Tolerances: router weights rtol 1e-5 (fp32 softmax); expert GEMV as tests/sim/test_gemv.py
(1e-4 of |W| @ |x| per output; with SiLU·up the bound carries through the product); grouped GEMM
as tests/gpu/test_gemm_tc.py (fp32 accumulation of exact fp16 products); combine rtol 1e-5.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.gemm.dequant import dequant_ref
from impnb.kernels.moe.gemm_grouped import BM, gemm_grouped, grouped_ref
from impnb.kernels.moe.gemm_grouped_wgmma import gemm_grouped_wgmma
from impnb.kernels.gemv.gemv import SILU, gemv_ref
from impnb.kernels.gemv.gemv_experts import gemv_experts
from impnb.kernels.gemv.gemv_route import gemv_route
from impnb.kernels.moe.gemv_moe import experts_down_sum
from impnb.kernels.moe.gemv_moe_dp4a import NextInput, down_sum_dp4a_ref, experts_down_sum_dp4a
from impnb.kernels.moe.moe import (Grouping, combine_ref, group_ref, max_tiles, moe_combine, moe_group, moe_route,
                               route_ref)
from impnb.kernels.elementwise.norm import rms_norm_ref
from impnb.kernels.moe.router_batch import OWN, RANKED, SCAN, router_batch, router_batch_ref
from impnb.kernels.moe.combine_next import combine_next_ref, moe_combine_next
from impnb.kernels.gemm.quant_x32 import XGROUP, QuantX32, quantize_x32
from impnb.kernels.gemv.quant_x import GROUP, QuantX, dequantize_x_ref, quant_x_buffers, quantize_x, quantize_x_ref
from impnb.kernels.common.repack import repack
from impnb.quants import dequantize
from impnb import tuning
from tests.gpu.test_gemm_tc import check as check_gemm
from tests.gpu.test_gemv_dp4a import assert_normed_int8
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu
STDS = (0.1, 1.0, 10.0)


def routed(rng, T_, E, k, same=False):
    """(T, k) int32: k distinct experts per token; `same`: every token picks the same k."""
    if same:
        return np.tile(rng.choice(E, k, replace=False), (T_, 1)).astype(np.int32)
    return np.stack([rng.choice(E, k, replace=False) for _ in range(T_)]).astype(np.int32)


def check_route(rng, T_, E, k, normalize, std, ties=False):
    logits = (rng.standard_normal((T_, E)) * std).astype(np.float32)
    if ties:  # few distinct values: many exact ties, which go to the lower expert index
        logits = np.round(logits / std * 2) * np.float32(std / 2)
    d_e = cuda.to_device(np.full((T_, k), -1, np.int32))
    d_w = cuda.to_device(np.full((T_, k), np.nan, np.float32))
    moe_route(cuda.to_device(logits), k, normalize, d_e, d_w, 0)
    experts, weights = d_e.copy_to_host(), d_w.copy_to_host()
    ref_e, ref_w = route_ref(logits, k, normalize)
    assert np.array_equal(experts, ref_e), f"experts differ at {np.argwhere(experts != ref_e)[:4].tolist()}"
    np.testing.assert_allclose(weights, ref_w, rtol=1e-5, atol=1e-7)


def check_gemv_route(rng, ggml_type, E, K, T_, k, normalize, std, calls=2, normed=False, quant=False, ties=False,
                     stacked=False):
    """The router GEMV with its routing tail: logits against the float64 GEMV (1e-4 of |W| @ |x|;
    normed: of RMSNorm(x) * wn, wn Gaussian about 1), then experts equal to route_ref of the
    kernel's own logits and weights to rtol 1e-5; `calls` runs on fresh x, the ticket counter back
    to zero after each. quant: the int8 form of its input it writes equals quantize_x's bit for bit
    (its buffers poisoned, a spare row left alone). ties: expert 2i + 1's row is expert 2i's, so
    every logit has an equal twin (the lower expert goes first). stacked: W has a row past the E
    experts' (Qwen3.5's shared expert gate, n_routed E): its logit is written too, and the experts
    and weights come from the first E logits alone; in the float types that row is 64 times expert
    0's and each token's x has the sign that makes logit 0 positive, so the extra logit leads most
    rows (a route over all E + 1 would take it, and its exp would swamp the softmax)."""
    N = E + 1 if stacked else E
    raw = make_weight(ggml_type, N, K, rng)
    if ties:
        raw[1:E:2] = raw[0:E - 1:2]
    lead = stacked and ggml_type in (T.F32, T.F16)
    if lead:
        rows = raw.view(np.float32 if ggml_type == T.F32 else np.float16)
        rows[E] = rows[0] * 64
    w = repack(raw, ggml_type).to_device()
    wd = dequantize(raw, ggml_type).reshape(N, K).astype(np.float64)
    wabs = np.abs(wd)
    counter = cuda.to_device(np.zeros(1, np.uint32))
    wn = (1 + 0.3 * rng.standard_normal(K)).astype(np.float32)
    eps = 1e-6
    for _ in range(calls):
        x = (rng.standard_normal((T_, K)) * std).astype(np.float32)
        if lead:  # logit 0 > 0 (RMSNorm's scale is positive)
            x *= np.where((x * (wn if normed else 1)) @ wd[0] < 0, -1, 1).astype(np.float32)[:, None]
        d_l = cuda.to_device(np.full((T_, N), np.nan, np.float32))
        d_e = cuda.to_device(np.full((T_, k), -1, np.int32))
        d_w = cuda.to_device(np.full((T_, k), np.nan, np.float32))
        d_x, norm = cuda.to_device(x), (cuda.to_device(wn), eps) if normed else None
        xq = quant_x_buffers(T_ + 1, K) if quant else None
        for a in xq or ():
            a.copy_to_device(np.full(a.shape, 0xFFFFFFFF, np.uint32).view(a.dtype))
        gemv_route(w, d_x, d_l, k, normalize, d_e, d_w, counter, 0, norm=norm,
                   xq=QuantX(*(a[:T_] for a in xq)) if quant else None, n_routed=E if stacked else None)
        if quant:
            ref = quant_x_buffers(T_, K)
            quantize_x(d_x, ref, 0, norm)
            for name, got, want in zip("qds", xq, ref):
                got, want = got.copy_to_host().view(np.uint32), want.copy_to_host().view(np.uint32)
                assert np.array_equal(got[:T_], want), f"the router's x̂ {name} differs from quantize_x's"
                assert (got[T_] == 0xFFFFFFFF).all(), f"the router wrote x̂ past T rows ({name})"
        logits, experts, weights = d_l.copy_to_host(), d_e.copy_to_host(), d_w.copy_to_host()
        assert np.isfinite(logits).all(), "non-finite logits (poison left?)"
        if normed:
            x = rms_norm_ref(x, wn, eps)
        bound = 1e-4 * np.abs(x.astype(np.float64)) @ wabs.T + 1e-30
        assert (np.abs(logits - gemv_ref(raw, ggml_type, x)) <= bound).all()
        if lead:
            assert (logits.argmax(1) == E).any(), "the extra logit leads no row: the case tests nothing"
        ref_e, ref_w = route_ref(logits[:, :E], k, normalize)
        assert np.array_equal(experts, ref_e), f"experts differ at {np.argwhere(experts != ref_e)[:4].tolist()}"
        np.testing.assert_allclose(weights, ref_w, rtol=1e-5, atol=1e-7)
        assert counter.copy_to_host()[0] == 0


def check_router_batch(rng, E, D, T_, k, normalize, std, tms, quant=True, calls=2, ties=False):
    """router_batch: logits against the float64 product of RMSNorm(x) * wn (wn Gaussian about 1)
    with the router (1e-4 of |h| @ |W|); experts equal to route_ref of the kernel's own logits,
    weights to rtol 1e-5; each grouping (tms: one or two tile sizes) a valid grouping of those
    experts with group_ref's tiles (the second over its own order); with quant, h in int8 within
    half a step of each group (assert_normed_int8), a spare row left alone. Outputs poisoned
    first; `calls` runs on fresh x, the ticket counter back to zero after each. ties: expert 2i +
    1's row is expert 2i's (every logit has an equal twin, the lower expert first)."""
    w = (rng.standard_normal((E, D)) / np.sqrt(D)).astype(np.float32)
    if ties:
        w[1:E:2] = w[0:E - 1:2]
    wn = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    eps = 1e-6
    counter = cuda.to_device(np.zeros(1, np.uint32))
    S = T_ * k
    for _ in range(calls):
        x = (rng.standard_normal((T_, D)) * std).astype(np.float32)
        d_l = cuda.to_device(np.full((T_, E), np.nan, np.float32))
        d_e = cuda.to_device(np.full((T_, k), -1, np.int32))
        d_w = cuda.to_device(np.full((T_, k), np.nan, np.float32))
        groups = [Grouping(tm, *(cuda.to_device(np.full(shape, -7, np.int32))
                                 for shape in ((S,), (S,), (max_tiles(S, E, tm), 3), (1,)))) for tm in tms]
        xq = quant_x_buffers(T_ + 1, D)
        for a in xq:
            a.copy_to_device(np.full(a.shape, 0xFFFFFFFF, np.uint32).view(a.dtype))
        router_batch(cuda.to_device(x), (cuda.to_device(wn), eps), cuda.to_device(w), d_l, k, normalize, d_e, d_w,
                     QuantX(*(a[:T_] for a in xq)) if quant else None, groups, counter, 0)
        logits, experts, weights = d_l.copy_to_host(), d_e.copy_to_host(), d_w.copy_to_host()
        h = rms_norm_ref(x, wn, eps).astype(np.float64)
        bound = 1e-4 * np.abs(h) @ np.abs(w.astype(np.float64)).T + 1e-30
        assert np.isfinite(logits).all() and (np.abs(logits - router_batch_ref(x, wn, eps, w)) <= bound).all()
        ref_e, ref_w = route_ref(logits, k, normalize)
        assert np.array_equal(experts, ref_e), f"experts differ at {np.argwhere(experts != ref_e)[:4].tolist()}"
        np.testing.assert_allclose(weights, ref_w, rtol=1e-5, atol=1e-7)
        own = tuning.ROUTER_DIRECT == OWN and tuple(tms) == (1,)
        for g in groups:
            order, slot_row, tiles, n_tiles = (a.copy_to_host() for a in g[1:])
            if own:  # each slot its own tile and row
                rows = np.arange(S)
                assert n_tiles[0] == S and np.array_equal(order, rows) and np.array_equal(slot_row, rows)
                assert np.array_equal(tiles, np.stack([experts.reshape(-1), rows, np.ones(S, int)], 1))
                continue
            seg, ref_tiles = group_ref(experts.reshape(-1), E, g.tm)
            assert np.array_equal(tiles[:n_tiles[0]], ref_tiles), f"tm {g.tm}: tiles differ from group_ref"
            assert np.array_equal(np.sort(order), np.arange(S)) and np.array_equal(slot_row[order], np.arange(S))
            for e in range(E):
                assert np.array_equal(np.sort(order[seg[e]:seg[e + 1]]), np.flatnonzero(experts.reshape(-1) == e))
        if quant:
            assert_normed_int8(QuantX(*(a[:T_] for a in xq)), x, wn, eps)
        untouched = slice(T_, None) if quant else slice(None)  # the spare row; without quant, all
        assert all((a.copy_to_host()[untouched].view(np.uint32) == 0xFFFFFFFF).all() for a in xq), \
            "x̂ written past T rows, or without quant"
        assert counter.copy_to_host()[0] == 0


def check_down_sum(rng, ggml_type, E, D, F, T_, k, std, accumulate=False, dp4a=False):
    """experts_down_sum against float64: out[t] = sum_j w[t, j] W_e act[t k + j] within 1e-4 of
    sum_j |w| |W_e| |act| per output; accumulate: added into out's Gaussian values (the residual
    stream, std 3 std), the bound growing by 1e-6 of them (one float32 add). dp4a:
    experts_down_sum_dp4a, act taken as its int8 form x̂ (quantize_x_ref's, dequantized)."""
    raw = make_weight(ggml_type, E * D, F, rng)
    slots = routed(rng, T_, E, k).reshape(-1)
    act = (rng.standard_normal((T_ * k, F)) * std).astype(np.float32)
    wts = rng.random((T_, k)).astype(np.float32)
    wts /= wts.sum(axis=1, keepdims=True)
    wd = dequantize(raw, ggml_type).reshape(E, D, F).astype(np.float64)
    x = dequantize_x_ref(*quantize_x_ref(act)[:2]) if dp4a else act.astype(np.float64)
    y = np.einsum("sdf,sf->sd", wd[slots], x).reshape(T_, k, D)
    yabs = np.einsum("sdf,sf->sd", np.abs(wd[slots]), np.abs(x)).reshape(T_, k, D)
    ref = (wts[:, :, None] * y).sum(axis=1)
    if dp4a:
        np.testing.assert_allclose(down_sum_dp4a_ref(wd, act, slots, wts), ref, rtol=1e-12, atol=1e-12)
    bound = 1e-4 * (wts[:, :, None] * yabs).sum(axis=1) + 1e-30
    start = np.full((T_, D), np.nan, np.float32)  # poison: overwritten unless accumulating
    if accumulate:
        start = (rng.standard_normal((T_, D)) * 3 * std).astype(np.float32)
        ref = ref + start
        bound = bound + 1e-6 * np.abs(start)
    d_out = cuda.to_device(start)
    down_sum = experts_down_sum_dp4a if dp4a else experts_down_sum
    down_sum(repack(raw, ggml_type).to_device(), D, cuda.to_device(act), d_out, cuda.to_device(slots),
             cuda.to_device(wts), 0, accumulate)
    out = d_out.copy_to_host().astype(np.float64)
    assert np.isfinite(out).all(), "non-finite outputs (poison left?)"
    assert (np.abs(out - ref) <= bound).all(), f"max err/bound {np.max(np.abs(out - ref) / bound):.3g}"


def check_down_next_input(rng, ggml_type, E, D, F, T_, k, std, eps=1e-6):
    """experts_down_sum_dp4a with next_input (its last block's quant_tail) adds into x the bits the
    kernel without it adds, and writes RMSNorm(x) * w_next in int8 as the normed quantize_x does
    (assert_normed_int8), poisoned first; twice, so the grid's ticket counter is back at zero
    after a launch."""
    raw = make_weight(ggml_type, E * D, F, rng)
    w = repack(raw, ggml_type).to_device()
    slots = cuda.to_device(routed(rng, T_, E, k).reshape(-1))
    act = cuda.to_device((rng.standard_normal((T_ * k, F)) * std).astype(np.float32))
    wts = rng.random((T_, k)).astype(np.float32)
    wts = cuda.to_device(wts / wts.sum(axis=1, keepdims=True))
    start = (rng.standard_normal((T_, D)) * 3 * std).astype(np.float32)
    w_next = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    plain = cuda.to_device(start)
    experts_down_sum_dp4a(w, D, act, plain, slots, wts, 0, accumulate=True)
    want = plain.copy_to_host()
    xq = quant_x_buffers(T_, D)
    counter = cuda.to_device(np.zeros(1, np.uint32))
    for _ in range(2):
        for a in xq:
            a.copy_to_device(np.full(a.shape, 0xFFFFFFFF, np.uint32).view(a.dtype))
        x = cuda.to_device(start)
        experts_down_sum_dp4a(w, D, act, x, slots, wts, 0, accumulate=True,
                              next_input=NextInput(cuda.to_device(w_next), eps, xq, counter))
        assert np.array_equal(x.copy_to_host().view(np.uint32), want.view(np.uint32))
        assert counter.copy_to_host()[0] == 0
        assert_normed_int8(xq, want, w_next, eps)


def group(experts_flat, E, tm):
    """moe_group on the device -> (order, slot_row, tiles[:n_tiles])."""
    S = experts_flat.size
    outs = [cuda.to_device(np.full(shape, -7, np.int32))
            for shape in ((S,), (S,), (max_tiles(S, E, tm), 3), (1,))]
    moe_group(cuda.to_device(experts_flat), E, tm, *outs, 0)
    order, slot_row, tiles, n_tiles = (o.copy_to_host() for o in outs)
    return order, slot_row, tiles[:n_tiles[0]]


def check_group(rng, T_, E, k, tm, same=False):
    experts = routed(rng, T_, E, k, same).reshape(-1)
    order, slot_row, tiles = group(experts, E, tm)
    S = experts.size
    seg, ref_tiles = group_ref(experts, E, tm)
    assert np.array_equal(tiles, ref_tiles), "tiles differ from group_ref"
    assert np.array_equal(np.sort(order), np.arange(S)), "order is not a permutation of the slots"
    assert np.array_equal(slot_row[order], np.arange(S)), "slot_row is not order's inverse"
    for e in range(E):
        assert np.array_equal(np.sort(order[seg[e]:seg[e + 1]]), np.flatnonzero(experts == e)), f"expert {e}"
    assert np.array_equal(np.bincount(order // k, minlength=T_), np.full(T_, k)), "a token not routed k times"


def host_order(experts_flat, E, tm):
    """A valid grouping computed on the host (stable order), for the GEMM checks."""
    order = np.argsort(experts_flat, kind="stable").astype(np.int32)
    return order, group_ref(experts_flat, E, tm)[1]


def check_gemv_experts(rng, ggml_type, E, N, K, T_, k, glu, std, variant=None):
    raw = make_weight(ggml_type, E * N, K, rng)
    slots = routed(rng, T_, E, k).reshape(-1)
    x = (rng.standard_normal((T_, K)) * std).astype(np.float32)
    out_n = N // 2 if glu else N
    d_y = cuda.to_device(np.full((slots.size, out_n), np.nan, np.float32))
    gemv_experts(repack(raw, ggml_type).to_device(), N, cuda.to_device(x), d_y, cuda.to_device(slots), k, 0,
                 glu=glu, variant=variant)
    y = d_y.copy_to_host().astype(np.float64)
    wd = dequantize(raw, ggml_type).reshape(E, N, K).astype(np.float64)
    xs = x.astype(np.float64)[np.arange(slots.size) // k]
    full = np.einsum("snk,sk->sn", wd[slots], xs)
    bound = 1e-4 * np.einsum("snk,sk->sn", np.abs(wd[slots]), np.abs(xs)) + 1e-30
    if glu:
        g, u = full[:, :out_n], full[:, out_n:]
        sg = g / (1 + np.exp(-g))
        ref = sg * u
        bound = bound[:, :out_n] * np.abs(u) * 1.1 + bound[:, out_n:] * np.abs(sg)
    else:
        ref = full
    assert np.isfinite(y).all(), "non-finite outputs (poison left?)"
    err = np.abs(y - ref)
    assert (err <= bound).all(), f"max err/bound {np.max(err / bound):.3g}"


def check_gemm_grouped(rng, ggml_type, E, N, K, T_, k, std, gathered=True, gemm=gemm_grouped):
    raw = make_weight(ggml_type, E * N, K, rng)
    experts = routed(rng, T_, E, k).reshape(-1)
    S = experts.size
    order, tiles = host_order(experts, E, BM)
    a = (rng.standard_normal((T_ if gathered else S, K)) * std).astype(np.float16)
    x_div = k if gathered else 0
    d_c = cuda.to_device(np.full((S, N), np.nan, np.float32))
    d_tiles = cuda.to_device(np.concatenate([tiles, np.full((max_tiles(S, E, BM) - len(tiles), 3), -1, np.int32)]))
    gemm(cuda.to_device(a), repack(raw, ggml_type).to_device(), N, d_c, d_tiles,
                 cuda.to_device(np.array([len(tiles)], np.int32)), cuda.to_device(order), x_div, 0)
    got = d_c.copy_to_host().astype(np.float64)
    ref = grouped_ref(a, raw, ggml_type, N, tiles, order, x_div, S)
    src = order[np.arange(S)] // k if gathered else np.arange(S)
    a_rows = np.empty((S, K), np.float16)
    a_rows[np.arange(S)] = a[src]
    w16 = dequant_ref(raw, ggml_type).reshape(E, N, K)
    seg_e = experts[order]  # expert of each grouped row
    for e in np.unique(seg_e):
        rows = np.flatnonzero(seg_e == e)
        check_gemm(got[rows], ref[rows], a_rows[rows], w16[e], K)


def check_combine(rng, T_, k, D, std, accumulate=False):
    S = T_ * k
    y = (rng.standard_normal((S, D)) * std).astype(np.float32)
    rows = rng.permutation(S).astype(np.int32)
    weights = rng.random((T_, k)).astype(np.float32)
    start = (rng.standard_normal((T_, D)) * std).astype(np.float32) if accumulate else np.full((T_, D), np.nan, np.float32)
    d_out = cuda.to_device(start)
    moe_combine(cuda.to_device(y), cuda.to_device(rows), cuda.to_device(weights), d_out, 0, accumulate=accumulate)
    got = d_out.copy_to_host()
    if not accumulate:
        np.testing.assert_allclose(got, combine_ref(y, rows, weights), rtol=1e-5, atol=1e-6 * std)
        return
    # out + the sum in float32, the sum as the plain form writes it: a residual add of that output
    d_sum = cuda.to_device(np.full((T_, D), np.nan, np.float32))
    moe_combine(cuda.to_device(y), cuda.to_device(rows), cuda.to_device(weights), d_sum, 0)
    assert np.array_equal(got, start + d_sum.copy_to_host())


def check_combine_next(rng, T_, k, D, std, accumulate, pad, nc=None, vq=False, early=False):
    """moe_combine_next (x and the next layer's x̂ of T_ rows and pad rows of slab padding) against
    moe_combine then quantize_x32, every output poisoned first: x bit for bit (the same sums in the
    same order), the scales within the last bits of the row's norm (its sum of squares in another
    order) and so each int8 value within one; nc blocks a row (default: the GPU's cluster, the
    simulator's one block); against the references: the
    combine within rounding, the padding zero, each x̂ within half its group's step of
    RMSNorm(x) * wn, each group's s = d times its int8 sum. vq: V's input in quant_x's form too,
    against quantize_x's of the same rows the same way. early: the build that reads rows, weights
    and x before its wait."""
    S, MP, eps = T_ * k, T_ + pad, 1e-6
    y = (rng.standard_normal((S, D)) * std).astype(np.float32)
    rows = rng.permutation(S).astype(np.int32)
    weights = rng.random((T_, k)).astype(np.float32)
    start = (rng.standard_normal((T_, D)) * std).astype(np.float32) if accumulate else np.full((T_, D), np.nan, np.float32)
    wn = (1.0 + 0.5 * rng.standard_normal(D)).astype(np.float32)
    dy, drows, dw, dwn = (cuda.to_device(a) for a in (y, rows, weights, wn))
    got = []
    for fused in (True, False):
        dx = cuda.to_device(start)
        out = QuantX32(cuda.to_device(np.full((MP, D // 4), 0xDEADBEEF, np.uint32)),
                       cuda.to_device(np.full((D // XGROUP, MP, 2), np.nan, np.float32)))
        xq = QuantX(cuda.to_device(np.full((T_, D // 4), 0xDEADBEEF, np.uint32)),
                    *(cuda.to_device(np.full((T_, D // GROUP), np.nan, np.float32)) for _ in "ds")) if vq else None
        if fused:
            moe_combine_next(dy, drows, dw, dx, 0, accumulate, (dwn, eps), out, nc, vq=xq, early=early)
        else:
            moe_combine(dy, drows, dw, dx, 0, accumulate=accumulate)
            quantize_x32(dx, out, 0, (dwn, eps))
            if vq:
                quantize_x(dx, xq, 0, (dwn, eps))
        got.append((dx.copy_to_host(), out.q.copy_to_host(), out.ds.copy_to_host(),
                    xq and tuple(a.copy_to_host() for a in xq)))
    (x, q, ds, v), (x2, q2, ds2, v2) = got
    assert np.array_equal(x, x2)
    np.testing.assert_allclose(ds[:, :, 0], ds2[:, :, 0], rtol=2e-6, atol=0)
    assert np.abs(q.view(np.int8).astype(np.int32) - q2.view(np.int8).astype(np.int32)).max() <= 1
    ref_x, _, _ = combine_next_ref(y, rows, weights, start, accumulate, wn, eps, MP)
    np.testing.assert_allclose(x, ref_x, rtol=1e-5, atol=1e-5 * std)
    assert not q[T_:].any() and not ds[:, T_:].any()
    xn = rms_norm_ref(x, wn, eps).astype(np.float64)
    d = ds[:, :T_, 0].T.astype(np.float64)  # (T_, groups)
    vals = q[:T_].view(np.int8).reshape(T_, -1, XGROUP).astype(np.float64)
    xg = xn.reshape(T_, -1, XGROUP)
    assert np.all(np.abs(vals * d[:, :, None] - xg) <= d[:, :, None] * 0.5001 + 1e-6 * np.abs(xg))
    assert np.array_equal(ds[:, :T_, 1].T, (ds[:, :T_, 0].T * vals.sum(axis=2).astype(np.float32)))
    if vq:
        (vq_q, vq_d, vq_s), (q16, d16, _) = v, v2
        np.testing.assert_allclose(vq_d, d16, rtol=2e-6, atol=0)
        assert np.abs(vq_q.view(np.int8).astype(np.int32) - q16.view(np.int8).astype(np.int32)).max() <= 1
        vals16 = vq_q.view(np.int8).reshape(T_, -1, GROUP).astype(np.float64)
        x16 = xn.reshape(T_, -1, GROUP)
        assert np.all(np.abs(vals16 * vq_d[:, :, None] - x16) <= vq_d[:, :, None] * 0.5001 + 1e-6 * np.abs(x16))
        assert np.array_equal(vq_s, vq_d * vals16.sum(axis=2).astype(np.float32))


@pytest.mark.parametrize("nc", [1, 8])
@pytest.mark.parametrize("T_,k,D,pad", [(8, 8, 2048, 8), (5, 8, 2048, 11), (16, 8, 4096, 0), (3, 2, 1024, 1)])
def test_combine_next(T_, k, D, pad, nc):
    rng = np.random.default_rng([T_, k, D, pad, nc])
    for std in STDS:
        for accumulate in (True, False):
            for early in (False, True):
                check_combine_next(rng, T_, k, D, std, accumulate, pad, nc, vq=accumulate, early=early)


@pytest.mark.parametrize("k", [1, 2, 8])
@pytest.mark.parametrize("T_,E", [(1, 128), (19, 8), (111, 128), (512, 60), (7, 256)])
@pytest.mark.parametrize("normalize", [True, False])
def test_route(k, T_, E, normalize):
    rng = np.random.default_rng([k, T_, E])
    for std in STDS:
        check_route(rng, T_, E, k, normalize, std)
    check_route(rng, T_, E, k, normalize, 1.0, ties=True)


@pytest.mark.parametrize("ggml_type", [T.F32, T.Q8_0, T.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("T_,E,K,k", [(1, 128, 2048, 8), (3, 60, 512, 4), (8, 256, 768, 1), (2, 8, 2304, 2),
                                      (5, 1000, 128, 8)])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("normed", [False, True])
def test_gemv_route(ggml_type, T_, E, K, k, normalize, normed):
    """Qwen3-30B-A3B's router (128 experts, k 8), odd expert counts, k 1..8, T 1..8; its input
    normed (decode) or not, and then its int8 form written (decode before dp4a experts; K 2304:
    two of quantize_x's blocks a token); at std 1 every logit tied with its twin's (ties)."""
    rng = np.random.default_rng([int(ggml_type), T_, E, k, normed])
    for std in STDS:
        check_gemv_route(rng, ggml_type, E, K, T_, k, normalize, std, normed=normed, quant=normed, ties=std == 1.0)


@pytest.mark.parametrize("ggml_type", [T.F32, T.Q8_0, T.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("T_,E,K,k", [(1, 256, 2048, 8), (2, 256, 2048, 8), (8, 60, 512, 4), (3, 1023, 128, 2)])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("normed", [False, True])
def test_gemv_route_stacked(ggml_type, T_, E, K, k, normalize, normed):
    """The router with Qwen3.5's shared expert gate stacked under it (E + 1 rows, n_routed E):
    Qwen3.6-35B-A3B's (256 experts, k 8, D 2048) at T 1 and 2, odd expert counts up to
    MAX_EXPERTS - 1 (E + 1 rows fill MAX_EXPERTS), ties at std 1."""
    rng = np.random.default_rng([int(ggml_type), T_, E, k, normed, 1])
    for std in STDS:
        check_gemv_route(rng, ggml_type, E, K, T_, k, normalize, std, normed=normed, quant=normed,
                         ties=std == 1.0, stacked=True)


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_K, T.MXFP4, T.NVFP4,
                                       T.F16, T.F32], ids=lambda t: t.name)
@pytest.mark.parametrize("accumulate", [False, True])
def test_down_sum(ggml_type, accumulate):
    """Qwen3-30B-A3B's down (128 experts, D 2048, F 768, k 8), D not a multiple of the block's
    rows (odd too), F of 32 chunks per lane, k 1..8, T 1..8; stored, or added into x."""
    rng = np.random.default_rng([int(ggml_type), accumulate])
    cases = [(128, 2048, 768, 1, 8), (60, 132, 2304, 3, 5), (16, 76, 256, 8, 1), (8, 77, 512, 2, 3)]
    for (E, D, F, T_, k), std in zip(cases, STDS + (1.0,)):
        check_down_sum(rng, ggml_type, E, D, F, T_, k, std, accumulate)


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_K, T.MXFP4, T.NVFP4],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("accumulate", [False, True])
def test_down_sum_dp4a(ggml_type, accumulate):
    """As test_down_sum on dp4a: Qwen3-30B-A3B's down, D not a multiple of the block's rows (odd
    too, one block's worth), k * F / 32 past one block's 1024 threads (k 5, F 7168), k 1..8, T 1..8."""
    rng = np.random.default_rng([int(ggml_type), accumulate, 1])
    cases = [(128, 2048, 768, 1, 8), (60, 132, 2304, 3, 5), (16, 9, 256, 8, 1), (8, 77, 512, 2, 3),
             (6, 20, 7168, 1, 5)]
    for (E, D, F, T_, k), std in zip(cases, STDS + (1.0, 0.3)):
        check_down_sum(rng, ggml_type, E, D, F, T_, k, std, accumulate, dp4a=True)


@pytest.mark.parametrize("ggml_type", [T.NVFP4, T.MXFP4, T.Q8_0, T.Q6_K, T.Q4_K], ids=lambda t: t.name)
def test_down_sum_dp4a_next_input(ggml_type):
    """The down's tail writing the next layer's int8 input (DOWN_QUANT_TAIL): Qwen3-30B-A3B's
    shape at T 1 and 3, a grid of 2 blocks, the tail's groups past the block's threads (D 4096 on
    F 256's 64-thread blocks)."""
    rng = np.random.default_rng([int(ggml_type), 2])
    for (E, D, F, T_, k), std in zip([(128, 2048, 768, 1, 8), (128, 2048, 768, 3, 8), (4, 16, 256, 1, 2),
                                      (8, 4096, 256, 2, 2)], STDS + (1.0,)):
        check_down_next_input(rng, ggml_type, E, D, F, T_, k, std)


@pytest.mark.parametrize("T_,E,k", [(1, 128, 8), (19, 8, 2), (512, 128, 8), (111, 60, 4), (3, 256, 1)])
@pytest.mark.parametrize("tm", [1, BM])
def test_group(T_, E, k, tm):
    rng = np.random.default_rng([T_, E, k, tm])
    check_group(rng, T_, E, k, tm)
    check_group(rng, T_, E, k, tm, same=True)  # every token picks the same experts


@pytest.mark.parametrize("E,D,T_,k,tms", [(128, 2048, 8, 8, (2, 8)), (128, 2048, 16, 8, (2,)), (128, 2048, 32, 8, (8,)),
                                          (256, 2048, 13, 8, (4, 8)), (60, 640, 5, 4, (1,)), (7, 96, 2, 2, (3, 1))])
def test_router_batch(E, D, T_, k, tms):
    """The 30B-A3B's router at the grouped decode's buckets, Qwen3.6-35B-A3B's 256 experts at an
    odd row count, and small odd shapes (fewer rows than a block's pass, more blocks than rows)."""
    rng = np.random.default_rng([E, D, T_])
    for std, normalize in zip(STDS, (True, False, True)):
        check_router_batch(rng, E, D, T_, k, normalize, std, tms, quant=std != 10.0)
    check_router_batch(rng, E, D, T_, k, True, 1.0, tms, calls=1, ties=True)


@pytest.mark.parametrize("direct", [SCAN, OWN, RANKED])
@pytest.mark.parametrize("E,D,T_,k", [(128, 2048, 8, 8), (128, 2048, 16, 8), (256, 2048, 13, 8), (60, 640, 5, 4)])
def test_router_batch_a_token_a_tile(E, D, T_, k, direct, monkeypatch):
    """router_batch's one grouping of a token a tile by each of its ways (tuning.ROUTER_DIRECT):
    moe_group's scans, the slots in their own order, by ranks."""
    monkeypatch.setattr(tuning, "ROUTER_DIRECT", direct)
    rng = np.random.default_rng([E, D, T_, direct])
    for std, normalize in zip(STDS, (True, False, True)):
        check_router_batch(rng, E, D, T_, k, normalize, std, (1,))
    check_router_batch(rng, E, D, T_, k, True, 1.0, (1,), calls=1, ties=True)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4, T.NVFP4,
                                       T.F16, T.F32], ids=lambda t: t.name)
@pytest.mark.parametrize("glu", [False, True])
def test_gemv_experts(ggml_type, glu):
    rng = np.random.default_rng([int(ggml_type), glu])
    for (E, N, K, T_, k), std in zip([(8, 64, 256, 1, 2), (16, 512, 2048, 1, 8), (60, 256, 768, 3, 4)], STDS):
        check_gemv_experts(rng, ggml_type, E, N if glu else N // 2 + 8, K, T_, k, SILU if glu else 0, std)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.MXFP4, T.NVFP4, T.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("T_,E,k", [(19, 8, 2), (111, 128, 8), (512, 60, 4)])
def test_gemm_grouped(ggml_type, T_, E, k):
    rng = np.random.default_rng([int(ggml_type), T_, E])
    for std, gathered in zip(STDS, (True, False, True)):
        check_gemm_grouped(rng, ggml_type, E, 136, 512, T_, k, std, gathered)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.MXFP4, T.NVFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("T_,E,k", [(19, 8, 2), (111, 128, 8), (512, 60, 4)])
def test_gemm_grouped_wgmma(ggml_type, T_, E, k):
    """The wgmma grouped GEMM on gemm_grouped's checks (its tiles, gathered and in-place rows)."""
    rng = np.random.default_rng([int(ggml_type), T_, E, 1])
    for std, gathered in zip(STDS, (True, False, True)):
        check_gemm_grouped(rng, ggml_type, E, 136, 512, T_, k, std, gathered, gemm=gemm_grouped_wgmma)
    check_gemm_grouped(rng, ggml_type, 16, 2048, 768, 64, 8, 1.0, True, gemm=gemm_grouped_wgmma)


@pytest.mark.parametrize("T_,k,D", [(1, 8, 2048), (19, 2, 640), (512, 8, 2048)])
def test_combine(T_, k, D):
    rng = np.random.default_rng([T_, k, D])
    for std in STDS:
        check_combine(rng, T_, k, D, std)
        check_combine(rng, T_, k, D, std, accumulate=True)
