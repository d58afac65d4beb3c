"""A layer's weights as the GPU stack reads them: Linears and norms by role, grouped once at load
from gpu/weights.py's GGUF-named tensors, with the choices that involve more than one weight made
there (Q|K and V in one launch, the routed experts' kernels, the router fold). 1-D norm weights
are float32 device arrays; None where the layer has no such weight."""

from dataclasses import dataclass

from impnb.gpu.weights import Linear
from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemv import gemv_dp4a_units
from impnb.kernels.moe import gemv_moe_dp4a
from impnb.kernels.moe.router_fold import Fold
from impnb.models.config import ModelConfig
from impnb.models.spec import LayerSpec
from impnb.tuning import Overrides


@dataclass(frozen=True, eq=False)
class Attention:
    """Q, K, V as one stacked Linear (qkv), as Q|K with V apart (qk, v: V of a type neither holds),
    or three; QK-norm weights; attn_output (o); the norms around the block."""

    norm: object  # attn_norm
    qkv: Linear | None
    qk: Linear | None
    q: Linear | None
    k: Linear | None
    v: Linear | None
    pair: bool  # qk and v at decode in one GEMV launch of two types (GEMV_PAIR; neither on dp4a)
    q_norm: object | None
    k_norm: object | None
    o: Linear
    post_norm: object | None  # LayerSpec.post_attn_norm's weight


@dataclass(frozen=True, eq=False)
class DenseFFN:
    """down(act(gate x) * up x): gate|up stacked (gate_up) or apart."""

    norm: object  # ffn_norm
    gate_up: Linear | None
    gate: Linear | None
    up: Linear | None
    down: Linear
    post_norm: object | None  # LayerSpec.post_ffn_norm's weight


@dataclass(frozen=True, eq=False)
class Experts:
    """The routed experts: the router (F32 or quantized Linear), the experts' matrices stacked per
    expert (gate|up stacked, or gate and up apart), and their decode kernels."""

    norm: object  # ffn_norm
    router: Linear
    gate_up: PackedWeight | None
    gate: PackedWeight | None
    up: PackedWeight | None
    down: PackedWeight
    gate_up_dp4a: bool  # decode gate|up on gemv_dp4a, on the int8 h the router (or fold) writes
    down_dp4a: bool  # decode down on dp4a with act made int8 in the kernel (MOE_DOWN_DP4A)
    fold: Fold | None  # the router folded into attn_output's launch (ROUTER_FOLD), or None
    post_norm: object | None


@dataclass(frozen=True, eq=False)
class LayerWeights:
    attn: Attention
    ffn: DenseFFN | Experts
    next_norm: object  # the norm the next layer's attention (or the logits) reads


def layer_weights(cfg: ModelConfig, specs: tuple[LayerSpec, ...], w: dict, lin: dict, folds: dict,
                  tuning: Overrides) -> tuple[LayerWeights, ...]:
    """Every layer's weights by role (w: tensors, lin: Linears, folds: router folds by prefix)."""
    out = []
    for il, spec in enumerate(specs):
        p = f"blk.{il}."
        qk, v = lin.get(p + "attn_qk"), lin.get(p + "attn_v")
        attn = Attention(
            norm=w[p + "attn_norm"], qkv=lin.get(p + "attn_qkv"), qk=qk, q=lin.get(p + "attn_q"),
            k=lin.get(p + "attn_k"), v=v, pair=bool(qk and tuning.gemv_pair and not (qk.dp4a or v.dp4a)),
            q_norm=w[p + "attn_q_norm"] if cfg.qk_norm else None,
            k_norm=w[p + "attn_k_norm"] if cfg.qk_norm else None,
            o=lin[p + "attn_output"],
            post_norm=w[p + spec.post_attn_norm] if spec.post_attn_norm else None)
        post_ffn = w[p + spec.post_ffn_norm] if spec.post_ffn_norm else None
        if spec.ffn == "moe":
            gate_up, down = lin.get(p + "ffn_gate_up_exps"), w[p + "ffn_down_exps"]
            ffn = Experts(
                norm=w[p + "ffn_norm"], router=lin[p + "ffn_gate_inp"], gate_up=gate_up and gate_up.w,
                gate=w.get(p + "ffn_gate_exps"), up=w.get(p + "ffn_up_exps"), down=down,
                gate_up_dp4a=bool(gate_up and gate_up.dp4a),
                down_dp4a=(tuning.moe_down_dp4a and down.ggml_type in gemv_dp4a_units.DOTS
                           and cfg.n_embd >= gemv_moe_dp4a.ROWS),
                fold=folds.get(p), post_norm=post_ffn)
        else:
            ffn = DenseFFN(norm=w[p + "ffn_norm"], gate_up=lin.get(p + "ffn_gate_up"), gate=lin.get(p + "ffn_gate"),
                           up=lin.get(p + "ffn_up"), down=lin[p + "ffn_down"], post_norm=post_ffn)
        nxt = w[f"blk.{il + 1}.attn_norm"] if il + 1 < cfg.n_layer else w["output_norm"]
        out.append(LayerWeights(attn, ffn, nxt))
    return tuple(out)
