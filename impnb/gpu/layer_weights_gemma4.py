"""A gemma4 layer's weights as gpu/forward_gemma4.py reads them (reference: models/gemma4_ops.py):
layer_weights' Attention and DenseFFN, the routed experts beside the MLP with their norms and
scales, the per-layer embedding's gate and projection, the layer output scale. 1-D weights are
float32 device arrays; None where the layer has no such part."""

from dataclasses import dataclass

import numpy as np

from impnb.gpu.layer_weights import Attention, DenseFFN, experts_down_dp4a
from impnb.gpu.weights import Linear
from impnb.kernels.common.repack import PackedWeight


@dataclass(frozen=True, eq=False)
class Gemma4Experts:
    """The routed experts: router input = RMSNorm(x) * router_norm (ffn_gate_inp.scale * D^-1/2,
    folded at load), the router, GELU experts with gate|up stacked per expert, each expert's
    output scale (ffn_down_exps.scale), and the norms around them."""

    router_norm: object
    router: Linear
    gate_up: PackedWeight
    down: PackedWeight
    scale: object  # (E,)
    pre_norm: object  # pre_ffw_norm_2: the experts' input norm of the residual
    post_norm: object  # post_ffw_norm_2 on their output
    post_norm_mlp: object  # post_ffw_norm_1 on the dense MLP's
    gate_up_dp4a: bool  # decode gate|up on gemv_dp4a_experts (its Linear's rule), x̂ = int8 RMSNorm(x) * pre_norm
    down_dp4a: bool  # decode down on dp4a with act made int8 in the kernel (layer_weights.experts_down_dp4a)


@dataclass(frozen=True, eq=False)
class PerLayerEmbedding:
    gate: Linear  # inp_gate (P, D)
    proj: Linear  # proj (D, P)
    post_norm: object


@dataclass(frozen=True, eq=False)
class Gemma4Layer:
    attn: Attention  # k, v None where the layer reads kv_layer's cache; v None where V is K
    kv_layer: int  # the layer whose cache pages it attends over (itself unless KV-shared)
    v_norm: object  # ones (Dh,): V's weightless RMSNorm through the norm kernel
    ffn: DenseFFN  # post_norm: post_ffw_norm on dense layers, post_ffw_norm_1 beside experts
    experts: Gemma4Experts | None
    post_ffn: object  # post_ffw_norm: on the FFN's whole output
    ple: PerLayerEmbedding | None
    output_scale: object | None  # (1,), applied by scale_rms_norm after the FFN and PLE
    end_scale: object  # (1,): the scale moe_layer_end applies (the output scale where no PLE
    # step follows and the layer has experts, else ones; output_scale is then None)
    next_norm: object  # the norm the next layer's attention (or the logits) reads


def gemma4_layers(cfg, w: dict, lin: dict, ctx, tuning) -> tuple[Gemma4Layer, ...]:
    """Every layer's weights by role (w: tensors, lin: Linears; ctx uploads the folded router norm
    and the V norm's ones)."""
    ones = {}
    one = ctx.upload(np.ones(1, np.float32))
    out = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        attn = Attention(
            norm=w[p + "attn_norm"], qkv=lin.get(p + "attn_qkv"), qk=lin.get(p + "attn_qk"),
            q=lin.get(p + "attn_q"), k=lin.get(p + "attn_k"), v=lin.get(p + "attn_v"), pair=False,
            q_norm=w[p + "attn_q_norm"], k_norm=w.get(p + "attn_k_norm"), o=lin[p + "attn_output"],
            post_norm=w[p + "post_attention_norm"])
        dk, _ = cfg.head_dims(il)
        if dk not in ones:
            ones[dk] = ctx.upload(np.ones(dk, np.float32))
        experts = None
        if cfg.n_expert:
            router_norm = w[p + "ffn_gate_inp.scale"].copy_to_host() * np.float32(cfg.n_embd ** -0.5)
            experts = Gemma4Experts(
                router_norm=ctx.upload(router_norm.astype(np.float32)), router=lin[p + "ffn_gate_inp"],
                gate_up=w[p + "ffn_gate_up_exps"], down=w[p + "ffn_down_exps"], scale=w[p + "ffn_down_exps.scale"],
                pre_norm=w[p + "pre_ffw_norm_2"], post_norm=w[p + "post_ffw_norm_2"],
                post_norm_mlp=w[p + "post_ffw_norm_1"], gate_up_dp4a=lin[p + "ffn_gate_up_exps"].dp4a,
                down_dp4a=experts_down_dp4a(cfg, w[p + "ffn_down_exps"], tuning))
        ffn = DenseFFN(norm=w[p + "ffn_norm"], gate_up=lin.get(p + "ffn_gate_up"), gate=lin.get(p + "ffn_gate"),
                       up=lin.get(p + "ffn_up"), down=lin[p + "ffn_down"],
                       post_norm=experts.post_norm_mlp if experts else w[p + "post_ffw_norm"])
        ple = None
        if cfg.n_embd_per_layer:
            ple = PerLayerEmbedding(lin[p + "inp_gate"], lin[p + "proj"], w[p + "post_norm"])
        nxt = w[f"blk.{il + 1}.attn_norm"] if il + 1 < cfg.n_layer else w["output_norm"]
        scale = w.get(p + "layer_output_scale")
        fold = experts is not None and ple is None and scale is not None  # the MoE end applies it
        out.append(Gemma4Layer(attn, cfg.kv_layer(il), ones[dk], ffn, experts, w[p + "post_ffw_norm"], ple,
                               None if fold else scale, scale if fold else one, nxt))
    return tuple(out)

