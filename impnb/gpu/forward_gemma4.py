"""gemma4's layer loop on the GPU (reference: models/gemma4_ops.py through models/layers.forward),
from gpu/forward.py's pieces and a few elementwise kernels of its own.

  x = token_embd[ids] * sqrt(D); with PLE the layers' inputs ple (L, T, P) (per_layer_inputs)
  per layer (h = attn_norm(x) on entry):
    q = linear(h), q_norm, RoPE of the layer's kind (global: `rope_freqs` factors in inv_freq)
    own K/V: k = linear(h), v = linear(h) or k (K = V); v = RMSNorm(v) (weightless, the norm
      kernel on ones) then qkv_post: k_norm, RoPE, the fp16 cache write; KV-shared layers attend
      over kv_layer's pools (PagedKV holds them for both) and write nothing
    attention (scale 1, the layer's window) -> o = attn_output -> x += post_attention_norm(o),
      h = ffn_norm(x)                                           (the GEMV's tail at decode)
    dense MLP: x += post_ffw_norm(down(gelu(gate h) * up h))    (experts: see _mlp_and_moe; at
      decode the router's GEMV norms its input and routes in its last block, gemv_route, and
      the experts run on dp4a where their types have it: x̂ = int8 pre_ffw_norm_2(x) by
      quantize_x, gemv_dp4a_experts, experts_down_sum_dp4a)
    PLE: x += post_norm(proj(gelu(inp_gate x) * ple[l]))
    x *= layer_output_scale, h = next norm(x)                   (scale_rms_norm; in layers with
      experts and no PLE the end of _mlp_and_moe, moe_layer_end)
  logits = output(h), then cap * tanh(logits / cap)
Legend: T rows, D model dim, H heads, Hkv / Dh the layer's KV heads and head dim, L layers,
P per-layer width, E experts, k used, F expert width. Prompt chunks and single sequences only
(the batched runner takes gemma4 one sequence at a time).
"""

import numpy as np

from impnb.gpu.forward import attend, dense_ffn, logits_of, residual_update
from impnb.gpu.layer_weights_gemma4 import Gemma4Layer
from impnb.gpu.moe_prefill import experts_prefill
from impnb.gpu.plan import StepPlan
from impnb.kernels.attention import qkv_post
from impnb.kernels.attention.kv_cache import kv_write
from impnb.kernels.attention.rope import rope
from impnb.kernels.elementwise import activations, norm
from impnb.kernels.elementwise.embedding import embedding
from impnb.kernels.elementwise.moe_layer_end import moe_layer_end
from impnb.kernels.elementwise.per_layer_inputs import per_layer_inputs
from impnb.kernels.elementwise.scale_norm import scale_rms_norm
from impnb.kernels.elementwise.softcap import softcap
from impnb.kernels.gemv import gemv, gemv_experts, gemv_route
from impnb.kernels.moe.expert_scale import expert_scale
from impnb.kernels.gemv.gemv_dp4a_experts import gemv_dp4a_experts
from impnb.kernels.moe.gemv_moe import experts_down_sum
from impnb.kernels.moe.gemv_moe_dp4a import experts_down_sum_dp4a
from impnb.kernels.moe.moe import moe_combine, moe_route
from impnb.tuning import GEMV_MAX_ROWS

MIXER = "gemma4_attention"  # the LayerSpec.mixer whose models this loop runs


def forward(m, step: StepPlan, last_only: bool = True, last_row=None):
    """gpu/forward.forward's contract, for a gemma4 DeviceModel (m.blk: Gemma4Layer a layer)."""
    cfg, a, s = m.cfg, m.arena, m.ctx.nb_stream
    D, T, eps = cfg.n_embd, step.rows, cfg.eps
    assert step.batch == 1, "gemma4: one sequence a step"
    ids, pos = m.ids[:T], m.pos[:T]
    x = a.get("x", (T, D))
    h = a.get("h", (T, D))
    o = a.get("o", (T, D))
    embedding(m.w["token_embd"], ids, x, cfg.embed_scale, s)
    ple = _per_layer_inputs(m, x, ids) if cfg.n_embd_per_layer else None
    norm.rms_norm(x, m.blk[0].attn.norm, h, eps, s)
    for il, lw in enumerate(m.blk):
        attn = _attention(m, il, lw, h, pos, step)
        m.mm.linear(attn, lw.attn.o, o, residual=residual_update(m, x, h, lw.attn.post_norm, lw.ffn.norm))
        if lw.experts is None:
            dense_ffn(m, h, lw.ffn, o, residual=residual_update(m, x, h, lw.post_ffn, lw.next_norm))
        else:
            _mlp_and_moe(m, x, h, lw, o)
        if ple is not None:
            g = a.get("ple_gate", (T, cfg.n_embd_per_layer))
            m.mm.linear(x, lw.ple.gate, g)
            activations.geglu(g, ple[il], g, s)
            m.mm.linear(g, lw.ple.proj, o, residual=residual_update(m, x, h, lw.ple.post_norm, lw.next_norm))
        if lw.output_scale is not None:
            scale_rms_norm(x, lw.output_scale, lw.next_norm, h, eps, s)
    logits = logits_of(m, h, step, last_only, last_row, None)
    if cfg.final_logit_softcap:
        softcap(logits, cfg.final_logit_softcap, s)
    return logits


def _per_layer_inputs(m, x, ids):
    """ple (L, T, P): each layer's PLE input of the step's tokens."""
    cfg, a, s = m.cfg, m.arena, m.ctx.nb_stream
    T, L, P = x.shape[0], cfg.n_layer, cfg.n_embd_per_layer
    own = a.get("ple_own", (T, L * P))
    embedding(m.w["per_layer_token_embd"], ids, own, float(np.sqrt(P)), s)
    proj = a.get("ple_proj", (T, L * P))
    m.mm.linear(x, m.lin["per_layer_model_proj"], proj)
    ple = a.get("ple", (L, T, P))
    per_layer_inputs(proj, own, m.w["per_layer_proj_norm"], ple, cfg.n_embd ** -0.5, cfg.eps, s)
    return ple


def _attention(m, il: int, lw: Gemma4Layer, h, pos, step: StepPlan):
    """Q (and the layer's own K, V into the cache) of h, attention -> (T, H * Dh)."""
    cfg, a, s, att = m.cfg, m.arena, m.ctx.nb_stream, lw.attn
    T, H, Hkv = step.rows, cfg.n_head, cfg.kv_heads(il)
    Dh, _ = cfg.head_dims(il)
    q = a.get("q", (T, H, Dh))
    q2 = q.reshape(T, H * Dh)
    if lw.kv_layer != il:  # reads kv_layer's cache: Q alone, normed and rotated
        m.mm.linear(h, att.q, q2)
        norm.rms_norm(q, att.q_norm, q, cfg.eps, s)
        rope(q, a.get("k_unused", (T, 1, Dh)), pos, m.inv_freq[il], True, s)
    else:
        k = a.get("k", (T, Hkv, Dh))
        k2 = k.reshape(T, Hkv * Dh)
        v = a.get("v", (T, Hkv, Dh))
        if att.qkv is not None:  # outputs in one buffer: one plain GEMV at a token (MatMul.split)
            (q2, k2, v2), joint = m.mm.stacked_outputs("qkv_out", T, (H * Dh, Hkv * Dh, Hkv * Dh))
            q, k, v = q2.reshape(T, H, Dh), k2.reshape(T, Hkv, Dh), v2.reshape(T, Hkv, Dh)
            m.mm.split(h, att.qkv, (q2, k2, v2), joint=joint)
        elif att.qk is not None:
            (q2, k2), joint = m.mm.stacked_outputs("qk_out", T, (H * Dh, Hkv * Dh))
            q, k = q2.reshape(T, H, Dh), k2.reshape(T, Hkv, Dh)
            m.mm.split(h, att.qk, (q2, k2), joint=joint)
        else:
            m.mm.linear(h, att.q, q2)
            m.mm.linear(h, att.k, k2)
        if att.qkv is None and att.v is not None:
            m.mm.linear(h, att.v, v.reshape(T, Hkv * Dh))
        v_in = v if att.v is not None or att.qkv is not None else k  # K = V: V is K before its norm
        norm.rms_norm(v_in, lw.v_norm, v, cfg.eps, s)
        if Dh <= qkv_post.MAX_D:
            qkv_post.qkv_post(q, k, v, pos, m.inv_freq[il], True, att.q_norm, att.k_norm, cfg.eps,
                              m.kv.tables_of(il)[:1], m.kv.k[il], m.kv.v[il], s)
        else:  # heads past qkv_post's: its steps one kernel each
            norm.rms_norm(q, att.q_norm, q, cfg.eps, s)
            norm.rms_norm(k, att.k_norm, k, cfg.eps, s)
            rope(q, k, pos, m.inv_freq[il], True, s)
            kv_write(k, v, pos, m.kv.block_table_of(il), m.kv.k[il], m.kv.v[il], s)
    out = a.get("attn", (T, H, Dh))
    attend(m, il, q, pos, out, step)
    return out.reshape(T, H * Dh)


def _mlp_and_moe(m, x, h, lw: Gemma4Layer, o) -> None:
    """x = (x + post_ffw_norm(post_ffw_norm_1(MLP(h)) + post_ffw_norm_2(experts(x)))) * end_scale,
    h = next norm(x) (moe_layer_end); o (T, D) is scratch. Router: softmax top-k of
    router(RMSNorm(x) * router_norm), renormalised, times the experts' scales; the experts read
    pre_ffw_norm_2(x)."""
    cfg, a, s, ex = m.cfg, m.arena, m.ctx.nb_stream, lw.experts
    T, D = x.shape
    k, E, F = cfg.n_expert_used, cfg.n_expert, cfg.n_ff_exp
    dense_ffn(m, h, lw.ffn, o)
    r = a.get("moe_in", (T, D))
    logits = a.get("moe_logits", (T, E))
    experts = a.get("moe_experts", (T, k), np.int32)
    weights = a.get("moe_weights", (T, k))
    if T <= GEMV_MAX_ROWS:  # the router's GEMV reads RMSNorm(x) * router_norm and routes in its last block
        gemv_route.gemv_route(ex.router.w, x, logits, k, True, experts, weights,
                              a.zeros("route_counter", (1,), np.uint32), s, norm=(ex.router_norm, cfg.eps))
    else:
        norm.rms_norm(x, ex.router_norm, r, cfg.eps, s)
        m.mm.linear_f32(r, ex.router, logits)
        moe_route(logits, k, True, experts, weights, s)
    expert_scale(experts, weights, ex.scale, s)
    slots = experts.reshape(T * k)
    y2 = a.get("moe_out", (T, D))
    if T <= GEMV_MAX_ROWS:
        act = a.get("moe_act", (T * k, F))
        if ex.gate_up_dp4a:  # the experts' int8 input straight from x (the norm in quantize_x)
            xq = m.mm.quantized(x, (ex.pre_norm, cfg.eps))
            gemv_dp4a_experts(ex.gate_up, 2 * F, xq, act, slots, k, s, glu=gemv.GELU)
        else:
            norm.rms_norm(x, ex.pre_norm, r, cfg.eps, s)
            gemv_experts.gemv_experts(ex.gate_up, 2 * F, r, act, slots, k, s, glu=gemv.GELU)
        if ex.down_dp4a:
            experts_down_sum_dp4a(ex.down, D, act, y2, slots, weights, s)
        else:
            experts_down_sum(ex.down, D, act, y2, slots, weights, s)
    else:
        norm.rms_norm(x, ex.pre_norm, r, cfg.eps, s)
        _, y, rows = experts_prefill(m, m.mm.x16(r), (ex.gate_up,), ex.down, slots, k, E, act="gelu")
        moe_combine(y, rows, weights, y2, s)
    moe_layer_end(x, o, y2, ex.post_norm_mlp, ex.post_norm, lw.post_ffn, lw.end_scale, lw.next_norm, h, cfg.eps, s)
