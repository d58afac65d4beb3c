"""The shape and numerics of a decoder-only transformer, read from GGUF metadata."""

from dataclasses import dataclass

from impnb.gguf_file import ModelFile
from impnb.errors import GGUFError


@dataclass(frozen=True)
class DeltaNetShape:
    """The sizes of a hybrid model's Gated DeltaNet (linear attention) layers, from its ssm.* keys."""

    n_k_heads: int     # Q/K heads (ssm.group_count)
    n_v_heads: int     # V heads (ssm.time_step_rank), a multiple of n_k_heads
    head_k_dim: int    # ssm.state_size
    head_v_dim: int    # ssm.inner_size / n_v_heads
    conv_kernel: int   # ssm.conv_kernel
    v_tiled: bool      # V head h reads QK head h % n_k_heads (qwen35's reordered file), else h // (Hv / Hk)
    fused_ba: bool     # beta and alpha from one ssm_ba ([b, a] per QK head, qwen3next), else ssm_beta / ssm_alpha
    fused_qkvz: bool = False  # Q, K, V and Z from one ssm_in ([q, k, v, z] per QK head, older qwen3next files)

    @property
    def conv_channels(self) -> int:
        """Q, K and V channels, the causal conv's input: 2 Hk dk + Hv dv."""
        return 2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim


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
    n_ff_shexp: int = 0      # the shared expert's FFN width (moe_shared layers)
    attn_output_gate: bool = False  # attn_q yields [q, gate] a head; the output is times sigmoid(gate)
    deltanet: DeltaNetShape | None = None  # the Gated DeltaNet sizes of a hybrid model
    recurrent_layers: tuple[bool, ...] = ()  # per layer: Gated DeltaNet (a recurrent state, no KV)
    n_layer_nextn: int = 0   # MTP (next-token prediction) layers the file holds after n_layer, not run

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def is_recurrent(self, il: int) -> bool:
        return bool(self.recurrent_layers) and self.recurrent_layers[il]

    def window(self, il: int) -> int | None:
        return self.sliding_window if self.is_swa(il) else None

    def rope_base_for(self, il: int) -> float:
        return self.rope_base_swa if self.is_swa(il) and self.rope_base_swa else self.rope_base

    # Per-layer attention shapes: uniform here; an architecture whose layers differ (gemma4)
    # subclasses the config and answers per layer.
    def kv_heads(self, il: int) -> int:
        """Layer il's KV head count."""
        return self.n_head_kv

    def head_dims(self, il: int) -> tuple[int, int]:
        """Layer il's K (and Q) head dim and V head dim."""
        return self.head_dim, self.head_dim_v

    def kv_layer(self, il: int) -> int:
        """The layer whose cached K/V layer il attends over: itself, or the earlier one it shares."""
        return il

    def n_rot_for(self, il: int) -> int:
        """Layer il's rotary width."""
        return self.n_rot

    def rope_factors_at(self, il: int) -> bool:
        """Whether layer il's RoPE divides its frequencies by the file's `rope_freqs` factors."""
        return False


# Bounds on the sizes a file may declare: far above any real model, low enough that no loop or
# allocation driven by them can hang or exhaust the host before the memory check runs.
MAX_LAYERS = 1024
MAX_EMBD = 1 << 17
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_FF = 1 << 20
MAX_CTX = 1 << 24
MAX_EXPERTS = 1024


def positive_int(mf: ModelFile, suffix: str, default=None, limit: int = 1 << 31) -> int:
    """An architecture metadata integer in [1, limit]; GGUFError naming the key otherwise."""
    value = mf.arch_get(suffix, default) if default is not None else mf.require(suffix)
    key = f"{mf.arch}.{suffix}"
    if isinstance(value, list):  # per-layer arrays: impnb needs them uniform
        if not value:
            raise GGUFError(f"{mf.path}: metadata {key} is an empty array")
        if len(set(map(repr, value))) != 1:
            raise GGUFError(f"{mf.path}: per-layer {key} is not supported")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GGUFError(f"{mf.path}: metadata {key} = {_short(value)} is not a positive integer")
    if value > limit:
        raise GGUFError(f"{mf.path}: metadata {key} = {value} is above the limit of {limit}")
    return value


def per_layer_ints(mf: ModelFile, suffix: str, n_layer: int, default=None, limit: int = 1 << 31,
                   minimum: int = 1) -> tuple[int, ...]:
    """An architecture metadata integer or per-layer array of them, each in [minimum, limit], as one
    value a layer; GGUFError naming the key where an array's length is not block_count."""
    value = mf.arch_get(suffix, default) if default is not None else mf.require(suffix)
    key = f"{mf.arch}.{suffix}"
    values = value if isinstance(value, list) else [value] * n_layer
    if len(values) != n_layer:
        raise GGUFError(f"{mf.path}: per-layer {key} has {len(values)} entries; "
                        f"{mf.arch}.block_count is {n_layer}")
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v <= limit:
            raise GGUFError(f"{mf.path}: metadata {key} holds {_short(v)}, not an integer in "
                            f"[{minimum}, {limit}]")
    return tuple(values)


def positive_float(mf: ModelFile, suffix: str, default: float, limit: float) -> float:
    """An architecture metadata number, finite, in (0, limit]; GGUFError naming the key otherwise."""
    value = mf.arch_get(suffix, default)
    key = f"{mf.arch}.{suffix}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GGUFError(f"{mf.path}: metadata {key} = {_short(value)} is not a number")
    if not 0 < value <= limit:  # NaN fails too
        raise GGUFError(f"{mf.path}: metadata {key} = {value} is not in (0, {limit:g}]")
    return float(value)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def common_fields(mf: ModelFile) -> dict:
    """Fields every llama-like architecture reads the same way, each type- and range-checked."""
    n_embd = positive_int(mf, "embedding_length", limit=MAX_EMBD)
    n_head = positive_int(mf, "attention.head_count", limit=MAX_HEADS)
    n_head_kv = positive_int(mf, "attention.head_count_kv", n_head, limit=MAX_HEADS)
    if n_head % n_head_kv:
        raise GGUFError(f"{mf.path}: {mf.arch}.attention.head_count {n_head} is not a multiple of "
                        f"{mf.arch}.attention.head_count_kv {n_head_kv}")
    head_dim = positive_int(mf, "attention.key_length", max(n_embd // n_head, 1), limit=MAX_HEAD_DIM)
    n_rot = positive_int(mf, "rope.dimension_count", head_dim, limit=MAX_HEAD_DIM)
    if n_rot > head_dim or n_rot % 2:
        raise GGUFError(f"{mf.path}: {mf.arch}.rope.dimension_count {n_rot} must be even and at most "
                        f"the head dim {head_dim}")
    return dict(
        arch=mf.arch,
        n_layer=positive_int(mf, "block_count", limit=MAX_LAYERS),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=positive_int(mf, "attention.value_length", head_dim, limit=MAX_HEAD_DIM),
        n_ff=positive_int(mf, "feed_forward_length", 1, limit=MAX_FF),
        n_vocab=mf.tensor("token_embd").shape[0],
        n_ctx=positive_int(mf, "context_length", 2048, limit=MAX_CTX),
        eps=positive_float(mf, "attention.layer_norm_rms_epsilon", 1e-6, 0.1),
        rope_base=positive_float(mf, "rope.freq_base", 10000.0, 1e12),
        n_rot=n_rot,
        attn_scale=head_dim ** -0.5,
    )
