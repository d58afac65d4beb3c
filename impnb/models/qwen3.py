"""qwen3 (dense): llama with per-head QK RMSNorm and NeoX RoPE."""

from impnb.gguf_file import ModelFile
from impnb.models.config import ModelConfig, common_fields
from impnb.models.layers import gated_ffn, pre_norm_forward


def config(mf: ModelFile) -> ModelConfig:
    return ModelConfig(**common_fields(mf), rope_neox=True, qk_norm=True)


def forward(ops, cfg: ModelConfig, tokens, cache):
    return pre_norm_forward(ops, cfg, tokens, cache, gated_ffn)
