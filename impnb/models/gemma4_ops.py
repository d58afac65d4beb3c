"""Gemma 4's numpy pieces: its attention, routed experts beside the dense MLP, per-layer
embeddings and layer output scale (registered in layers.MIXERS / FFNS / AFTER), and the ops they
call beyond NumpyOps'. Weights by their GGUF names (gguf-py's MODEL_ARCH.GEMMA4)."""

import numpy as np

from impnb.kernels.attention.reference import rope_ref
from impnb.kernels.elementwise.reference import gelu_tanh, rms_norm_ref
from impnb.kernels.moe.reference import route_ref
from impnb.models.numpy_ops import NumpyOps


class Gemma4Ops(NumpyOps):
    """NumpyOps with per-layer RoPE, the weightless norm, Gemma 4's router and experts, the
    per-layer embedding inputs (computed with the token embedding) and logit softcapping."""

    def __init__(self, mf, cfg):
        super().__init__(mf, cfg)
        self.per_layer = None  # (T, n_layer, P) PLE inputs of the tokens being run

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Scaled token embedding; with PLE also each layer's input, from the token's own
        per-layer embedding and a projection of its main one."""
        x = super().embed(tokens)
        cfg = self.cfg
        if cfg.n_embd_per_layer:
            T, L, P = len(tokens), cfg.n_layer, cfg.n_embd_per_layer
            own = self.w["per_layer_token_embd"][tokens].reshape(T, L, P) * np.float32(np.sqrt(P))
            proj = self.linear(x, "per_layer_model_proj").reshape(T, L, P) * np.float32(cfg.n_embd ** -0.5)
            proj = self.norm(proj, "per_layer_proj_norm")
            self.per_layer = (proj + own) * np.float32(2.0 ** -0.5)
        return x

    def unit_norm(self, x: np.ndarray) -> np.ndarray:
        """RMS norm without a weight (V, and the router's input)."""
        return rms_norm_ref(x, np.float32(1.0), self.cfg.eps)

    def rope(self, x: np.ndarray, pos: np.ndarray, il: int) -> np.ndarray:
        """Sliding layers: plain NeoX RoPE of their own width and base. Global layers: the
        `rope_freqs` factors keep the dims past the rotated fraction still (proportional RoPE)."""
        cfg = self.cfg
        factors = None if cfg.is_swa(il) else self.w.get("rope_freqs")
        return rope_ref(x, pos, cfg.rope_base_for(il), True, cfg.n_rot_for(il), factors)

    def routed_experts(self, x: np.ndarray, prefix: str) -> np.ndarray:
        """The residual x (T, D) through the top-k GELU experts (fused gate|up rows) -> (T, D).

        Router: softmax over ffn_gate_inp(unit_norm(x) * scale / sqrt(D)), top k renormalised to
        sum 1, each times its expert's ffn_down_exps.scale; the experts read pre_ffw_norm_2(x)."""
        cfg = self.cfg
        r = self.unit_norm(x) * self.w[prefix + "ffn_gate_inp.scale"] * np.float32(cfg.n_embd ** -0.5)
        experts, weights = route_ref(self.linear(r, prefix + "ffn_gate_inp"), cfg.n_expert_used, True)
        weights = weights * self.w[prefix + "ffn_down_exps.scale"][experts]
        h = self.norm(x, prefix + "pre_ffw_norm_2")
        gate_up, down = self.w[prefix + "ffn_gate_up_exps"], self.w[prefix + "ffn_down_exps"]
        F = gate_up.shape[1] // 2
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            for e, wt in zip(experts[t], weights[t]):
                gu = self.expert(gate_up[e], h[t])
                out[t] += wt * self.expert(down[e], self.gated_act(gu[:F], gu[F:]))
        return out

    def per_layer_embedding(self, il: int, x: np.ndarray) -> np.ndarray:
        """x + post_norm(proj(gelu(inp_gate(x)) * layer il's PLE input))."""
        p = f"blk.{il}."
        g = gelu_tanh(self.linear(x, p + "inp_gate")) * self.per_layer[:, il]
        return self.add(x, self.norm(self.linear(g, p + "proj"), p + "post_norm"))

    def output_scale(self, il: int, x: np.ndarray) -> np.ndarray:
        """The residual times layer il's layer_output_scale, where the file has one."""
        scale = self.w.get(f"blk.{il}.layer_output_scale")
        return x if scale is None else x * scale.reshape(())

    def output(self, x: np.ndarray) -> np.ndarray:
        logits = super().output(x)
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else (np.float32(cap) * np.tanh(logits / np.float32(cap))).astype(np.float32)


def gemma4_attention(ops, cfg, il: int, h, pos: np.ndarray, cache):
    """Normed h (T, D) -> (T, D): Q, K (V = K where attn_v is absent) with Q/K norms and a
    weightless V norm, RoPE of the layer's kind, scale 1; a KV-shared layer reads its source's
    cache and computes no K/V."""
    p = f"blk.{il}."
    T = h.shape[0]
    hd, _ = cfg.head_dims(il)
    q = ops.norm(ops.linear(h, p + "attn_q").reshape(T, cfg.n_head, hd), p + "attn_q_norm")
    q = ops.rope(q, pos, il)
    if cfg.kv_layer(il) != il:
        out = ops.attend(q, *cache.stored(il, int(pos[-1]) + 1), pos, il)
        return ops.linear(out, p + "attn_output")
    hkv = cfg.kv_heads(il)
    k = ops.linear(h, p + "attn_k").reshape(T, hkv, hd)
    v = ops.linear(h, p + "attn_v").reshape(T, hkv, hd) if p + "attn_v" in ops.w else k
    k = ops.rope(ops.norm(k, p + "attn_k_norm"), pos, il)
    return ops.linear(ops.attention(q, k, ops.unit_norm(v), pos, il, cache), p + "attn_output")


def mlp_and_moe(ops, il: int, x):
    """The residual x (T, D) -> post_ffw_norm_1(dense GeGLU MLP(ffn_norm(x))) +
    post_ffw_norm_2(routed experts(x)); the layer's post_ffw_norm follows."""
    p = f"blk.{il}."
    h = ops.norm(x, p + "ffn_norm")
    mlp = ops.linear(ops.gated_act(ops.linear(h, p + "ffn_gate"), ops.linear(h, p + "ffn_up")), p + "ffn_down")
    return ops.norm(mlp, p + "post_ffw_norm_1") + ops.norm(ops.routed_experts(x, p), p + "post_ffw_norm_2")


def per_layer_embedding(ops, il: int, x):
    return ops.per_layer_embedding(il, x)


def output_scale(ops, il: int, x):
    return ops.output_scale(il, x)
