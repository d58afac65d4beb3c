"""The routed-expert FFN of a qwen3moe layer on the GPU (reference: numpy_ops.moe).

  logits = h · ffn_gate_inpᵀ (fp32) -> top-k experts and weights per token (moe_route; at decode
      the router GEMV's last block, gemv_route.gemv_route; or, folded through W_o, beside attn_output's
      GEMV in its launch, kernels/moe/router_fold.py)
  decode (moe_ffn_decode, T <= GEMV_MAX_ROWS): h = RMSNorm(x) * ffn_norm read by the router GEMV
      itself, which also writes h in int8 for dp4a experts (else a norm kernel writes float h);
      GEMVs over the chosen experts' rows
      act[s] = silu(gate_e h[t]) * up_e h[t]      (s = t * k + j; on dp4a with h in int8 where
                                                   the gate|up Linear takes dp4a)
      x[t] += sum_j weight[t, j] * down_e act[s]  (kernels/moe/gemv_moe.py: the GEMV, the weighted sum
                                                   and the residual add in one kernel; on dp4a
                                                   with act made int8 in it, gemv_moe_dp4a.py)
  prefill (moe_ffn; also a batch's decode of 2..MOE_GROUPED_ROWS rows, moe_ffn_grouped_decode, whose
      norm, router, routing, grouping and int8 h take one launch where they can, kernels/moe/router_batch.py):
      slots grouped by expert (moe_group) into tiles, each expert GEMM on the path
      gpu/moe_dispatch.py measured fastest: the grouped tensor-core tiles or cuBLAS batched over
      the tiles, or for a batch's few tokens an expert int8 paths (gpu/moe_prefill.py)
      gate_up = [h rows] · gate_up_eᵀ -> act (fp16) -> y = act · down_eᵀ     (rows grouped by expert)
      out[t] = sum_j weight[t, j] * y[row of slot t * k + j]                 (moe_combine)
Under tensor parallelism the experts are split by width, or by whole experts (m.expert_range:
the routed slots made local to the rank, kernels/moe/expert_shard.py); either way each rank's
sum is partial and all-reduced after the down.
  moe_shared (Qwen3.5): a shared expert beside the routed ones, read from the same h,
      act_sh = silu(gate_shexp h) * up_shexp h       (before the routed experts add into x at decode)
      x += sigmoid(h · ffn_gate_inp_shexp) * down_shexp act_sh
      at prefill act_sh is times the sigmoid (sigmoid_gate) and one more residual update follows the
      routed one; at decode the shared gate's row is stacked under the router's (ffn_gate_inps), so
      the router GEMV writes its logit as logit E, and the down GEMV scales its dot products by the
      sigmoid of that as it accumulates into x (gemv_gated; else the gate's GEMV and sigmoid_gate)
Everything stays on the device: no host synchronization, so a step remains one CUDA graph.
Legend: T tokens, D model dim, E experts, k used per token, F expert FFN dim, S = T * k slots.
"""

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType

from impnb.gpu.layer_weights import Experts
from impnb.gpu import moe_dispatch
from impnb.gpu.moe_prefill import experts_int8, experts_prefill, int8_groupings
from impnb.gpu.weights import Linear
from impnb.kernels.elementwise import activations
from impnb.kernels.gemv import gemv, gemv_experts, gemv_route
from impnb.kernels.moe import gemv_moe_dp4a as down_dp4a
from impnb.kernels.elementwise import norm as norm_fn
from impnb.kernels.elementwise.sigmoid_gate import sigmoid_gate
from impnb.kernels.gemv.gemv_dp4a_experts import gemv_dp4a_experts
from impnb.kernels.moe.gemv_moe import experts_down_sum
from impnb.kernels.gemv.gemv_tail import Residual
from impnb.kernels.gemm.quant_x32 import QuantX32
from impnb.kernels.gemv.quant_x import QuantX, arena_buffers
from impnb.kernels.moe.expert_shard import localize
from impnb.kernels.moe import router_batch
from impnb.kernels.moe.combine_next import moe_combine_next
from impnb.kernels.moe.moe import moe_combine, moe_route
from impnb.kernels.moe.router_fold import router_fold
from impnb.tuning import GEMV_MAX_ROWS


def moe_ffn(m, h, ex: Experts, out, residual: Residual | None, accumulate: bool = False) -> None:
    """Prefill (or a batch's decode rows, moe_ffn_grouped_decode): out (T, D) float32 = the routed
    experts' SwiGLU FFN of h (T, D), grouped by expert (out += with accumulate: the residual add
    itself, out being x); then residual (gemv_tail.Residual) applied to out, and to the shared
    expert's output where the layer has one (None: no shared expert)."""
    cfg, a, s = m.cfg, m.arena, m.ctx.nb_stream
    T = h.shape[0]
    k, E = cfg.n_expert_used, cfg.n_expert
    shared = None
    assert residual is not None or ex.shared is None, "the shared expert's output: a residual update"
    if ex.shared is not None:  # GEMMs of h, before the residual updates below overwrite h
        shared = a.get("shexp_out", (T, cfg.n_embd))
        m.mm.linear(_shared_act(m, h, ex, None), ex.shared.down, shared)
    logits = a.get("moe_logits", (T, E))
    experts = a.get("moe_experts", (T, k), np.int32)
    weights = a.get("moe_weights", (T, k))
    m.mm.linear_f32(h, ex.router, logits)
    moe_route(logits, k, cfg.expert_weights_norm, experts, weights, s)
    if m.expert_range is not None:  # the rank's experts alone (expert parallelism)
        localize(experts, weights, *m.expert_range, s)
        E = m.expert_range[1]
    glu = (ex.gate_up,) if ex.gate_up is not None else (ex.gate, ex.up)
    paths = moe_dispatch.ffn_paths((*glu, ex.down), E, T)
    if paths[0] in moe_dispatch.INT8_PATHS:
        y, rows = experts_int8(m, h, ex.gate_up, ex.down, experts.reshape(T * k), k, E, paths, gemv.SILU)
    else:
        _, y, rows = experts_prefill(m, m.mm.x16(h), glu, ex.down, experts.reshape(T * k), k, E, paths)
    moe_combine(y, rows, weights, out, s, accumulate)
    m.all_reduce(out)  # each rank's experts are a slice of every expert's width
    if residual is not None:
        residual.unfused(out, s)
    if shared is not None:
        residual.unfused(shared, s)


def moe_ffn_decode(m, x, ex: Experts, norm: tuple, next_input=None) -> None:
    """Decode (T <= GEMV_MAX_ROWS): x (T, D) float32 += the routed experts' SwiGLU FFN of
    h = RMSNorm(x) * wn, norm = (wn, eps), and the shared expert's where the layer has one;
    next_input (gemv_moe_dp4a.NextInput, no shared expert): the down's last block writes the next
    layer's int8 input there."""
    cfg, a, s = m.cfg, m.arena, m.ctx.nb_stream
    T, D = x.shape
    assert T <= GEMV_MAX_ROWS
    folded = _gate_folded(m, ex, T)
    shared = _shared_act(m, x, ex, norm, not folded) if ex.shared is not None else None  # reads x before the add
    router, E = ex.gate_inps if folded else ex.router, ex.router.w.rows
    logits, experts, weights = _route_buffers(m, T, router.w.rows)  # folded: logit E the shared gate's
    xq = m.mm.xq_buffers(T, D) if ex.gate_up_dp4a else None  # the router writes h in int8
    gemv_route.gemv_route(router.w, x, logits, cfg.n_expert_used, cfg.expert_weights_norm, experts, weights,
                          a.zeros("route_counter", (1,), np.uint32), s, norm=norm, xq=xq, n_routed=E)
    if m.expert_range is not None:  # the rank's experts alone (expert parallelism; the logits left alone)
        localize(experts, weights, *m.expert_range, s)
    assert next_input is None or shared is None, "the shared expert adds into x after the routed down"
    _experts_decode(m, x, ex, norm, xq, experts, weights, next_input)
    if shared is None:
        return
    if folded:  # x += sigmoid(logits[t, E]) * down act[t]
        m.mm.linear_gated(shared, ex.shared.down, x, logits, E)
    else:
        m.mm.linear(shared, ex.shared.down, x, accumulate=True)


# The shared gate's sigmoid goes into the shared down GEMV rather than the shared gate|up's GLU
# epilogue: the down's width (F_sh, under DP4A_MIN_K) keeps it on gemv.py's kernel, one kernel to
# give a gate, where the gate|up takes gemv_stacked's GLU, gemv_dp4a or gemv_dp4a_multi by shape
# and T; the router already runs before the down (the GLU runs before the router: reordering
# would be needed); and the numpy reference gates the shared expert's output, the same order.
def _gate_folded(m, ex: Experts, n_tok: int) -> bool:
    """Whether a decode step of n_tok rows folds the shared expert's gate: its row stacked under the
    router's at load (ex.gate_inps) and the shared down on gemv.py's kernel at this T, whose gated
    form applies the sigmoid (gemv_dp4a and gemv_dp4a_multi have none: the gate then runs apart)."""
    return ex.gate_inps is not None and m.mm.takes_gated(ex.shared.down, n_tok)


def _shared_act(m, h, ex: Experts, norm: tuple | None, gated: bool = True):
    """The shared expert's act (T, F_sh) = silu(gate h) * up h, times sigmoid(h · shared_gateᵀ)
    where gated, gate|up one GEMV where stacked; norm (wn, eps): of RMSNorm(h) * wn."""
    sh, a, s, T = ex.shared, m.arena, m.ctx.nb_stream, h.shape[0]
    F = sh.down.w.cols
    act = a.get("shexp_act", (T, F))
    if sh.gate_up is not None:
        m.mm.glu(h, sh.gate_up, "silu", act, norm)
    else:
        up = a.get("shexp_up", (T, F))
        m.mm.linear(h, sh.gate, act, norm)
        m.mm.linear(h, sh.up, up, norm)
        activations.swiglu(act, up, act, s)
    if gated:
        gate = a.get("shexp_gate", (T, 1))
        m.mm.linear(h, ex.shared_gate, gate, norm)
        sigmoid_gate(act, gate, s)
    return act


class NextX32(NamedTuple):
    """The next layer's Q|K|V input a grouped MoE layer's combine writes (moe_combine_next):
    RMSNorm(x) * wn, norm = (wn, eps), in gemm_mmq's int8 form (x32), and for a V of another type on
    the dp4a GEMV in quant_x's form too (vq)."""
    norm: tuple
    x32: QuantX32
    vq: QuantX | None = None


def moe_ffn_grouped_decode(m, x, ex: Experts, norm: tuple, next32=None):
    """Decode of a batch's rows (tuning.MOE_GROUPED_MIN_ROWS..MOE_GROUPED_ROWS, and any batch past
    GEMV_MAX_ROWS) with the experts grouped as at prefill: x (T, D) += moe_ffn of h = RMSNorm(x) *
    wn, norm = (wn, eps), written by a norm kernel first. The combine adds into x (under tensor
    parallelism rank 0 adds its partial sum, the others write theirs there, and x is all-reduced);
    with a shared expert a residual update adds each output instead (its norm output to a scratch:
    the next layer norms x itself). next32 (NextX32 of forward's _next_x32, or None): where
    router_batch routes, the combine also writes the next layer's input there (moe_combine_next)
    and returns next32; else None (the next layer quantizes its own)."""
    a, s = m.arena, m.ctx.nb_stream
    if _routes_in_one(m, ex, x.shape[0]):
        return _grouped_routed(m, x, ex, norm, next32)
    h = a.get("h", x.shape)
    norm_fn.rms_norm(x, norm[0], h, norm[1], s)
    if ex.shared is None:
        moe_ffn(m, h, ex, x, None, accumulate=m.reduce_leader)
        return None
    res = Residual(x, a.get("moe_h_next", x.shape), norm[0], None, norm[1], a.zeros("tail_counter", (1,), np.uint32))
    moe_ffn(m, h, ex, a.get("moe_out", x.shape), res)
    return None


def _routes_in_one(m, ex: Experts, n_tok: int) -> bool:
    """Whether a grouped decode of n_tok rows routes in router_batch's one launch (up to
    ROUTER_BATCH_ROWS rows): no shared expert, all experts on this rank, an F32 router, the experts
    on int8 paths."""
    cfg = m.cfg
    if not (n_tok <= m.tuning.router_batch_rows and ex.shared is None and m.expert_range is None
            and ex.gate_up is not None and ex.router.w.ggml_type == GGMLQuantizationType.F32
            and router_batch.takes(n_tok, cfg.n_expert, cfg.n_expert_used)):
        return False
    return moe_dispatch.ffn_paths((ex.gate_up, ex.down), cfg.n_expert, n_tok)[0] in moe_dispatch.INT8_PATHS


def _grouped_routed(m, x, ex: Experts, norm: tuple, next32=None):
    """moe_ffn_grouped_decode with the router, the routing, the grouping of the slots and (for a
    dp4a GEMV gate|up) h in int8 in one launch (router_batch): x (T, D) += the routed experts'
    SwiGLU FFN of RMSNorm(x) * wn, norm = (wn, eps); with next32 (one rank) the combine writes the
    next layer's input too -> next32, else None."""
    cfg, a, s = m.cfg, m.arena, m.ctx.nb_stream
    T, D = x.shape
    k, E = cfg.n_expert_used, cfg.n_expert
    logits, experts, weights = _route_buffers(m, T)
    paths = moe_dispatch.ffn_paths((ex.gate_up, ex.down), E, T)
    hq = arena_buffers(a, T, D, "moe_hq") if paths[0] in moe_dispatch.GEMV_PATHS else None
    w = ex.router.w
    groups = int8_groupings(a, T * k, E, paths)
    router_batch.router_batch(x, norm, w.parts[0].view(np.float32).reshape(w.rows, w.cols), logits, k,
                              cfg.expert_weights_norm, experts, weights, hq, groups,
                              a.zeros("router_batch_counter", (1,), np.uint32), s)
    y, rows = experts_int8(m, x, ex.gate_up, ex.down, experts.reshape(T * k), k, E, paths, gemv.SILU, norm,
                           routed=True, slot_order=router_batch.in_slot_order(groups))
    if next32 is not None:
        assert m.tp is None, "the next layer's input is of x all-reduced"
        # (the down's kernel, grouped GEMV or GEMM, waits for its inputs before it lets the combine launch)
        moe_combine_next(y, rows, weights, x, s, m.reduce_leader, next32.norm, next32.x32, vq=next32.vq,
                         early=m.tuning.combine_early)
        return next32
    moe_combine(y, rows, weights, x, s, m.reduce_leader)
    m.all_reduce(x)  # each rank's experts are a slice of every expert's width
    return None


def attn_output_moe_decode(m, attn, aq, x, out, o: Linear, ex: Experts, norm: tuple, next_input=None) -> None:
    """Decode, the router folded into attn_output's (o's) launch (kernels/moe/router_fold.py, for
    the layers with ex.fold): out (T, D) = x + W_o â (aq: â, the int8 form of attn (T, H Dv)
    that decode attention wrote), then out += the routed experts' SwiGLU FFN of
    RMSNorm(out) * wn, norm = (wn, eps); next_input as in moe_ffn_decode."""
    cfg, a, s = m.cfg, m.arena, m.ctx.nb_stream
    T, D = x.shape
    logits, experts, weights = _route_buffers(m, T)
    xq = m.mm.xq_buffers(T, D)  # the fold's last block writes h in int8 there
    router_fold(o.w, aq, attn, x, out, ex.fold, norm, logits,
                cfg.n_expert_used, cfg.expert_weights_norm, experts, weights,
                a.zeros("fold_counter", (2,), np.uint32), xq, s)
    _experts_decode(m, out, ex, norm, xq, experts, weights, next_input)


def _route_buffers(m, T: int, n_logits: int | None = None) -> tuple:
    """The decode router's logits (T, n_logits) (default E), experts (T, k) int32 and weights (T, k)."""
    a, k = m.arena, m.cfg.n_expert_used
    return (a.get("moe_logits", (T, n_logits or m.cfg.n_expert)), a.get("moe_experts", (T, k), np.int32),
            a.get("moe_weights", (T, k)))


def _experts_decode(m, x, ex: Experts, norm: tuple, xq, experts, weights, next_input=None) -> None:
    """x (T, D) += sum_j weights[t, j] down_e act[t * k + j], act = silu(gate_e h) * up_e h of
    the chosen experts e = experts[t, j]; h = RMSNorm(x) * wn in int8 in xq (dp4a), or None;
    next_input: the dp4a down's tail writes the next layer's int8 input (one rank, x final)."""
    cfg, s = m.cfg, m.ctx.nb_stream
    T, D = x.shape
    k, F = cfg.n_expert_used, cfg.n_ff_exp
    slots = experts.reshape(T * k)
    act = m.arena.get("moe_act", (T * k, F))
    if xq is not None:
        gemv_dp4a_experts(ex.gate_up, 2 * F, xq, act, slots, k, s, glu=gemv.SILU)
    else:
        _experts_glu_gemv(m, x, norm, ex, slots, k, act)
    # under tensor parallelism rank 0 adds its partial sum into x, the others write theirs there
    if ex.down_dp4a:
        assert next_input is None or m.tp is None
        down_dp4a.experts_down_sum_dp4a(ex.down, D, act, x, slots, weights, s, accumulate=m.reduce_leader,
                                        next_input=next_input)
    else:
        assert next_input is None, "the next layer's int8 input comes from the dp4a down's tail"
        experts_down_sum(ex.down, D, act, x, slots, weights, s, accumulate=m.reduce_leader)
    m.all_reduce(x)


def _experts_glu_gemv(m, x, norm: tuple, ex: Experts, slots, k: int, act) -> None:
    """act (S, F) = silu(gate_e h[s // k]) * up_e h[s // k] for e = slots[s] on float h =
    RMSNorm(x) * wn (norm = (wn, eps)), written by a norm kernel first."""
    s, F = m.ctx.nb_stream, m.cfg.n_ff_exp
    h = m.arena.get("h", x.shape)
    norm_fn.rms_norm(x, norm[0], h, norm[1], s)
    if ex.gate_up is not None:
        gemv_experts.gemv_experts(ex.gate_up, 2 * F, h, act, slots, k, s, glu=gemv.SILU)
        return
    up = m.arena.get("moe_up", act.shape)
    gemv_experts.gemv_experts(ex.gate, F, h, act, slots, k, s)
    gemv_experts.gemv_experts(ex.up, F, h, up, slots, k, s)
    activations.swiglu(act, up, act, s)
