"""qwen3next (Qwen3-Next): qwen35moe's layers with the V heads grouped by QK head (the converter
does not reorder them) and beta / alpha from one fused ssm_ba ([b, a] a QK head). Files from older
converters hold HF's fused in_proj_qkvz as ssm_in ([q, k, v, z] a QK head) instead of attn_qkv and
attn_gate; llama.cpp reads both."""

import dataclasses

from impnb.gguf_file import ModelFile
from impnb.models import qwen35, qwen35moe
from impnb.models.config import ModelConfig
from impnb.models.spec import LayerSpec


def config(mf: ModelFile) -> ModelConfig:
    cfg = qwen35moe.experts(mf, qwen35.hybrid_config(mf, v_tiled=False, fused_ba=True))
    legacy = any(name.endswith(".ssm_in.weight") for name in mf.tensors)
    return dataclasses.replace(cfg, deltanet=dataclasses.replace(cfg.deltanet, fused_qkvz=legacy))


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    return qwen35.hybrid_layers(cfg, "moe_shared")
