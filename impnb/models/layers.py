"""The numpy reference's layer graph, following what each layer computes (LayerSpec, models/spec.py,
one per layer from each architecture's `layers`). gpu/forward.py follows the same specs.

Every layer is
    x += [post_attn_norm](mixer(attn_norm(x)))      mixer: attention, or gated_deltanet (deltanet.py)
    x += [post_ffn_norm](ffn(<spec.ffn_norm>(x)))    no ffn_norm: the FFN reads the residual
    x = step(x) for each of its `after` steps (AFTER)
then logits = output(output_norm(x)); weights by their GGUF names under blk.N.
"""

import numpy as np

from impnb.models import gemma4_ops
from impnb.models.config import ModelConfig
from impnb.models.spec import LayerSpec  # noqa: F401 (read here by callers of the layer graph)
from impnb.models.deltanet import gated_deltanet_block


def attention_block(ops, cfg: ModelConfig, il: int, h, pos: np.ndarray, cache):
    """Self-attention of normed h (T, D) -> (T, D): QKV, optional QK-norm, RoPE, GQA, output;
    with cfg.attn_output_gate, attn_q's [q, gate] a head and the output times sigmoid(gate)."""
    p = f"blk.{il}."
    T = h.shape[0]
    q = ops.linear(h, p + "attn_q").reshape(T, cfg.n_head, -1)
    q, gate = (q[..., :cfg.head_dim], q[..., cfg.head_dim:]) if cfg.attn_output_gate else (q, None)
    k = ops.linear(h, p + "attn_k").reshape(T, cfg.n_head_kv, cfg.head_dim)
    v = ops.linear(h, p + "attn_v").reshape(T, cfg.n_head_kv, cfg.head_dim_v)
    if cfg.qk_norm:
        q = ops.norm(q, p + "attn_q_norm")
        k = ops.norm(k, p + "attn_k_norm")
    q = ops.rope(q, pos, il)
    k = ops.rope(k, pos, il)
    out = ops.attention(q, k, v, pos, il, cache)
    if gate is not None:
        out = ops.sigmoid_gate(out, gate.reshape(T, -1))
    return ops.linear(out, p + "attn_output")


def gated_ffn(ops, il: int, h):
    """down(act(gate(h)) * up(h))."""
    p = f"blk.{il}."
    return ops.linear(ops.gated_act(ops.linear(h, p + "ffn_gate"), ops.linear(h, p + "ffn_up")),
                      p + "ffn_down")


def moe_ffn(ops, il: int, h):
    """The routed experts' gated FFN (ops.moe)."""
    return ops.moe(h, f"blk.{il}.")


def moe_shared_ffn(ops, il: int, h):
    """The routed experts plus a shared expert's gated FFN times sigmoid(ffn_gate_inp_shexp(h))."""
    p = f"blk.{il}."
    shared = ops.linear(ops.gated_act(ops.linear(h, p + "ffn_gate_shexp"), ops.linear(h, p + "ffn_up_shexp")),
                        p + "ffn_down_shexp")
    return ops.add(ops.moe(h, p), ops.sigmoid_gate(shared, ops.linear(h, p + "ffn_gate_inp_shexp")))


MIXERS = {"attention": attention_block, "gated_deltanet": gated_deltanet_block,
          "gemma4_attention": gemma4_ops.gemma4_attention}
FFNS = {"gated": gated_ffn, "moe": moe_ffn, "moe_shared": moe_shared_ffn, "mlp_and_moe": gemma4_ops.mlp_and_moe}
AFTER = {"per_layer_embedding": gemma4_ops.per_layer_embedding, "output_scale": gemma4_ops.output_scale}


def forward(ops, cfg: ModelConfig, layers: tuple, tokens: np.ndarray, cache):
    """The stack of `layers` (LayerSpec a layer) on tokens at positions cache.pos.. -> logits of
    every token."""
    pos = np.arange(cache.pos, cache.pos + len(tokens))
    x = ops.embed(tokens)
    for il, spec in enumerate(layers):
        p = f"blk.{il}."
        h = MIXERS[spec.mixer](ops, cfg, il, ops.norm(x, p + "attn_norm"), pos, cache)
        x = ops.add(x, ops.norm(h, p + spec.post_attn_norm) if spec.post_attn_norm else h)
        h = FFNS[spec.ffn](ops, il, ops.norm(x, p + spec.ffn_norm) if spec.ffn_norm else x)
        x = ops.add(x, ops.norm(h, p + spec.post_ffn_norm) if spec.post_ffn_norm else h)
        for step in spec.after:
            x = AFTER[step](ops, il, x)
    cache.pos += len(tokens)
    return ops.output(x)
