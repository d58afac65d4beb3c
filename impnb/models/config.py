"""The shape and numerics of a decoder-only transformer, read from GGUF metadata."""

from dataclasses import dataclass

from impnb.gguf_file import ModelFile
from impnb.errors import GGUFError


@dataclass(frozen=True)
class ModelConfig:
    """Every field an architecture's layer graph needs; per-architecture files fill it in."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int            # K and Q head dim
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx: int
    eps: float
    rope_base: float
    rope_neox: bool          # NeoX pairs (i, i + n_rot/2) or adjacent pairs
    n_rot: int
    attn_scale: float
    embed_scale: float = 1.0
    act: str = "silu"        # gated FFN activation: silu (SwiGLU) or gelu (GeGLU, tanh)
    qk_norm: bool = False
    post_norms: bool = False  # Gemma's post-attention / post-FFN norms
    sliding_window: int | None = None
    swa_layers: tuple[bool, ...] = ()  # per layer: sliding-window (local) attention
    rope_base_swa: float | None = None
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    expert_weights_norm: bool = False

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def window(self, il: int) -> int | None:
        return self.sliding_window if self.is_swa(il) else None

    def rope_base_for(self, il: int) -> float:
        return self.rope_base_swa if self.is_swa(il) and self.rope_base_swa else self.rope_base


def positive_int(mf: ModelFile, suffix: str, default=None) -> int:
    """An architecture metadata integer that must be positive."""
    value = mf.arch_get(suffix, default) if default is not None else mf.require(suffix)
    if isinstance(value, list):  # per-layer arrays: impnb needs them uniform
        if len(set(value)) != 1:
            raise GGUFError(f"{mf.path}: per-layer {mf.arch}.{suffix} is not supported")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GGUFError(f"{mf.path}: metadata {mf.arch}.{suffix} = {value!r} is not a positive integer")
    return value


def common_fields(mf: ModelFile) -> dict:
    """Fields every llama-like architecture reads the same way."""
    n_embd = positive_int(mf, "embedding_length")
    n_head = positive_int(mf, "attention.head_count")
    n_head_kv = positive_int(mf, "attention.head_count_kv", n_head)
    if n_head % n_head_kv:
        raise GGUFError(f"{mf.path}: {n_head} heads do not divide into {n_head_kv} KV heads")
    head_dim = positive_int(mf, "attention.key_length", n_embd // n_head)
    n_vocab = mf.tensor("token_embd").shape[0]
    return dict(
        arch=mf.arch,
        n_layer=positive_int(mf, "block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=positive_int(mf, "attention.value_length", head_dim),
        n_ff=positive_int(mf, "feed_forward_length", 1),
        n_vocab=n_vocab,
        n_ctx=positive_int(mf, "context_length", 2048),
        eps=float(mf.arch_get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_base=float(mf.arch_get("rope.freq_base", 10000.0)),
        n_rot=positive_int(mf, "rope.dimension_count", head_dim),
        attn_scale=head_dim ** -0.5,
    )
