"""Tiny random Qwen3 / Qwen3-MoE models from HF transformers, written to GGUF as llama.cpp's converter does."""

import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType, TokenType
from gguf.constants import GGML_QUANT_VERSION
from gguf.quants import quantize

from impnb import quant_fp4
from impnb.gguf_file import open_model_file

ARCHS = ("qwen3", "qwen3moe")
# Q8_0_V_Q4_1: Q8_0 with each layer's attn_v Q4_1, as a Q4_K_M's Q6_K V (matrices of mixed types);
# MXFP4 / NVFP4: the layers' matrices in that type (impnb/quant_fp4.py encodes them), token_embd
# and output Q8_0, and Q8_0 where a row is not whole FP4 blocks (as llama.cpp's quantize falls back)
QTYPES = {"F32": LlamaFileType.ALL_F32, "Q8_0": LlamaFileType.MOSTLY_Q8_0,
          "Q8_0_V_Q4_1": LlamaFileType.MOSTLY_Q8_0,
          "MXFP4": LlamaFileType.MOSTLY_MXFP4_MOE, "NVFP4": LlamaFileType.MOSTLY_NVFP4}
FP4_TYPES = {"MXFP4": GGMLQuantizationType.MXFP4, "NVFP4": GGMLQuantizationType.NVFP4}
MINIMAL_VOCAB = 512
MATRIX_STD = 0.02
NORM_STD = 0.1

_HF_ARCH = {"qwen3": "qwen3", "qwen3_moe": "qwen3moe"}  # config.model_type -> GGUF arch

# Element types of the tokenizer arrays, as llama.cpp's gguf.SpecialVocab / add_token_* write them.
_TOKENIZER_ARRAYS = {
    "tokenizer.ggml.tokens": GGUFValueType.STRING,
    "tokenizer.ggml.merges": GGUFValueType.STRING,
    "tokenizer.ggml.token_type": GGUFValueType.INT32,
    "tokenizer.ggml.scores": GGUFValueType.FLOAT32,
}


def tiny_config(arch: str, vocab_size: int, seed: int = 0, moe_ff: int = 32):
    """A transformers config of a few layers; `seed` is unused (the shapes are fixed) and kept so
    every helper here takes the same arguments. qwen3 ties its output to token_embd, qwen3moe does not."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, hidden_act="silu",
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    if arch == "qwen3":
        # head_dim * heads (256) != hidden (64): the file's key_length must be honoured; 64 is a
        # head dim the GPU attention kernels take.
        return Qwen3Config(**common, num_hidden_layers=3, head_dim=64, tie_word_embeddings=True)
    if arch == "qwen3moe":
        return Qwen3MoeConfig(**common, num_hidden_layers=2, head_dim=64, tie_word_embeddings=False,
                              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=moe_ff,
                              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    raise ValueError(f"arch {arch!r} is not one of {ARCHS}")


def build_hf_model(arch: str, vocab_size: int, seed: int = 0, moe_ff: int = 32):
    """Qwen3ForCausalLM / Qwen3MoeForCausalLM in float32, eval mode, re-initialised from `seed`:
    matrices N(0, 0.02), norm weights 1 + 0.1 N(0, 1) so that no norm is the identity."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, vocab_size, seed, moe_ff)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):  # tied weights appear once
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(1.0 + NORM_STD * noise if p.ndim == 1 else MATRIX_STD * noise)
    return model


def gguf_arch(model) -> str:
    arch = _HF_ARCH.get(model.config.model_type)
    if arch is None:
        raise ValueError(f"model_type {model.config.model_type!r} is not qwen3 or qwen3_moe")
    return arch


def gguf_tensors(model) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array in numpy order) for every tensor llama.cpp's converter writes.

    Q and K rows keep HF's order: llama.cpp runs qwen3/qwen3moe with NeoX RoPE (rotate-half
    pairs d and d + D/2), which is HF's layout, so unlike `llama` nothing is permuted.
    Experts are stacked: ffn_gate_exps/ffn_up_exps (E, I, H), ffn_down_exps (E, H, I).
    """
    def f32(t):
        return t.detach().to("cpu").float().numpy().copy()

    inner = model.model
    out = [("token_embd.weight", f32(inner.embed_tokens.weight))]
    for i, layer in enumerate(inner.layers):
        attn, mlp, blk = layer.self_attn, layer.mlp, f"blk.{i}"
        out += [
            (f"{blk}.attn_norm.weight", f32(layer.input_layernorm.weight)),
            (f"{blk}.attn_q.weight", f32(attn.q_proj.weight)),
            (f"{blk}.attn_k.weight", f32(attn.k_proj.weight)),
            (f"{blk}.attn_v.weight", f32(attn.v_proj.weight)),
            (f"{blk}.attn_output.weight", f32(attn.o_proj.weight)),
            (f"{blk}.attn_q_norm.weight", f32(attn.q_norm.weight)),
            (f"{blk}.attn_k_norm.weight", f32(attn.k_norm.weight)),
            (f"{blk}.ffn_norm.weight", f32(layer.post_attention_layernorm.weight)),
        ]
        if hasattr(mlp, "experts"):
            gate_up = f32(mlp.experts.gate_up_proj)  # (E, 2I, H): gate rows, then up rows
            n_ff = gate_up.shape[1] // 2
            out += [
                (f"{blk}.ffn_gate_inp.weight", f32(mlp.gate.weight)),
                (f"{blk}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :n_ff])),
                (f"{blk}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, n_ff:])),
                (f"{blk}.ffn_down_exps.weight", f32(mlp.experts.down_proj)),
            ]
        else:
            out += [
                (f"{blk}.ffn_gate.weight", f32(mlp.gate_proj.weight)),
                (f"{blk}.ffn_up.weight", f32(mlp.up_proj.weight)),
                (f"{blk}.ffn_down.weight", f32(mlp.down_proj.weight)),
            ]
    out.append(("output_norm.weight", f32(inner.norm.weight)))
    if not model.config.tie_word_embeddings:
        out.append(("output.weight", f32(model.lm_head.weight)))
    return out


def tensor_qtype(name: str, array: np.ndarray, qtype: str) -> GGMLQuantizationType:
    """The type llama.cpp's converter gives a tensor: 1-D, norms and the router stay F32."""
    if qtype == "F32" or array.ndim <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp." in name:
        return GGMLQuantizationType.F32
    if qtype == "Q8_0_V_Q4_1" and ".attn_v." in name:
        return GGMLQuantizationType.Q4_1
    fp4 = FP4_TYPES.get(qtype)
    if fp4 and name.startswith("blk.") and array.shape[-1] % quant_fp4.FP4_FORMATS[fp4].block == 0:
        return fp4
    return GGMLQuantizationType.Q8_0


def minimal_tokenizer_metadata(vocab_size: int) -> dict:
    """A gpt2 (byte-level BPE) vocabulary of `vocab_size` tokens that transformers and impnb load:
    <|endoftext|> (control), the 256 byte symbols, then two-symbol tokens with their merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    n_pairs = vocab_size - 1 - len(symbols)
    if not 0 <= n_pairs <= len(symbols) ** 2:
        raise ValueError(f"a minimal tokenizer needs {len(symbols) + 1} to {len(symbols) ** 2} tokens")
    pairs = [(a, b) for a in symbols for b in symbols][:n_pairs]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": ["<|endoftext|>", *symbols, *(a + b for a, b in pairs)],
        "tokenizer.ggml.token_type": [TokenType.CONTROL] + [TokenType.NORMAL] * (vocab_size - 1),
        "tokenizer.ggml.merges": [f"{a} {b}" for a, b in pairs],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": False,
    }


def tokenizer_metadata_from(path) -> dict:
    """The `tokenizer.*` keys of a GGUF (e.g. SmolLM2's) as Python values."""
    md = open_model_file(path).metadata
    return {k: v for k, v in md.items() if k.startswith("tokenizer.")}


def add_tokenizer(writer: GGUFWriter, metadata: dict) -> None:
    """Write the `tokenizer.*` keys of `metadata` with llama.cpp's value types."""
    for key, value in metadata.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(value, list):
            sub = _TOKENIZER_ARRAYS.get(key) or GGUFValueType.get_type(value[0])
            writer.add_key_value(key, [int(v) if sub == GGUFValueType.INT32 else v for v in value],
                                 GGUFValueType.ARRAY, sub)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)  # token ids and counts are UINT32 in llama.cpp files
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, value)


def add_hparams(writer: GGUFWriter, config, arch: str, file_type: LlamaFileType, name: str) -> None:
    """llama.cpp's TextModel + Qwen2MoeModel set_gguf_parameters for these configs (a transformers
    config or anything with its attribute names)."""
    writer.add_type("model")
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if arch == "qwen3moe":
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_file_type(file_type)
    if arch == "qwen3moe":
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_quantization_version(GGML_QUANT_VERSION)


def export_gguf(model, path, qtype: str = "F32", tokenizer_metadata: dict | None = None) -> None:
    """Write `model` to `path` as llama.cpp's converter does with `--outtype f32` or `q8_0`."""
    if qtype not in QTYPES:
        raise ValueError(f"qtype {qtype!r} is not one of {list(QTYPES)}")
    arch, config = gguf_arch(model), model.config
    if tokenizer_metadata is None:
        tokenizer_metadata = minimal_tokenizer_metadata(config.vocab_size)
    n_tokens = len(tokenizer_metadata["tokenizer.ggml.tokens"])
    if n_tokens != config.vocab_size:
        raise ValueError(f"tokenizer has {n_tokens} tokens, the model's vocab_size is {config.vocab_size}")
    writer = GGUFWriter(os.fspath(path), arch)
    add_hparams(writer, config, arch, QTYPES[qtype], f"impnb tiny {arch}")
    add_tokenizer(writer, tokenizer_metadata)
    write_gguf(writer, ((name, array, tensor_qtype(name, array, qtype)) for name, array in gguf_tensors(model)))


def write_gguf(writer: GGUFWriter, tensors) -> None:
    """Add (name, float32 array, GGML type) tensors, each encoded as its type (F32 and F16 as
    arrays, FP4 by impnb.quant_fp4, the rest by gguf.quants), and write the file."""
    for name, array, ttype in tensors:
        if ttype == GGMLQuantizationType.F32:
            writer.add_tensor(name, np.ascontiguousarray(array, np.float32))
        elif ttype == GGMLQuantizationType.F16:
            writer.add_tensor(name, np.asarray(array).astype(np.float16))
        else:
            encode = quant_fp4.quantize if ttype in quant_fp4.FP4_FORMATS else quantize
            data = encode(array.reshape(-1, array.shape[-1]), ttype).reshape(*array.shape[:-1], -1)
            writer.add_tensor(name, data, raw_dtype=ttype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make_tiny_gguf(arch: str, qtype: str, path, tokenizer_metadata: dict | None = None, seed: int = 0,
                   moe_ff: int = 32):
    """Build a tiny model (vocab from the tokenizer, else MINIMAL_VOCAB), write it, return the HF model."""
    vocab = len(tokenizer_metadata["tokenizer.ggml.tokens"]) if tokenizer_metadata else MINIMAL_VOCAB
    model = build_hf_model(arch, vocab, seed, moe_ff)
    export_gguf(model, path, qtype, tokenizer_metadata)
    return model


def tiny_gguf(arch: str, qtype: str, directory, tokenizer_metadata: dict | None = None, seed: int = 0,
              moe_ff: int = 32):
    """(hf_model, gguf_path) with the file at `directory`/tiny-{arch}-{qtype}-s{seed}.gguf; moe_ff:
    qwen3moe's expert width (64 splits into whole 32-column groups over two GPUs)."""
    wide = f"-f{moe_ff}" if moe_ff != 32 else ""
    path = Path(directory) / f"tiny-{arch}-{qtype.lower()}-s{seed}{wide}.gguf"
    return make_tiny_gguf(arch, qtype, path, tokenizer_metadata, seed, moe_ff), path


def hf_from_gguf(path):
    """transformers' float32 model from a GGUF, with the two sizes its qwen3 loader does not read
    (`qwen3.attention.key_length` -> head_dim, `qwen3moe.expert_feed_forward_length` ->
    moe_intermediate_size) passed from the file; without them it falls back to 128 and 768."""
    import torch
    from transformers import AutoModelForCausalLM

    mf = open_model_file(path)
    sizes = {"head_dim": mf.require("attention.key_length")}
    if mf.arch == "qwen3moe":
        sizes["moe_intermediate_size"] = mf.require("expert_feed_forward_length")
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    return AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32,
                                                **sizes).eval()
