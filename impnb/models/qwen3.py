"""qwen3 (dense): llama with per-head QK RMSNorm and NeoX RoPE."""

from impnb.gguf_file import ModelFile
from impnb.models.config import ModelConfig, common_fields
from impnb.models.spec import LayerSpec


def config(mf: ModelFile) -> ModelConfig:
    return ModelConfig(**common_fields(mf), rope_neox=True, qk_norm=True)


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    """Pre-norm attention and gated FFN in every layer."""
    return (LayerSpec(),) * cfg.n_layer
