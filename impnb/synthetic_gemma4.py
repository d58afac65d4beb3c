"""Tiny random Gemma 4 text models from HF transformers, written to GGUF as llama.cpp's converter
(Gemma4Model) writes them: names from gguf-py's GEMMA4 map, norms unshifted, the router's and
experts' scales as `.scale` tensors, `layer_scalar` as layer_output_scale, a rope_freqs tensor for
the global layers' proportional RoPE, per-layer head_count_kv / feed_forward_length arrays."""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_VERSION

from impnb.synthetic import MINIMAL_VOCAB, QTYPES, add_tokenizer, minimal_tokenizer_metadata, write_gguf

NORM_STD = 0.1
SLIDING, GLOBAL = "sliding_attention", "full_attention"
# Each variant covers a part of what Gemma 4 adds to Gemma 3; together, all of it.
VARIANTS = {
    # E2B-like: per-layer embeddings, KV sharing (the last two layers, one of each kind), the
    # double-wide MLP on shared layers, separate V projection.
    "dense": dict(num_hidden_layers=6, layer_types=[SLIDING, SLIDING, GLOBAL, SLIDING, SLIDING, GLOBAL],
                  num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=32),
    # 26B-A4B-like: routed experts beside the dense MLP, K = V on global layers with their own
    # KV head count, no PLE, no sharing.
    "moe": dict(num_hidden_layers=4, layer_types=[SLIDING, GLOBAL, SLIDING, GLOBAL],
                attention_k_eq_v=True, num_global_key_value_heads=1, enable_moe_block=True,
                num_experts=8, top_k_experts=2, moe_intermediate_size=32, hidden_size_per_layer_input=0),
}
SLIDING_WINDOW = 8
# head dims the GPU's attention kernels take (tiny_config's own 16 and 32 are below them)
GPU_HEAD_DIMS = dict(head_dim=64, global_head_dim=128)


def tiny_config(variant: str, vocab_size: int = MINIMAL_VOCAB, **overrides):
    from transformers import Gemma4TextConfig

    fields = dict(
        vocab_size=vocab_size, vocab_size_per_layer_input=vocab_size, hidden_size=64,
        intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        global_head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6,
        sliding_window=SLIDING_WINDOW, final_logit_softcapping=8.0,
        rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                         GLOBAL: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                  "rope_theta": 1_000_000.0}},
        bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="eager",
        **VARIANTS[variant])
    return Gemma4TextConfig(**{**fields, **overrides})


def build_hf_model(variant: str, vocab_size: int = MINIMAL_VOCAB, seed: int = 0, **overrides):
    """Gemma4ForCausalLM in float32, eval mode, every parameter and the layer scalars drawn from
    `seed`: matrices N(0, 1/fan_in), norms and scales 1 + 0.1 N(0, 1)."""
    import torch
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(tiny_config(variant, vocab_size, **overrides)).float().eval()
    gen = torch.Generator().manual_seed(seed)
    tensors = dict(model.named_parameters())
    tensors.update((n, b) for n, b in model.named_buffers() if n.endswith("layer_scalar"))
    with torch.no_grad():
        for _, p in sorted(tensors.items()):  # tied weights appear once
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(1.0 + NORM_STD * noise if p.ndim == 1 else noise * p.shape[-1] ** -0.5)
    return model


def gguf_pairs(model) -> list[tuple[str, object]]:
    """(GGUF name, HF tensor) for every tensor of `model` llama.cpp's converter writes."""
    inner, cfg = model.model, model.config
    out = [("token_embd.weight", inner.embed_tokens.weight), ("output_norm.weight", inner.norm.weight)]
    if cfg.hidden_size_per_layer_input:
        out += [("per_layer_token_embd.weight", inner.embed_tokens_per_layer.weight),
                ("per_layer_model_proj.weight", inner.per_layer_model_projection.weight),
                ("per_layer_proj_norm.weight", inner.per_layer_projection_norm.weight)]
    for i, layer in enumerate(inner.layers):
        attn, b = layer.self_attn, f"blk.{i}."
        out += [(b + "attn_norm.weight", layer.input_layernorm.weight),
                (b + "attn_q.weight", attn.q_proj.weight), (b + "attn_q_norm.weight", attn.q_norm.weight),
                (b + "attn_output.weight", attn.o_proj.weight),
                (b + "post_attention_norm.weight", layer.post_attention_layernorm.weight),
                (b + "ffn_norm.weight", layer.pre_feedforward_layernorm.weight),
                (b + "ffn_gate.weight", layer.mlp.gate_proj.weight), (b + "ffn_up.weight", layer.mlp.up_proj.weight),
                (b + "ffn_down.weight", layer.mlp.down_proj.weight),
                (b + "post_ffw_norm.weight", layer.post_feedforward_layernorm.weight),
                (b + "layer_output_scale.weight", layer.layer_scalar)]
        if not attn.is_kv_shared_layer:
            out += [(b + "attn_k.weight", attn.k_proj.weight), (b + "attn_k_norm.weight", attn.k_norm.weight)]
            if attn.v_proj is not None:
                out.append((b + "attn_v.weight", attn.v_proj.weight))
        if layer.enable_moe_block:
            out += [(b + "ffn_gate_inp.weight", layer.router.proj.weight),
                    (b + "ffn_gate_inp.scale", layer.router.scale),
                    (b + "ffn_down_exps.scale", layer.router.per_expert_scale),
                    (b + "ffn_gate_up_exps.weight", layer.experts.gate_up_proj),
                    (b + "ffn_down_exps.weight", layer.experts.down_proj),
                    (b + "pre_ffw_norm_2.weight", layer.pre_feedforward_layernorm_2.weight),
                    (b + "post_ffw_norm_1.weight", layer.post_feedforward_layernorm_1.weight),
                    (b + "post_ffw_norm_2.weight", layer.post_feedforward_layernorm_2.weight)]
        if cfg.hidden_size_per_layer_input:
            out += [(b + "inp_gate.weight", layer.per_layer_input_gate.weight),
                    (b + "proj.weight", layer.per_layer_projection.weight),
                    (b + "post_norm.weight", layer.post_per_layer_input_norm.weight)]
    return out


def tensor_qtype(name: str, array: np.ndarray, qtype: str) -> GGMLQuantizationType:
    """1-D tensors, norms, the router and rows that are no whole Q8_0 block stay F32."""
    if (qtype == "F32" or array.ndim <= 1 or name.endswith("_norm.weight")
            or ".ffn_gate_inp." in name or array.shape[-1] % 32):
        return GGMLQuantizationType.F32
    return GGMLQuantizationType.Q8_0


@dataclass(frozen=True)
class Gemma4Shape:
    """A Gemma 4 text model's sizes under transformers' config names, what the GGUF keys say."""

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_global_key_value_heads: int
    head_dim: int
    global_head_dim: int
    vocab_size: int
    layer_types: tuple[str, ...]
    sliding_window: int
    num_kv_shared_layers: int = 0
    use_double_wide_mlp: bool = False
    hidden_size_per_layer_input: int = 0
    attention_k_eq_v: bool = False
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    final_logit_softcapping: float | None = None
    rope_theta: float = 1_000_000.0
    rope_theta_swa: float = 10_000.0
    partial_rotary_factor: float = 0.25  # of the global layers' heads
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 131072

    @classmethod
    def of(cls, cfg) -> "Gemma4Shape":
        """The shape of a Gemma4TextConfig (its per-layer head dims and KV heads by layer kind)."""
        full = cfg.per_layer_config[GLOBAL]
        return cls(cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                   cfg.per_layer_config[SLIDING].num_key_value_heads, full.num_key_value_heads,
                   cfg.per_layer_config[SLIDING].head_dim, full.head_dim, cfg.vocab_size,
                   tuple(cfg.layer_types), cfg.sliding_window, cfg.num_kv_shared_layers,
                   cfg.use_double_wide_mlp, cfg.hidden_size_per_layer_input or 0, cfg.attention_k_eq_v,
                   (cfg.num_experts or 0) if cfg.enable_moe_block else 0, cfg.top_k_experts or 0,
                   cfg.moe_intermediate_size or 0, cfg.final_logit_softcapping,
                   cfg.rope_parameters[GLOBAL]["rope_theta"], cfg.rope_parameters[SLIDING]["rope_theta"],
                   cfg.rope_parameters[GLOBAL]["partial_rotary_factor"], cfg.rms_norm_eps,
                   cfg.max_position_embeddings)

    def is_swa(self, il: int) -> bool:
        return self.layer_types[il] == SLIDING

    def kv_heads(self, il: int) -> int:
        return self.num_key_value_heads if self.is_swa(il) else self.num_global_key_value_heads

    def layer_head_dim(self, il: int) -> int:
        return self.head_dim if self.is_swa(il) else self.global_head_dim

    def is_kv_shared(self, il: int) -> bool:
        return il >= self.num_hidden_layers - self.num_kv_shared_layers

    def n_ff(self, il: int) -> int:
        """The dense MLP's width: double on KV-shared layers with use_double_wide_mlp."""
        return self.intermediate_size * (2 if self.use_double_wide_mlp and self.is_kv_shared(il) else 1)

    def rope_freqs(self) -> np.ndarray:
        """The converter's factors for the global layers: 1 on the rotated pairs, 1e30 (no
        rotation) on the rest of the head."""
        n_rot = int(self.global_head_dim * self.partial_rotary_factor / 2)
        return np.array([1.0] * n_rot + [1e30] * (self.global_head_dim // 2 - n_rot), np.float32)


def add_hparams(writer: GGUFWriter, shape: Gemma4Shape, file_type, name: str) -> None:
    """Gemma3Model + Gemma4Model set_gguf_parameters."""
    n = shape.num_hidden_layers
    writer.add_type("model")
    writer.add_name(name)
    writer.add_block_count(n)
    writer.add_context_length(shape.max_position_embeddings)
    writer.add_embedding_length(shape.hidden_size)
    ff = [shape.n_ff(il) for il in range(n)]
    writer.add_feed_forward_length(ff if shape.use_double_wide_mlp else shape.intermediate_size)
    writer.add_head_count(shape.num_attention_heads)
    writer.add_head_count_kv([shape.kv_heads(il) for il in range(n)])
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    writer.add_key_length(shape.global_head_dim)
    writer.add_value_length(shape.global_head_dim)
    writer.add_key_length_swa(shape.head_dim)
    writer.add_value_length_swa(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_rope_freq_base_swa(shape.rope_theta_swa)
    writer.add_rope_dimension_count(shape.global_head_dim)
    writer.add_rope_dimension_count_swa(shape.head_dim)
    if shape.final_logit_softcapping:
        writer.add_final_logit_softcapping(shape.final_logit_softcapping)
    writer.add_sliding_window(shape.sliding_window)
    writer.add_sliding_window_pattern([shape.is_swa(il) for il in range(n)])
    writer.add_shared_kv_layers(shape.num_kv_shared_layers)
    writer.add_embedding_length_per_layer_input(shape.hidden_size_per_layer_input)
    if shape.num_experts:
        writer.add_expert_count(shape.num_experts)
        writer.add_expert_used_count(shape.top_k_experts)
        writer.add_expert_feed_forward_length(shape.moe_intermediate_size)
    writer.add_file_type(file_type)
    writer.add_quantization_version(GGML_QUANT_VERSION)


def export_gguf(model, path, qtype: str = "F32") -> None:
    """Write `model` to `path` as llama.cpp's converter does with `--outtype f32` or `q8_0`."""
    cfg, shape = model.config, Gemma4Shape.of(model.config)
    writer = GGUFWriter(os.fspath(path), "gemma4")
    add_hparams(writer, shape, QTYPES[qtype], "impnb tiny gemma4")
    add_tokenizer(writer, minimal_tokenizer_metadata(cfg.vocab_size))
    tensors = [(name, t.detach().float().numpy().reshape(t.shape or (1,)).copy())
               for name, t in gguf_pairs(model)]
    if GLOBAL in cfg.layer_types:
        tensors.append(("rope_freqs.weight", shape.rope_freqs()))
    write_gguf(writer, ((name, array, tensor_qtype(name, array, qtype)) for name, array in tensors))


def load_from_gguf(model, path) -> None:
    """Copy the GGUF's (dequantized) tensors into `model`, so HF runs the weights the file holds."""
    import torch

    from impnb.gguf_file import open_model_file

    mf = open_model_file(path)
    with torch.no_grad():
        for name, t in gguf_pairs(model):
            t.copy_(torch.from_numpy(np.array(mf.tensors[name].dequantize())).reshape(t.shape))


def tiny_gguf(variant: str, qtype: str, directory, seed: int = 0, **overrides):
    """(hf_model, gguf_path) with the file at `directory`/tiny-gemma4-{variant}-{qtype}-s{seed}.gguf;
    for a quantized file the HF model holds the file's dequantized weights. overrides: config
    fields past the variant's (GPU_HEAD_DIMS for the GPU tests)."""
    model = build_hf_model(variant, seed=seed, **overrides)
    tag = "".join(f"-{k[0]}{v}" for k, v in sorted(overrides.items()))
    path = Path(directory) / f"tiny-gemma4-{variant}-{qtype.lower()}-s{seed}{tag}.gguf"
    export_gguf(model, path, qtype)
    if qtype != "F32":
        load_from_gguf(model, path)
    return model, path
