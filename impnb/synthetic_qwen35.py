"""Tiny random Qwen3.5 / Qwen3.5-MoE / Qwen3-Next hybrids from HF transformers, written to GGUF as
llama.cpp's converter does (conversion/qwen.py: Qwen3NextModel and its Qwen3.5 subclasses):
zero-centred RMSNorm weights stored + 1 (not the gated ssm_norm), ssm_a = -exp(A_log), dt_bias as
ssm_dt.bias, conv weights squeezed to (C, K), qwen3next's in_proj_qkvz split into attn_qkv and
attn_gate (in_proj_ba kept fused as ssm_ba), and for qwen35 / qwen35moe the V heads reordered from
grouped (by QK head) to tiled when the QK and V head counts differ.
"""

import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_VERSION

from impnb.synthetic import MINIMAL_VOCAB, QTYPES, add_tokenizer, minimal_tokenizer_metadata, write_gguf

ARCHS = ("qwen35", "qwen35moe", "qwen3next")
ATTENTION_INTERVAL = 2  # every second layer full attention, so a few layers hold both kinds twice
NORM_STD = 0.1

_HF_ARCH = {"qwen3_5_text": "qwen35", "qwen3_5_moe_text": "qwen35moe", "qwen3_next": "qwen3next"}
# Sizes the GPU kernels take (tests/gpu): attention head dim 256 with RoPE on 64 (Qwen3.6's), DeltaNet
# K / V head dims multiples of 32 (dk != dv still), every row whole Q8_0 blocks.
GPU_SIZES = dict(hidden_size=256, head_dim=256, linear_key_head_dim=64, linear_value_head_dim=32)
GPU_FFN = dict(intermediate_size=128, moe_intermediate_size=64, shared_expert_intermediate_size=128)
GPU_MROPE = [11, 11, 10]  # the text's sections of the 32 rotated pairs


def tiny_config(arch: str, vocab_size: int, gpu: bool = False):
    """A 4-layer config: 2 QK heads and 4 V heads (so qwen35's V-head reorder matters), dk != dv,
    gated attention with 4 Q / 2 KV heads of 32 and RoPE on 8 dims; `gpu`: GPU_SIZES instead."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3NextConfig

    common = dict(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, rms_norm_eps=1e-6,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=24,
        linear_num_key_heads=2, linear_num_value_heads=4, hidden_act="silu",
        full_attention_interval=ATTENTION_INTERVAL, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=64)
    dense, mrope = 96, [2, 1, 1]
    if gpu:
        common.update(GPU_SIZES)
        moe.update(moe_intermediate_size=GPU_FFN["moe_intermediate_size"],
                   shared_expert_intermediate_size=GPU_FFN["shared_expert_intermediate_size"])
        dense, mrope = GPU_FFN["intermediate_size"], GPU_MROPE
    if arch == "qwen35":
        return Qwen3_5TextConfig(**common, intermediate_size=dense,
                                 rope_parameters={**rope, "mrope_section": mrope})
    if arch == "qwen35moe":
        return Qwen3_5MoeTextConfig(**common, **moe, rope_parameters={**rope, "mrope_section": mrope})
    if arch == "qwen3next":
        return Qwen3NextConfig(**common, **moe, intermediate_size=dense, rope_parameters=rope,
                               norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    raise ValueError(f"arch {arch!r} is not one of {ARCHS}")


def build_hf_model(arch: str, vocab_size: int, seed: int = 0, gpu: bool = False):
    """The float32 HF model, every parameter drawn from `seed`: matrices N(0, 1/fan_in), the conv
    N(0, 1/K), zero-centred norms 0.1 N(0, 1), the gated norm 1 + 0.1 N(0, 1), A_log log U(0.5, 8),
    dt_bias N(0, 1); no default init survives to hide a bug."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM

    cls = {"qwen35": Qwen3_5ForCausalLM, "qwen35moe": Qwen3_5MoeForCausalLM,
           "qwen3next": Qwen3NextForCausalLM}[arch]
    torch.manual_seed(seed)
    model = cls(tiny_config(arch, vocab_size, gpu)).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("A_log"):
                value = torch.log(0.5 + 7.5 * torch.rand(p.shape, generator=gen))
            elif name.endswith("dt_bias"):
                value = noise
            elif name.endswith("linear_attn.norm.weight"):
                value = 1.0 + NORM_STD * noise
            elif p.ndim == 1:
                value = NORM_STD * noise
            else:  # the last axis is the fan-in (the kernel for the conv, the hidden size for experts)
                value = noise / p.shape[-1] ** 0.5
            p.copy_(value)
    return model


def gguf_arch(model) -> str:
    arch = _HF_ARCH.get(model.config.model_type)
    if arch is None:
        raise ValueError(f"model_type {model.config.model_type!r} is not a Qwen3.5 / Qwen3-Next text model")
    return arch


def tiled(x: np.ndarray, axis: int, n_k: int, n_v: int, head_dim: int) -> np.ndarray:
    """V heads along `axis` from grouped (QK head major) to tiled (QK head minor) order."""
    shape = x.shape
    split = x.reshape(*shape[:axis], n_k, n_v // n_k, head_dim, *shape[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(split, axis, axis + 1).reshape(shape))


def deltanet_tensors(attn, config, arch: str, blk: str, legacy: bool = False) -> list[tuple[str, np.ndarray]]:
    """A linear_attn module's GGUF tensors (`legacy`: qwen3next's fused ssm_in of older converters)."""
    n_k, n_v = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    qk = 2 * n_k * dk
    conv = f32(attn.conv1d.weight)[:, 0]  # (C, 1, K) -> (C, K)
    a, dt, norm, out = -np.exp(f32(attn.A_log)), f32(attn.dt_bias), f32(attn.norm.weight), f32(attn.out_proj.weight)
    if arch == "qwen3next" and legacy:  # older converters: in_proj_qkvz as it is
        return [(f"{blk}.ssm_in.weight", f32(attn.in_proj_qkvz.weight)),
                (f"{blk}.ssm_ba.weight", f32(attn.in_proj_ba.weight)),
                (f"{blk}.ssm_conv1d.weight", conv), (f"{blk}.ssm_a", a), (f"{blk}.ssm_dt.bias", dt),
                (f"{blk}.ssm_norm.weight", norm), (f"{blk}.ssm_out.weight", out)]
    if arch == "qwen3next":
        # in_proj_qkvz: [q, k, v, z] a QK head -> Q of every head, K, V (grouped), and Z alone
        qkvz = f32(attn.in_proj_qkvz.weight).reshape(n_k, -1, config.hidden_size)
        q, k, v, z = np.split(qkvz, np.cumsum([dk, dk, n_v // n_k * dv]), axis=1)
        qkv = np.concatenate([x.reshape(-1, config.hidden_size) for x in (q, k, v)])
        gate = np.ascontiguousarray(z.reshape(-1, config.hidden_size))
        return [(f"{blk}.attn_qkv.weight", qkv), (f"{blk}.attn_gate.weight", gate),
                (f"{blk}.ssm_ba.weight", f32(attn.in_proj_ba.weight)),
                (f"{blk}.ssm_conv1d.weight", conv), (f"{blk}.ssm_a", a), (f"{blk}.ssm_dt.bias", dt),
                (f"{blk}.ssm_norm.weight", norm), (f"{blk}.ssm_out.weight", out)]
    qkv, gate = f32(attn.in_proj_qkv.weight), f32(attn.in_proj_z.weight)
    b, alpha = f32(attn.in_proj_b.weight), f32(attn.in_proj_a.weight)
    if n_k != n_v:
        qkv = np.concatenate([qkv[:qk], tiled(qkv[qk:], 0, n_k, n_v, dv)])
        conv = np.concatenate([conv[:qk], tiled(conv[qk:], 0, n_k, n_v, dv)])
        gate, out = tiled(gate, 0, n_k, n_v, dv), tiled(out, 1, n_k, n_v, dv)
        b, alpha, a, dt = (tiled(x, 0, n_k, n_v, 1) for x in (b, alpha, a, dt))
    return [(f"{blk}.attn_qkv.weight", qkv), (f"{blk}.attn_gate.weight", gate),
            (f"{blk}.ssm_beta.weight", b), (f"{blk}.ssm_alpha.weight", alpha),
            (f"{blk}.ssm_conv1d.weight", conv), (f"{blk}.ssm_a", a), (f"{blk}.ssm_dt.bias", dt),
            (f"{blk}.ssm_norm.weight", norm), (f"{blk}.ssm_out.weight", out)]


def f32(t) -> np.ndarray:
    return t.detach().to("cpu").float().numpy().copy()


def ffn_tensors(mlp, blk: str) -> list[tuple[str, np.ndarray]]:
    """A dense MLP's or a sparse MoE block's (routed experts stacked, shared expert) GGUF tensors."""
    if not hasattr(mlp, "experts"):
        return [(f"{blk}.ffn_gate.weight", f32(mlp.gate_proj.weight)),
                (f"{blk}.ffn_up.weight", f32(mlp.up_proj.weight)),
                (f"{blk}.ffn_down.weight", f32(mlp.down_proj.weight))]
    gate_up = f32(mlp.experts.gate_up_proj)  # (E, 2I, H): gate rows, then up rows
    n_ff = gate_up.shape[1] // 2
    shared = mlp.shared_expert
    return [(f"{blk}.ffn_gate_inp.weight", f32(mlp.gate.weight)),
            (f"{blk}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :n_ff])),
            (f"{blk}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, n_ff:])),
            (f"{blk}.ffn_down_exps.weight", f32(mlp.experts.down_proj)),
            (f"{blk}.ffn_gate_inp_shexp.weight", f32(mlp.shared_expert_gate.weight)),
            (f"{blk}.ffn_gate_shexp.weight", f32(shared.gate_proj.weight)),
            (f"{blk}.ffn_up_shexp.weight", f32(shared.up_proj.weight)),
            (f"{blk}.ffn_down_shexp.weight", f32(shared.down_proj.weight))]


def gguf_tensors(model, legacy: bool = False) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array in numpy order) for every tensor the converter writes."""
    arch, config, inner = gguf_arch(model), model.config, model.model
    out = [("token_embd.weight", f32(inner.embed_tokens.weight))]
    for i, layer in enumerate(inner.layers):
        blk = f"blk.{i}"
        out.append((f"{blk}.attn_norm.weight", f32(layer.input_layernorm.weight) + 1))
        if hasattr(layer, "linear_attn"):
            out += deltanet_tensors(layer.linear_attn, config, arch, blk, legacy)
        else:
            attn = layer.self_attn
            out += [(f"{blk}.attn_q.weight", f32(attn.q_proj.weight)),  # [q, gate] a head, as HF
                    (f"{blk}.attn_k.weight", f32(attn.k_proj.weight)),
                    (f"{blk}.attn_v.weight", f32(attn.v_proj.weight)),
                    (f"{blk}.attn_output.weight", f32(attn.o_proj.weight)),
                    (f"{blk}.attn_q_norm.weight", f32(attn.q_norm.weight) + 1),
                    (f"{blk}.attn_k_norm.weight", f32(attn.k_norm.weight) + 1)]
        out.append((f"{blk}.post_attention_norm.weight", f32(layer.post_attention_layernorm.weight) + 1))
        out += ffn_tensors(layer.mlp, blk)
    out.append(("output_norm.weight", f32(inner.norm.weight) + 1))
    out.append(("output.weight", f32(model.lm_head.weight)))
    return out


def tensor_qtype(name: str, array: np.ndarray, qtype: str) -> GGMLQuantizationType:
    """The converter's rule: 1-D tensors, norms, routers and the conv stay F32."""
    if (qtype == "F32" or array.ndim <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp" in name
            or ".ssm_conv1d." in name):
        return GGMLQuantizationType.F32
    return GGMLQuantizationType.Q8_0


def add_hparams(writer: GGUFWriter, config, arch: str, file_type, name: str) -> None:
    """TextModel + Qwen2MoeModel + Qwen3NextModel (+ the Qwen3.5 M-RoPE mixin) set_gguf_parameters,
    for a transformers config or anything with its attribute names (synthetic_full.Shape)."""
    writer.add_type("model")
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    if getattr(config, "intermediate_size", None):
        writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_file_type(file_type)
    if arch != "qwen35":
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    writer.add_ssm_conv_kernel(config.linear_conv_kernel_dim)
    writer.add_ssm_state_size(config.linear_key_head_dim)
    writer.add_ssm_group_count(config.linear_num_key_heads)
    writer.add_ssm_time_step_rank(config.linear_num_value_heads)
    writer.add_ssm_inner_size(config.linear_value_head_dim * config.linear_num_value_heads)
    writer.add_full_attention_interval(config.layer_types.index("full_attention") + 1)
    writer.add_rope_dimension_count(int(config.head_dim * config.rope_parameters["partial_rotary_factor"]))
    if arch != "qwen3next":
        writer.add_rope_dimension_sections([*config.rope_parameters["mrope_section"], 0])
    writer.add_quantization_version(GGML_QUANT_VERSION)


def export_gguf(model, path, qtype: str = "F32", drop=(), config=None, legacy: bool = False,
                tokenizer_metadata: dict | None = None) -> None:
    """Write `model` to `path` with a minimal tokenizer (or tokenizer_metadata's), F32 or Q8_0 as the
    converter does (`legacy`: qwen3next's ssm_in as older converters wrote it). For broken files
    in tests: `drop` leaves out tensors by GGUF name, `config` writes another config's keys."""
    if qtype not in ("F32", "Q8_0"):
        raise ValueError(f"qtype {qtype!r} is not F32 or Q8_0")
    arch, config = gguf_arch(model), config or model.config
    writer = GGUFWriter(os.fspath(path), arch)
    add_hparams(writer, config, arch, QTYPES[qtype], f"impnb tiny {arch}")
    add_tokenizer(writer, tokenizer_metadata or minimal_tokenizer_metadata(config.vocab_size))
    write_gguf(writer, ((name, array, tensor_qtype(name, array, qtype))
                        for name, array in gguf_tensors(model, legacy) if name not in drop))


def tiny_gguf(arch: str, qtype: str, directory, seed: int = 0, gpu: bool = False,
              tokenizer_metadata: dict | None = None):
    """(hf_model, gguf_path) with the file at `directory`/tiny-{arch}-{qtype}-s{seed}.gguf
    (`gpu`: GPU_SIZES, tiny-gpu-...); the vocabulary tokenizer_metadata's, else MINIMAL_VOCAB."""
    path = Path(directory) / f"tiny-{'gpu-' if gpu else ''}{arch}-{qtype.lower()}-s{seed}.gguf"
    vocab = len(tokenizer_metadata["tokenizer.ggml.tokens"]) if tokenizer_metadata else MINIMAL_VOCAB
    model = build_hf_model(arch, vocab, seed, gpu)
    export_gguf(model, path, qtype, tokenizer_metadata=tokenizer_metadata)
    return model, path
