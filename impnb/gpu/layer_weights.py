"""A layer's weights as the GPU stack reads them: Linears and norms by role, grouped once at load
from gpu/weights.py's GGUF-named tensors, with the choices that involve more than one weight made
there (Q|K and V in one launch, the routed experts' kernels, the router fold). 1-D norm weights
(and the DeltaNet conv's) are float32 device arrays; None where the layer has no such weight."""

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
    q_gate: Linear | None = None  # gated attention (Qwen3.5): the output is times sigmoid(x · q_gateᵀ)


@dataclass(frozen=True, eq=False)
class DeltaNet:
    """A Gated DeltaNet mixer: Q|K|V and Z stacked (qkvz) or apart (qkv, z), beta and alpha stacked
    (beta_alpha) or apart; the conv's weight (C, K), A (ssm_a), the dt bias, the gated norm's
    weight (dv,), all float32; ssm_out (o)."""

    norm: object  # attn_norm
    qkvz: Linear | None
    qkv: Linear | None
    z: Linear | None
    beta_alpha: Linear | None
    beta: Linear | None
    alpha: Linear | None
    conv_w: object
    ssm_a: object
    dt_bias: object
    ssm_norm: object
    o: Linear
    post_norm: object | None = None


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
    shared: DenseFFN | None = None  # moe_shared: the shared expert, its output times
    shared_gate: Linear | None = None  # sigmoid(h · shared_gateᵀ) (ffn_gate_inp_shexp, one row)
    # moe_shared: router's rows then shared_gate's (ffn_gate_inps; router and shared_gate are views
    # of its rows), the decode router's weight; None where not stacked (weights.gate_inps)
    gate_inps: Linear | None = None


@dataclass(frozen=True, eq=False)
class LayerWeights:
    attn: Attention | DeltaNet
    ffn: DenseFFN | Experts
    next_norm: object  # the norm the next layer's attention (or the logits) reads


def layer_weights(cfg: ModelConfig, specs: tuple[LayerSpec, ...], w: dict, lin: dict, folds: dict,
                  tuning: Overrides) -> tuple[LayerWeights, ...]:
    """Every layer's weights by role (w: tensors, lin: Linears, folds: router folds by prefix)."""
    out = []
    for il, spec in enumerate(specs):
        p = f"blk.{il}."
        mixer = deltanet(w, lin, p) if spec.mixer == "gated_deltanet" else attention(cfg, spec, w, lin, p, tuning)
        post_ffn = w[p + spec.post_ffn_norm] if spec.post_ffn_norm else None
        ffn_norm = w[p + spec.ffn_norm]
        if spec.ffn in ("moe", "moe_shared"):
            gate_up, down = lin.get(p + "ffn_gate_up_exps"), w[p + "ffn_down_exps"]
            shared = spec.ffn == "moe_shared"
            ffn = Experts(
                norm=ffn_norm, router=lin[p + "ffn_gate_inp"], gate_up=gate_up and gate_up.w,
                gate=w.get(p + "ffn_gate_exps"), up=w.get(p + "ffn_up_exps"), down=down,
                gate_up_dp4a=bool(gate_up and gate_up.dp4a),
                down_dp4a=experts_down_dp4a(cfg, down, tuning),
                fold=folds.get(p), post_norm=post_ffn,
                shared=dense_ffn(lin, p, ffn_norm, None, "_shexp") if shared else None,
                shared_gate=lin[p + "ffn_gate_inp_shexp"] if shared else None,
                gate_inps=lin.get(p + "ffn_gate_inps") if shared else None)
        else:
            ffn = dense_ffn(lin, p, ffn_norm, post_ffn)
        nxt = w[f"blk.{il + 1}.attn_norm"] if il + 1 < cfg.n_layer else w["output_norm"]
        out.append(LayerWeights(mixer, ffn, nxt))
    return tuple(out)


def attention(cfg: ModelConfig, spec: LayerSpec, w: dict, lin: dict, p: str, tuning: Overrides) -> Attention:
    """The attention weights of the layer with prefix p."""
    qk, v = lin.get(p + "attn_qk"), lin.get(p + "attn_v")
    return Attention(
        norm=w[p + "attn_norm"], qkv=lin.get(p + "attn_qkv"), qk=qk, q=lin.get(p + "attn_q"),
        k=lin.get(p + "attn_k"), v=v, pair=bool(qk and tuning.gemv_pair and not (qk.dp4a or v.dp4a)),
        q_norm=w[p + "attn_q_norm"] if cfg.qk_norm else None,
        k_norm=w[p + "attn_k_norm"] if cfg.qk_norm else None,
        o=lin[p + "attn_output"],
        post_norm=w[p + spec.post_attn_norm] if spec.post_attn_norm else None,
        q_gate=lin.get(p + "attn_q_gate"))


def deltanet(w: dict, lin: dict, p: str) -> DeltaNet:
    """The Gated DeltaNet weights of the layer with prefix p."""
    return DeltaNet(
        norm=w[p + "attn_norm"], qkvz=lin.get(p + "ssm_qkvz"), qkv=lin.get(p + "attn_qkv"),
        z=lin.get(p + "attn_gate"), beta_alpha=lin.get(p + "ssm_beta_alpha"), beta=lin.get(p + "ssm_beta"),
        alpha=lin.get(p + "ssm_alpha"), conv_w=w[p + "ssm_conv1d"], ssm_a=w[p + "ssm_a"],
        dt_bias=w[p + "ssm_dt.bias"], ssm_norm=w[p + "ssm_norm"], o=lin[p + "ssm_out"])


def dense_ffn(lin: dict, p: str, norm, post_norm, suffix: str = "") -> DenseFFN:
    """down(act(gate x) * up x) of the layer with prefix p (suffix "_shexp": its shared expert)."""
    return DenseFFN(norm=norm, gate_up=lin.get(p + "ffn_gate_up" + suffix), gate=lin.get(p + "ffn_gate" + suffix),
                    up=lin.get(p + "ffn_up" + suffix), down=lin[p + "ffn_down" + suffix], post_norm=post_norm)


def experts_down_dp4a(cfg: ModelConfig, down: PackedWeight, tuning: Overrides) -> bool:
    """Whether the routed experts' down runs on dp4a at decode, act made int8 in the kernel
    (MOE_DOWN_DP4A; a type with a dp4a dot, and the kernel's rows a block within the model dim)."""
    return tuning.moe_down_dp4a and down.ggml_type in gemv_dp4a_units.DOTS and cfg.n_embd >= gemv_moe_dp4a.ROWS
