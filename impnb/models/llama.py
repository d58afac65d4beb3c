"""llama (SmolLM2, Llama 2/3): config from GGUF metadata and the layer graph."""

from impnb.gguf_file import ModelFile
from impnb.models.config import ModelConfig, common_fields
from impnb.models.layers import gated_ffn, pre_norm_forward


def config(mf: ModelFile) -> ModelConfig:
    # The GGUF converter permutes Q/K rows so RoPE rotates adjacent pairs (normal layout).
    return ModelConfig(**common_fields(mf), rope_neox=False)


def forward(ops, cfg: ModelConfig, tokens, cache):
    return pre_norm_forward(ops, cfg, tokens, cache, gated_ffn)
