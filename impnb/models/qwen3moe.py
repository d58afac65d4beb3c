"""qwen3moe (Qwen3-30B-A3B shape): qwen3 attention, softmax top-k routed expert FFNs."""

import dataclasses

from impnb.gguf_file import ModelFile
from impnb.models import qwen3
from impnb.models.config import ModelConfig, positive_int
from impnb.models.layers import LayerSpec


def config(mf: ModelFile) -> ModelConfig:
    n_expert = positive_int(mf, "expert_count")
    return dataclasses.replace(
        qwen3.config(mf),
        n_expert=n_expert,
        n_expert_used=min(positive_int(mf, "expert_used_count"), n_expert),
        n_ff_exp=positive_int(mf, "expert_feed_forward_length", 1),
        # llama.cpp normalizes Qwen3-MoE's top-k weights (norm_topk_prob) unconditionally.
        expert_weights_norm=bool(mf.arch_get("expert_weights_norm", True)),
    )


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    """Pre-norm attention and routed experts in every layer."""
    return (LayerSpec(ffn="moe"),) * cfg.n_layer
