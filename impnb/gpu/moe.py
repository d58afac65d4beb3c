"""The routed-expert FFN of a qwen3moe layer on the GPU (reference: numpy_ops.moe).

  logits = h · ffn_gate_inpᵀ (fp32) -> top-k experts and weights per token (moe_route)
  decode (T <= GEMV_MAX_ROWS): one GEMV block row per slot over its expert's rows only
      act[s] = silu(gate_e h[t]) * up_e h[t];  y[s] = down_e act[s]          (s = t * k + j)
  prefill: slots grouped by expert (moe_group), then the grouped tensor-core GEMM per tile
      gate_up = [h rows] · gate_up_eᵀ -> act (fp16) -> y = act · down_eᵀ     (rows in expert order)
  out[t] = sum_j weight[t, j] * y[row of slot t * k + j]                     (moe_combine)
Everything stays on the device: no host synchronization, so a step remains one CUDA graph.
Legend: T tokens, D model dim, E experts, k used per token, F expert FFN dim, S = T * k slots.
"""

import numpy as np

from impnb.gpu.model import GEMV_MAX_ROWS
from impnb.kernels import activations, gemv
from impnb.kernels.cast import cast_f16
from impnb.kernels.gemm_grouped import BM, gemm_grouped
from impnb.kernels.moe import max_tiles, moe_combine, moe_group, moe_route


def moe_ffn(m, h, prefix: str, out) -> None:
    """out (T, D) float32 = the routed experts' SwiGLU FFN of h (T, D), weights m.w[prefix + ...]."""
    cfg, a, s = m.cfg, m.arena, m.ctx.nb_stream
    T, D = h.shape
    k, E, F = cfg.n_expert_used, cfg.n_expert, cfg.n_ff_exp
    S = T * k
    logits = a.get("moe_logits", (T, E))
    m.linear_f32(h, prefix + "ffn_gate_inp", logits)
    experts = a.get("moe_experts", (T, k), np.int32)
    weights = a.get("moe_weights", (T, k))
    moe_route(logits, k, cfg.expert_weights_norm, experts, weights, s)
    slots = experts.reshape(S)
    y = a.get("moe_y", (S, D))
    if T <= GEMV_MAX_ROWS:
        act = a.get("moe_act", (S, F))
        _experts_glu_gemv(m, h, prefix, slots, k, act)
        gemv.gemv_experts(m.w[prefix + "ffn_down_exps"], D, act, y, slots, 1, s)
        rows = m.slot_rows
    else:
        order = a.get("moe_order", (S,), np.int32)
        rows = a.get("moe_slot_row", (S,), np.int32)
        tiles = a.get("moe_tiles", (max_tiles(S, E, BM), 3), np.int32)
        n_tiles = a.get("moe_n_tiles", (1,), np.int32)
        moe_group(slots, E, BM, order, rows, tiles, n_tiles, s)
        grouped = (tiles, n_tiles, order)
        act = a.get("moe_act", (S, F))
        _experts_glu_gemm(m, m.x16(h), prefix, grouped, k, act)
        act16 = a.get("moe_act16", (S, F), np.float16)
        cast_f16(act, act16, s)
        gemm_grouped(act16, m.w[prefix + "ffn_down_exps"], D, y, *grouped, 0, s)
    moe_combine(y, rows, weights, out, s)


def _experts_glu_gemv(m, h, prefix: str, slots, k: int, act) -> None:
    """act (S, F) = silu(gate_e h[s // k]) * up_e h[s // k] for e = slots[s]."""
    s, F = m.ctx.nb_stream, m.cfg.n_ff_exp
    if prefix + "ffn_gate_up_exps" in m.w:
        gemv.gemv_experts(m.w[prefix + "ffn_gate_up_exps"], 2 * F, h, act, slots, k, s, glu=gemv.SILU)
        return
    up = m.arena.get("moe_up", act.shape)
    gemv.gemv_experts(m.w[prefix + "ffn_gate_exps"], F, h, act, slots, k, s)
    gemv.gemv_experts(m.w[prefix + "ffn_up_exps"], F, h, up, slots, k, s)
    activations.swiglu(act, up, act, s)


def _experts_glu_gemm(m, h16, prefix: str, grouped, k: int, act) -> None:
    """act (S, F) in expert order = silu(gate_e x) * up_e x over the gathered token rows."""
    s, F = m.ctx.nb_stream, m.cfg.n_ff_exp
    S = act.shape[0]
    if prefix + "ffn_gate_up_exps" in m.w:
        gate_up = m.arena.get("moe_gate_up", (S, 2 * F))
        gemm_grouped(h16, m.w[prefix + "ffn_gate_up_exps"], 2 * F, gate_up, *grouped, k, s)
        activations.swiglu_fused(gate_up, act, s)
        return
    up = m.arena.get("moe_up", act.shape)
    gemm_grouped(h16, m.w[prefix + "ffn_gate_exps"], F, act, *grouped, k, s)
    gemm_grouped(h16, m.w[prefix + "ffn_up_exps"], F, up, *grouped, k, s)
    activations.swiglu(act, up, act, s)
