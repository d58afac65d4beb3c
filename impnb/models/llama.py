"""llama (SmolLM2, Llama 2/3): config from GGUF metadata and the layer graph."""

from impnb.gguf_file import ModelFile
from impnb.models.config import ModelConfig, common_fields
from impnb.models.spec import LayerSpec


def config(mf: ModelFile) -> ModelConfig:
    # The GGUF converter permutes Q/K rows so RoPE rotates adjacent pairs (normal layout).
    return ModelConfig(**common_fields(mf), rope_neox=False)


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    """Pre-norm attention and gated FFN in every layer."""
    return (LayerSpec(),) * cfg.n_layer
