"""qwen3moe (Qwen3-30B-A3B shape): qwen3 attention, softmax top-k routed expert FFNs."""

import dataclasses

from impnb.gguf_file import ModelFile
from impnb.models import qwen3
from impnb.errors import GGUFError
from impnb.models.config import MAX_EXPERTS, MAX_FF, ModelConfig, positive_int
from impnb.models.layers import LayerSpec


def config(mf: ModelFile) -> ModelConfig:
    n_expert = positive_int(mf, "expert_count", limit=MAX_EXPERTS)
    n_used = positive_int(mf, "expert_used_count", limit=MAX_EXPERTS)
    if n_used > n_expert:
        raise GGUFError(f"{mf.path}: qwen3moe.expert_used_count {n_used} is above "
                        f"qwen3moe.expert_count {n_expert}")
    return dataclasses.replace(
        qwen3.config(mf),
        n_expert=n_expert,
        n_expert_used=n_used,
        n_ff_exp=positive_int(mf, "expert_feed_forward_length", 1, limit=MAX_FF),
        # llama.cpp normalizes Qwen3-MoE's top-k weights (norm_topk_prob) unconditionally.
        expert_weights_norm=bool(mf.arch_get("expert_weights_norm", True)),
    )


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    """Pre-norm attention and routed experts in every layer."""
    return (LayerSpec(ffn="moe"),) * cfg.n_layer
