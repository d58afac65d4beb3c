"""The decoder stack on the GPU for llama, qwen3, qwen3moe and gemma3, with fused residual norms.

Per layer (T tokens, D model dim, H/Hkv heads, Dh head dim; activations float32):
  h = norm(x) -> q, k, v = linear(h) (one stacked GEMV)
  -> [QK-norm] -> RoPE(pos) -> paged fp16 KV write                          (one fused kernel)
  -> attention (decode: one block per head group at short contexts, else split-K over the cache;
                prefill: FA2 tensor-core tiles over the cache)
  -> o = linear(attn) -> x += [post-norm](o), h = ffn_norm(x)               (one fused kernel)
  -> act(linear_gate(h)) * linear_up(h)                  (one stacked GEMV, act fused at T <= 2)
     or, with experts (qwen3moe), the routed expert FFN of gpu/moe.py
  -> d = linear_down -> x += [post-norm](d), h = next norm(x)                (one fused kernel)
The layer graph mirrors impnb/models/{llama,qwen3,gemma3,qwen3moe}.py, which is its reference.
"""

import numpy as np

from impnb.gpu.moe import moe_ffn
from impnb.kernels import activations, attention_decode, attention_fa2, norm, qkv_post
from impnb.kernels.attention_decode_short import attention_decode_short
from impnb.kernels.embedding import embedding
from impnb.kernels.rows import gather_row
from impnb.models.config import ModelConfig


def forward(m, T: int, last_only: bool = True, last_row=None):
    """Run T tokens (ids in m.ids[:T], positions in m.pos[:T]) through model m -> logits buffer.

    Logits of every row, or of the last one; last_row (int32 (1,) on the device) picks that
    row at run time instead of T - 1 (padded chunks in a captured graph).

    m is a DeviceModel; every buffer comes from m.arena, so repeated calls with the same T
    launch the same kernels on the same memory (what a CUDA graph captures).
    """
    cfg: ModelConfig = m.cfg
    s = m.ctx.nb_stream
    a = m.arena
    D, H, Hkv, Dh, Dv = cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
    ids, pos = m.ids[:T], m.pos[:T]
    x = a.get("x", (T, D))
    h = a.get("h", (T, D))
    embedding(m.w["token_embd"], ids, x, cfg.embed_scale, s)
    norm.rms_norm(x, m.w["blk.0.attn_norm"], h, cfg.eps, s)
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        q = a.get("q", (T, H, Dh))
        k = a.get("k", (T, Hkv, Dh))
        v = a.get("v", (T, Hkv, Dv))
        qkv = (q.reshape(T, H * Dh), k.reshape(T, Hkv * Dh), v.reshape(T, Hkv * Dv))
        if p + "attn_qkv" in m.w:
            m.linear_split(h, p + "attn_qkv", qkv)
        else:
            for name, y in zip(("attn_q", "attn_k", "attn_v"), qkv):
                m.linear(h, p + name, y)
        qkv_post.qkv_post(q, k, v, pos, m.inv_freq[il], cfg.rope_neox,
                          m.w[p + "attn_q_norm"] if cfg.qk_norm else None,
                          m.w[p + "attn_k_norm"] if cfg.qk_norm else None, cfg.eps,
                          m.block_table, m.k_pool[il], m.v_pool[il], s)
        attn = a.get("attn", (T, H, Dv))
        _attention(m, il, q, pos, attn, T)
        o = a.get("o", (T, D))
        m.linear(attn.reshape(T, H * Dv), p + "attn_output", o)
        _residual(m, x, o, p + "post_attention_norm", p + "ffn_norm", h)
        if cfg.n_expert:
            moe_ffn(m, h, p, o)
        else:
            _dense_ffn(m, h, p, o)
        nxt = f"blk.{il + 1}.attn_norm" if il + 1 < cfg.n_layer else "output_norm"
        _residual(m, x, o, p + "post_ffw_norm", nxt, h)
    rows = h
    if last_row is not None:
        rows = a.get("h_last", (1, D))
        gather_row(h, last_row, rows, s)
    elif last_only:
        rows = h[T - 1:T]
    logits = a.get("logits", (rows.shape[0], cfg.n_vocab))
    m.linear(rows, "output" if "output" in m.w else "token_embd", logits)
    return logits


def _dense_ffn(m, h, p: str, o):
    """o (T, D) = down(act(gate(h)) * up(h)); gate|up as one GEMV where stacked."""
    cfg, a, T = m.cfg, m.arena, h.shape[0]
    gate = a.get("gate", (T, cfg.n_ff))
    if p + "ffn_gate_up" in m.w:
        m.linear_glu(h, p + "ffn_gate_up", cfg.act, gate)
    else:
        up = a.get("up", (T, cfg.n_ff))
        m.linear(h, p + "ffn_gate", gate)
        m.linear(h, p + "ffn_up", up)
        (activations.geglu if cfg.act == "gelu" else activations.swiglu)(gate, up, gate, m.ctx.nb_stream)
    m.linear(gate, p + "ffn_down", o)


def _residual(m, x, o, post_norm: str, next_norm: str, h):
    """x += o (Gemma: x += post_norm(o)), then h = next_norm(x); one kernel."""
    if m.cfg.post_norms:
        norm.rms_norm_post_add(x, o, m.w[post_norm], m.w[next_norm], h, m.cfg.eps, m.ctx.nb_stream)
    else:
        norm.rms_norm_add(x, o, m.w[next_norm], h, m.cfg.eps, m.ctx.nb_stream)


def _attention(m, il: int, q, pos, out, T: int):
    cfg, s = m.cfg, m.ctx.nb_stream
    window = cfg.window(il)
    if T <= attention_decode.MAX_T and m.decode_short:
        attention_decode_short(q, m.k_pool[il], m.v_pool[il], m.block_table, pos, out,
                               cfg.attn_scale, window, None, s)
    elif T <= attention_decode.MAX_T and m.decode_splits:
        partials = m.arena.get("partials", attention_decode.partials_shape(
            1, m.max_decode_splits, T, cfg.n_head, cfg.head_dim_v))
        counters = m.arena.zeros("counters", attention_decode.counters_shape(1, T, cfg.n_head), np.int32)
        attention_decode.attention_decode(q, m.k_pool[il], m.v_pool[il], m.block_table, pos, out,
                                          partials, counters, m.decode_splits, cfg.attn_scale, window,
                                          None, s)
    else:
        attention_fa2.attention_fa2(q, m.k_pool[il], m.v_pool[il], m.block_table, pos, out,
                                    cfg.attn_scale, window, None, s)
