"""qwen3moe (Qwen3-30B-A3B shape): qwen3 attention, softmax top-k routed expert FFNs."""

import dataclasses

from impnb.gguf_file import ModelFile
from impnb.models import qwen3
from impnb.errors import GGUFError
from impnb.models.config import MAX_EXPERTS, MAX_FF, ModelConfig, positive_int
from impnb.models.spec import LayerSpec


def config(mf: ModelFile) -> ModelConfig:
    return experts(mf, qwen3.config(mf))


def experts(mf: ModelFile, cfg: ModelConfig) -> ModelConfig:
    """cfg with the routed experts' keys read (qwen35moe and qwen3next read them the same way)."""
    n_expert = positive_int(mf, "expert_count", limit=MAX_EXPERTS)
    n_used = positive_int(mf, "expert_used_count", limit=MAX_EXPERTS)
    if n_used > n_expert:
        raise GGUFError(f"{mf.path}: {mf.arch}.expert_used_count {n_used} is above "
                        f"{mf.arch}.expert_count {n_expert}")
    return dataclasses.replace(
        cfg,
        n_expert=n_expert,
        n_expert_used=n_used,
        n_ff_exp=positive_int(mf, "expert_feed_forward_length", 1, limit=MAX_FF),
        # llama.cpp normalizes Qwen3-MoE's top-k weights (norm_topk_prob) unconditionally.
        expert_weights_norm=bool(mf.arch_get("expert_weights_norm", True)),
    )


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    """Pre-norm attention and routed experts in every layer."""
    return (LayerSpec(ffn="moe"),) * cfg.n_layer
