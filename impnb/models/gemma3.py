"""gemma3 (text): scaled embeddings, QK-norm, post-norms, GeGLU, local/global attention."""

import numpy as np

from impnb.gguf_file import ModelFile
from impnb.models.config import MAX_CTX, ModelConfig, common_fields, positive_int
from impnb.models.spec import LayerSpec

# Every sixth layer is global; the others attend within the sliding window with RoPE base 10k.
SWA_PATTERN = 6
ROPE_BASE_SWA = 10000.0


def config(mf: ModelFile) -> ModelConfig:
    fields = common_fields(mf)
    n_layer = fields["n_layer"]
    return ModelConfig(
        **fields,
        rope_neox=True,
        embed_scale=float(np.sqrt(fields["n_embd"])),
        act="gelu",
        qk_norm=True,
        post_norms=True,
        sliding_window=positive_int(mf, "attention.sliding_window", 512, limit=MAX_CTX),
        swa_layers=tuple((il + 1) % SWA_PATTERN != 0 for il in range(n_layer)),
        rope_base_swa=ROPE_BASE_SWA,
    )


def layers(cfg: ModelConfig) -> tuple[LayerSpec, ...]:
    """Attention and GeGLU FFN with a norm on each one's output before the residual add."""
    return (LayerSpec(post_attn_norm="post_attention_norm", post_ffn_norm="post_ffw_norm"),) * cfg.n_layer
