"""gemma4 (dense E2B / E4B / 31B and the 26B-A4B mixture of experts): config and layer graph.

Against gemma3: norms multiply by w as stored (llama.cpp writes Gemma 4's weights unshifted);
attention scale 1 with Q/K norms and a weightless V norm; sliding and global layers with their
own head dim, KV head count, RoPE base and rotary width (global layers rotate a fraction of
each head, the rest held still by `rope_freqs` factors of 1e30); V is the K projection where
attn_v is absent; the last `shared_kv_layers` layers reuse the K/V of the last earlier layer of
their type; per-layer embeddings (PLE); routed experts beside the dense MLP; a scale on each
layer's output; final logit softcapping.
"""

from dataclasses import dataclass

import numpy as np

from impnb.errors import GGUFError
from impnb.gguf_file import ModelFile
from impnb.models.config import (MAX_CTX, MAX_EMBD, MAX_EXPERTS, MAX_FF, MAX_HEAD_DIM, MAX_HEADS,
                                 MAX_LAYERS, ModelConfig, per_layer_ints, positive_float, positive_int)
from impnb.models.spec import LayerSpec


def ops_class():
    """The numpy ops this graph calls (models/reference.py), imported only for a reference load."""
    from impnb.models.gemma4_ops import Gemma4Ops

    return Gemma4Ops


@dataclass(frozen=True)
class Gemma4Config(ModelConfig):
    """ModelConfig's fields hold the global layers' attention shapes; these the per-layer rest."""

    n_head_kv_layers: tuple[int, ...] = ()
    n_ff_layers: tuple[int, ...] = ()  # the dense MLP's width (double on KV-shared layers in E2B)
    head_dim_swa: int = 0
    n_rot_swa: int = 0
    n_kv_shared: int = 0  # the last n_kv_shared layers compute no K/V of their own
    n_embd_per_layer: int = 0  # PLE width; 0: no per-layer embeddings
    final_logit_softcap: float | None = None

    def kv_heads(self, il: int) -> int:
        return self.n_head_kv_layers[il]

    def head_dims(self, il: int) -> tuple[int, int]:
        return (self.head_dim_swa,) * 2 if self.is_swa(il) else (self.head_dim, self.head_dim_v)

    def n_rot_for(self, il: int) -> int:
        return self.n_rot_swa if self.is_swa(il) else self.n_rot

    def rope_factors_at(self, il: int) -> bool:
        return not self.is_swa(il)  # proportional RoPE: the global layers

    def kv_layer(self, il: int) -> int:
        first_shared = self.n_layer - self.n_kv_shared
        if il < first_shared:
            return il
        return max(j for j in range(first_shared) if self.is_swa(j) == self.is_swa(il))


def _swa_layers(mf: ModelFile, n_layer: int) -> tuple[bool, ...]:
    key = f"{mf.arch}.attention.sliding_window_pattern"
    value = mf.require("attention.sliding_window_pattern")
    if not isinstance(value, list) or not all(isinstance(v, bool) for v in value):
        raise GGUFError(f"{mf.path}: metadata {key} is not a per-layer array of booleans")
    if len(value) != n_layer:
        raise GGUFError(f"{mf.path}: per-layer {key} has {len(value)} entries; "
                        f"{mf.arch}.block_count is {n_layer}")
    return tuple(value)


def _count(mf: ModelFile, suffix: str, limit: int) -> int:
    """A metadata integer in [0, limit], 0 where absent."""
    value = mf.arch_get(suffix, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise GGUFError(f"{mf.path}: metadata {mf.arch}.{suffix} = {value!r:.40} is not an "
                        f"integer in [0, {limit}]")
    return value


def _rotary(mf: ModelFile, suffix: str, head_dim: int, what: str) -> int:
    n_rot = positive_int(mf, suffix, head_dim, limit=MAX_HEAD_DIM)
    if n_rot > head_dim or n_rot % 2:
        raise GGUFError(f"{mf.path}: {mf.arch}.{suffix} {n_rot} must be even and at most the "
                        f"{what} head dim {head_dim}")
    return n_rot


def _same_length(mf: ModelFile, k_suffix: str, v_suffix: str) -> int:
    dk = positive_int(mf, k_suffix, limit=MAX_HEAD_DIM)
    dv = positive_int(mf, v_suffix, dk, limit=MAX_HEAD_DIM)
    if dk != dv:
        raise GGUFError(f"{mf.path}: {mf.arch}.{k_suffix} {dk} differs from {mf.arch}.{v_suffix} "
                        f"{dv}; gemma4 has one head dim for K and V")
    return dk


def config(mf: ModelFile) -> Gemma4Config:
    n_layer = positive_int(mf, "block_count", limit=MAX_LAYERS)
    n_embd = positive_int(mf, "embedding_length", limit=MAX_EMBD)
    n_head = positive_int(mf, "attention.head_count", limit=MAX_HEADS)
    swa = _swa_layers(mf, n_layer)
    kv_heads = per_layer_ints(mf, "attention.head_count_kv", n_layer, n_head, limit=MAX_HEADS)
    for il, hkv in enumerate(kv_heads):
        if n_head % hkv:
            raise GGUFError(f"{mf.path}: {mf.arch}.attention.head_count {n_head} is not a multiple of "
                            f"layer {il}'s head_count_kv {hkv}")
    head_dim = _same_length(mf, "attention.key_length", "attention.value_length")
    head_dim_swa = _same_length(mf, "attention.key_length_swa", "attention.value_length_swa")
    n_shared = _count(mf, "attention.shared_kv_layers", n_layer - 1)
    n_expert = mf.arch_get("expert_count", 0)
    moe = {}
    if n_expert:
        n_expert = positive_int(mf, "expert_count", limit=MAX_EXPERTS)
        n_used = positive_int(mf, "expert_used_count", limit=MAX_EXPERTS)
        if n_used > n_expert:
            raise GGUFError(f"{mf.path}: {mf.arch}.expert_used_count {n_used} is above "
                            f"{mf.arch}.expert_count {n_expert}")
        moe = dict(n_expert=n_expert, n_expert_used=n_used, expert_weights_norm=True,
                   n_ff_exp=positive_int(mf, "expert_feed_forward_length", limit=MAX_FF))
    n_ff = per_layer_ints(mf, "feed_forward_length", n_layer, limit=MAX_FF)
    n_per_layer = _count(mf, "embedding_length_per_layer_input", MAX_EMBD)
    softcap = mf.arch_get("final_logit_softcapping")
    cfg = Gemma4Config(
        arch=mf.arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=max(kv_heads),
        head_dim=head_dim, head_dim_v=head_dim, n_ff=max(n_ff),
        n_vocab=mf.tensor("token_embd").shape[0],
        n_ctx=positive_int(mf, "context_length", 2048, limit=MAX_CTX),
        eps=positive_float(mf, "attention.layer_norm_rms_epsilon", 1e-6, 0.1),
        rope_base=positive_float(mf, "rope.freq_base", 1e6, 1e12),
        rope_neox=True,
        n_rot=_rotary(mf, "rope.dimension_count", head_dim, "global"),
        attn_scale=1.0,
        embed_scale=float(np.sqrt(n_embd)),
        act="gelu", qk_norm=True, post_norms=True,
        sliding_window=positive_int(mf, "attention.sliding_window", 512, limit=MAX_CTX),
        swa_layers=swa,
        rope_base_swa=positive_float(mf, "rope.freq_base_swa", 10000.0, 1e12),
        **moe,
        n_head_kv_layers=kv_heads, n_ff_layers=n_ff, head_dim_swa=head_dim_swa,
        n_rot_swa=_rotary(mf, "rope.dimension_count_swa", head_dim_swa, "sliding"),
        n_kv_shared=n_shared, n_embd_per_layer=n_per_layer,
        final_logit_softcap=positive_float(mf, "final_logit_softcapping", 1.0, 1e6) if softcap else None,
    )
    _check_sharing(mf, cfg)
    return cfg


def _check_sharing(mf: ModelFile, cfg: Gemma4Config) -> None:
    """Every KV-shared layer has an earlier layer of its type, with its KV heads, to read."""
    first_shared = cfg.n_layer - cfg.n_kv_shared
    for il in range(first_shared, cfg.n_layer):
        kind = "sliding" if cfg.is_swa(il) else "global"
        if not any(cfg.is_swa(j) == cfg.is_swa(il) for j in range(first_shared)):
            raise GGUFError(f"{mf.path}: layer {il} shares the K/V of an earlier {kind} layer "
                            f"({mf.arch}.attention.shared_kv_layers {cfg.n_kv_shared}), but the "
                            f"layers before {first_shared} have none")
        src = cfg.kv_layer(il)
        if cfg.kv_heads(il) != cfg.kv_heads(src):
            raise GGUFError(f"{mf.path}: layer {il} reads layer {src}'s K/V but {mf.arch}."
                            f"attention.head_count_kv gives them {cfg.kv_heads(il)} and "
                            f"{cfg.kv_heads(src)} heads")


def layers(cfg: Gemma4Config) -> tuple[LayerSpec, ...]:
    """gemma3's post-normed layer, with Gemma 4's attention, routed experts beside the dense MLP
    where the file has experts (the experts norm the residual themselves), per-layer embeddings
    where it has them, and the layer output scale."""
    after = ("per_layer_embedding",) * bool(cfg.n_embd_per_layer) + ("output_scale",)
    ffn = dict(ffn="mlp_and_moe", ffn_norm=None) if cfg.n_expert else {}
    spec = LayerSpec(mixer="gemma4_attention", post_attn_norm="post_attention_norm",
                     post_ffn_norm="post_ffw_norm", after=after, **ffn)
    return (spec,) * cfg.n_layer
