"""qwen35 (Qwen3.5 dense): Gated DeltaNet layers with gated attention every full_attention_interval-th
layer, per-head QK-norm, NeoX RoPE on a part of each head (the text positions of Qwen3.5's
interleaved M-RoPE), gated FFNs. llama.cpp's converter reorders the V heads tiled over the QK heads."""

from impnb.errors import GGUFError
from impnb.gguf_file import ModelFile
from impnb.models.config import (MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, DeltaNetShape, ModelConfig,
                                 common_fields, positive_int)
from impnb.models.spec import LayerSpec

MAX_CONV_KERNEL = 64
FFN_NORM = "post_attention_norm"  # the FFN's pre-norm, as llama.cpp names it for these hybrids


def deltanet_shape(mf: ModelFile, v_tiled: bool, fused_ba: bool) -> DeltaNetShape:
    """The ssm.* keys, range-checked: V heads a multiple of the QK heads, inner size Hv * dv."""
    n_k = positive_int(mf, "ssm.group_count", limit=MAX_HEADS)
    n_v = positive_int(mf, "ssm.time_step_rank", limit=MAX_HEADS)
    inner = positive_int(mf, "ssm.inner_size", limit=MAX_HEADS * MAX_HEAD_DIM)
    if n_v % n_k or inner % n_v:
        raise GGUFError(f"{mf.path}: {mf.arch}.ssm.time_step_rank {n_v} (V heads) must be a multiple of "
                        f"{mf.arch}.ssm.group_count {n_k} (QK heads) and divide {mf.arch}.ssm.inner_size {inner}")
    return DeltaNetShape(
        n_k_heads=n_k, n_v_heads=n_v,
        head_k_dim=positive_int(mf, "ssm.state_size", limit=MAX_HEAD_DIM),
        head_v_dim=inner // n_v,
        conv_kernel=positive_int(mf, "ssm.conv_kernel", limit=MAX_CONV_KERNEL),
        v_tiled=v_tiled, fused_ba=fused_ba,
    )


def nextn_layers(mf: ModelFile, n_blocks: int) -> int:
    """nextn_predict_layers: the MTP layers llama.cpp's converter appends after the model's own."""
    n = mf.arch_get("nextn_predict_layers", 0)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < n_blocks:
        raise GGUFError(f"{mf.path}: metadata {mf.arch}.nextn_predict_layers = {n!r:.40} is not a count "
                        f"below {mf.arch}.block_count {n_blocks}")
    return n


def hybrid_config(mf: ModelFile, v_tiled: bool, fused_ba: bool) -> ModelConfig:
    """The fields Qwen3-Next and Qwen3.5 share: attention and DeltaNet shapes, the layer pattern;
    block_count less the MTP layers, which impnb does not run."""
    fields = common_fields(mf)
    nextn = nextn_layers(mf, fields["n_layer"])
    fields["n_layer"] -= nextn
    interval = positive_int(mf, "full_attention_interval", 4, limit=MAX_LAYERS)
    return ModelConfig(
        **fields, rope_neox=True, qk_norm=True, attn_output_gate=True,
        deltanet=deltanet_shape(mf, v_tiled, fused_ba),
        recurrent_layers=tuple((il + 1) % interval != 0 for il in range(fields["n_layer"])),
        n_layer_nextn=nextn,
    )


def config(mf: ModelFile) -> ModelConfig:
    return hybrid_config(mf, v_tiled=True, fused_ba=False)


def hybrid_layers(cfg: ModelConfig, ffn: str) -> tuple[LayerSpec, ...]:
    """Gated DeltaNet or gated attention by cfg.recurrent_layers, each with the FFN kind `ffn`."""
    return tuple(LayerSpec(mixer="gated_deltanet" if cfg.is_recurrent(il) else "attention", ffn=ffn,
                           ffn_norm=FFN_NORM) for il in range(cfg.n_layer))


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    return hybrid_layers(cfg, "gated")
