"""What one decoder layer computes: its mixer, its FFN and the norms around them (an architecture's
`layers(cfg)` gives one a layer; the numpy reference, models/layers.py, and gpu/forward.py follow them)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerSpec:
    """One layer: its mixer and FFN kinds and the norms around them. Attention's details (QK-norm,
    RoPE style, window) come from the config."""

    mixer: str = "attention"  # softmax attention over the KV cache (attention_block)
    ffn: str = "gated"  # "gated": down(act(gate) * up) (gated_ffn); "moe": routed experts (ops.moe)
    # the FFN's pre-norm (Qwen3-Next / 3.5 files: post_attention_norm); None: the FFN reads the
    # residual and norms it itself (gemma4's routed experts beside the MLP)
    ffn_norm: str | None = "ffn_norm"
    post_attn_norm: str | None = None  # a norm on attention's output before the residual add
    post_ffn_norm: str | None = None  # and on the FFN's
    after: tuple[str, ...] = ()  # steps on the residual once the FFN's output is added (AFTER)

    @property
    def adds_into_residual(self) -> bool:
        """Whether the attention and FFN outputs add straight into the residual (no post-norm)."""
        return self.post_attn_norm is None and self.post_ffn_norm is None and not self.after
