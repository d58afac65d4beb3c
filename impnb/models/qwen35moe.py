"""qwen35moe (Qwen3.5 / 3.6 MoE, e.g. Qwen3.6-35B-A3B): qwen35's layers with softmax top-k routed
experts plus a sigmoid-gated shared expert in every layer."""

import dataclasses

from impnb.gguf_file import ModelFile
from impnb.models import qwen35, qwen3moe
from impnb.models.config import MAX_FF, ModelConfig, positive_int
from impnb.models.spec import LayerSpec


def experts(mf: ModelFile, cfg: ModelConfig) -> ModelConfig:
    """cfg with qwen3moe's expert keys and the shared expert's width."""
    return dataclasses.replace(
        qwen3moe.experts(mf, cfg),
        n_ff_shexp=positive_int(mf, "expert_shared_feed_forward_length", limit=MAX_FF),
    )


def config(mf: ModelFile) -> ModelConfig:
    return experts(mf, qwen35.config(mf))


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    return qwen35.hybrid_layers(cfg, "moe_shared")
