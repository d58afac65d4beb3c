"""Layer pieces shared by the architectures, written against an ops backend."""

import numpy as np

from impnb.models.config import ModelConfig


def attention_block(ops, cfg: ModelConfig, il: int, h, pos: np.ndarray, cache):
    """Self-attention of normed h (T, D) -> (T, D): QKV, optional QK-norm, RoPE, GQA, output."""
    p = f"blk.{il}."
    T = h.shape[0]
    q = ops.linear(h, p + "attn_q").reshape(T, cfg.n_head, cfg.head_dim)
    k = ops.linear(h, p + "attn_k").reshape(T, cfg.n_head_kv, cfg.head_dim)
    v = ops.linear(h, p + "attn_v").reshape(T, cfg.n_head_kv, cfg.head_dim_v)
    if cfg.qk_norm:
        q = ops.norm(q, p + "attn_q_norm")
        k = ops.norm(k, p + "attn_k_norm")
    q = ops.rope(q, pos, il)
    k = ops.rope(k, pos, il)
    return ops.linear(ops.attention(q, k, v, pos, il, cache), p + "attn_output")


def gated_ffn(ops, il: int, h):
    """down(act(gate(h)) * up(h))."""
    p = f"blk.{il}."
    return ops.linear(ops.gated_act(ops.linear(h, p + "ffn_gate"), ops.linear(h, p + "ffn_up")),
                      p + "ffn_down")


def pre_norm_forward(ops, cfg: ModelConfig, tokens: np.ndarray, cache, ffn):
    """The llama-style stack: x += attn(norm(x)); x += ffn(norm(x)); logits of every token."""
    pos = np.arange(cache.pos, cache.pos + len(tokens))
    x = ops.embed(tokens)
    for il in range(cfg.n_layer):
        x = ops.add(x, attention_block(ops, cfg, il, ops.norm(x, f"blk.{il}.attn_norm"), pos, cache))
        x = ops.add(x, ffn(ops, il, ops.norm(x, f"blk.{il}.ffn_norm")))
    cache.pos += len(tokens)
    return ops.output(x)
