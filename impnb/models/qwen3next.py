"""qwen3next (Qwen3-Next): qwen35moe's layers with the V heads grouped by QK head (the converter
does not reorder them) and beta / alpha from one fused ssm_ba ([b, a] a QK head)."""

from impnb.gguf_file import ModelFile
from impnb.models import qwen35, qwen35moe
from impnb.models.config import ModelConfig
from impnb.models.layers import LayerSpec


def config(mf: ModelFile) -> ModelConfig:
    return qwen35moe.experts(mf, qwen35.hybrid_config(mf, v_tiled=False, fused_ba=True))


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    return qwen35.hybrid_layers(cfg, "moe_shared")
