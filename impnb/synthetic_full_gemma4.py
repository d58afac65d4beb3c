"""A full-size random Gemma-4-26B-A4B GGUF for speed work, through synthetic_full's random blocks.

Names and keys follow llama.cpp's converter (synthetic_gemma4): the router, norms and scales F32,
rope_freqs its fixed factors, scales 1 + noise like the norms. The matrices' types follow
llama-quantize in Q8_0 and Q4_K_M (q4_k_m_type), synthetic_full's FP4 rule in MXFP4 and NVFP4.
"""

import os

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter

from impnb.synthetic import MINIMAL_VOCAB, NORM_STD, add_tokenizer, minimal_tokenizer_metadata
from impnb.synthetic_full import (FILE_TYPES, FP4, TensorSpec, fallback_type, padded_tokenizer, prefetched,
                                  stream_tensors, tensor_data, use_more_bits)
from impnb.synthetic_gemma4 import GLOBAL, SLIDING, Gemma4Shape, add_hparams

# google/gemma-4-26B-A4B's text_config: five sliding layers to one global, K = V on the global
# layers, 128 experts (top 8) beside a dense MLP, no PLE, no KV sharing, output tied to token_embd.
SHAPES = {
    "gemma4-26b-a4b": Gemma4Shape(
        num_hidden_layers=30, hidden_size=2816, intermediate_size=2112, num_attention_heads=16,
        num_key_value_heads=8, num_global_key_value_heads=2, head_dim=256, global_head_dim=512,
        vocab_size=262144, layer_types=tuple(([SLIDING] * 5 + [GLOBAL]) * 5), sliding_window=1024,
        attention_k_eq_v=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
        final_logit_softcapping=30.0, max_position_embeddings=262144),
}
# Tiny shapes of the same writer for the GPU tests (no transformers needed): synthetic_gemma4's
# variants at head dims the GPU attention kernels take, windows far below the prompts.
TINY_SHAPES = {
    "dense": Gemma4Shape(
        num_hidden_layers=6, hidden_size=64, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, num_global_key_value_heads=2, head_dim=64, global_head_dim=128,
        vocab_size=MINIMAL_VOCAB, layer_types=(SLIDING, SLIDING, GLOBAL, SLIDING, SLIDING, GLOBAL),
        sliding_window=8, num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=32,
        final_logit_softcapping=8.0, max_position_embeddings=512),
    "moe": Gemma4Shape(
        num_hidden_layers=4, hidden_size=64, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, num_global_key_value_heads=1, head_dim=64, global_head_dim=128,
        vocab_size=MINIMAL_VOCAB, layer_types=(SLIDING, GLOBAL, SLIDING, GLOBAL), sliding_window=8,
        attention_k_eq_v=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
        final_logit_softcapping=8.0, max_position_embeddings=512),
    # 26B-A4B's attention (heads of 256 and 512, 16 on 8 and 2 KV heads) and routing (128
    # experts, 8 a token) at small widths
    "wide": Gemma4Shape(
        num_hidden_layers=6, hidden_size=256, intermediate_size=192, num_attention_heads=16,
        num_key_value_heads=8, num_global_key_value_heads=2, head_dim=256, global_head_dim=512,
        vocab_size=MINIMAL_VOCAB, layer_types=(SLIDING,) * 5 + (GLOBAL,), sliding_window=16,
        attention_k_eq_v=True, num_experts=128, top_k_experts=8, moe_intermediate_size=64,
        final_logit_softcapping=30.0, max_position_embeddings=4096),
}
QTYPES = ("Q8_0", "Q4_K_M", "MXFP4", "NVFP4")
SCALES = (".scale", "layer_output_scale.weight")  # drawn about 1, as tensor_data draws the norms
# Attention runs at scale 1 on RMS-normed Q and K: with their norms about 1 the scores spread as
# sqrt(head dim) (22 at 512), a near-argmax softmax that moves the logits 10-300x any rounding of
# K (the GPU's fp16 cache), too chaotic to hold a GPU path to the reference. Q's and K's norms
# drawn about head_dim^-1/4 give the scores unit variance, as 1/sqrt(head dim) scaling does.
QK_NORMS = ("attn_q_norm.weight", "attn_k_norm.weight")


def q4_k_m_type(name: str, cols: int, layer: int, n_layer: int, i_attn_v: int, n_attn_v: int,
                n_expert: int) -> T:
    """llama.cpp's llama_tensor_get_type (src/llama-quant.cpp: llama_tensor_get_type_impl, then
    tensor_type_fallback) for LLAMA_FTYPE_MOSTLY_Q4_K_M on gemma4, whose output is tied to
    token_embd (26B-A4B: 128 experts, so none of the n_expert == 8 rules):
      token_embd, per_layer_token_embd   quantized as the output: Q6_K, Q8_0 where cols are no
                   whole Q4_K blocks
      attn_v       Q6_K where use_more_bits(i_attn_v, n_attn_v), i_attn_v counting the attn_v
                   tensors in layer order (the global layers, V = K, have none), else Q4_K;
                   Q8_0 with 8 experts
      attn_k       Q8_0 with 8 experts, else Q4_K
      attn_output  Q5_K with 8 experts, else Q4_K
      ffn_down, ffn_down_exps   Q6_K where use_more_bits(layer, n_layer), else Q4_K
      the rest (attn_q, ffn_gate, ffn_up, ffn_gate_up_exps, inp_gate, proj)   Q4_K
    then a K-quant over cols that are no whole 256 blocks falls back (Q4_K -> Q5_0, Q5_K -> Q5_1,
    Q6_K -> Q8_0): the MLP's 2112 and the experts' 704 columns."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return T.Q6_K if cols % 256 == 0 else T.Q8_0
    if ".attn_v." in name:
        want = T.Q8_0 if n_expert == 8 else T.Q6_K if use_more_bits(i_attn_v, n_attn_v) else T.Q4_K
    elif ".attn_k." in name:
        want = T.Q8_0 if n_expert == 8 else T.Q4_K
    elif ".attn_output." in name:
        want = T.Q5_K if n_expert == 8 else T.Q4_K
    elif ".ffn_down" in name:
        want = T.Q6_K if use_more_bits(layer, n_layer) else T.Q4_K
    else:
        want = T.Q4_K
    return fallback_type(want, cols)


def has_attn_v(shape: Gemma4Shape, i: int) -> bool:
    """Whether layer i has its own V matrix: not KV-shared, and sliding or without K = V."""
    return not shape.is_kv_shared(i) and (shape.is_swa(i) or not shape.attention_k_eq_v)


def matrix_type(shape: Gemma4Shape, qtype: str, name: str, cols: int, layer: int) -> T:
    """The type llama-quantize (Q8_0, Q4_K_M) or synthetic_full's FP4 rule gives a matrix of
    `layer` (0 for the global ones). per_layer_model_proj, which llama-quantize leaves in the
    converter's type, stays Q8_0."""
    if qtype == "Q8_0" or name == "per_layer_model_proj.weight":
        return T.Q8_0
    if qtype in FP4:
        return T.Q8_0 if name == "token_embd.weight" else FP4[qtype]
    n = shape.num_hidden_layers
    i_attn_v = sum(has_attn_v(shape, j) for j in range(layer))
    n_attn_v = sum(has_attn_v(shape, j) for j in range(n))
    return q4_k_m_type(name, cols, layer, n, i_attn_v, n_attn_v, shape.num_experts)


def tensor_specs(shape: Gemma4Shape, qtype: str = "Q8_0") -> list[TensorSpec]:
    """Every tensor llama.cpp's converter writes for `shape`, with its type in `qtype` and std."""
    h, H = shape.hidden_size, shape.num_attention_heads

    def mat(name, dims, layer=0):
        return TensorSpec(name, dims, matrix_type(shape, qtype, name, dims[-1], layer), dims[-1] ** -0.5)

    def vec(name, size, std=NORM_STD):
        return TensorSpec(name, (size,), T.F32, std)

    out = [mat("token_embd.weight", (shape.vocab_size, h)), vec("rope_freqs.weight", shape.global_head_dim // 2)]
    P, L = shape.hidden_size_per_layer_input, shape.num_hidden_layers
    if P:
        out += [mat("per_layer_token_embd.weight", (shape.vocab_size, L * P)),
                mat("per_layer_model_proj.weight", (L * P, h)), vec("per_layer_proj_norm.weight", P)]
    for i in range(shape.num_hidden_layers):
        b, hd, kv = f"blk.{i}.", shape.layer_head_dim(i), shape.kv_heads(i) * shape.layer_head_dim(i)
        out += [vec(b + "attn_norm.weight", h), mat(b + "attn_q.weight", (H * hd, h), i),
                vec(b + "attn_q_norm.weight", hd)]
        if not shape.is_kv_shared(i):
            out += [mat(b + "attn_k.weight", (kv, h), i), vec(b + "attn_k_norm.weight", hd)]
            if has_attn_v(shape, i):
                out.append(mat(b + "attn_v.weight", (kv, h), i))
        ff = shape.n_ff(i)
        out += [mat(b + "attn_output.weight", (h, H * hd), i), vec(b + "post_attention_norm.weight", h),
                vec(b + "ffn_norm.weight", h), mat(b + "ffn_gate.weight", (ff, h), i),
                mat(b + "ffn_up.weight", (ff, h), i), mat(b + "ffn_down.weight", (h, ff), i),
                vec(b + "post_ffw_norm.weight", h), vec(b + "layer_output_scale.weight", 1)]
        if shape.num_experts:
            e, f = shape.num_experts, shape.moe_intermediate_size
            out += [TensorSpec(b + "ffn_gate_inp.weight", (e, h), T.F32, h ** -0.5),
                    vec(b + "ffn_gate_inp.scale", h), vec(b + "ffn_down_exps.scale", e),
                    mat(b + "ffn_gate_up_exps.weight", (e, 2 * f, h), i), mat(b + "ffn_down_exps.weight", (e, h, f), i),
                    vec(b + "pre_ffw_norm_2.weight", h), vec(b + "post_ffw_norm_1.weight", h),
                    vec(b + "post_ffw_norm_2.weight", h)]
        if P:
            out += [mat(b + "inp_gate.weight", (P, h), i), mat(b + "proj.weight", (h, P), i),
                    vec(b + "post_norm.weight", h)]
    return out + [vec("output_norm.weight", h)]


def tensor_values(shape: Gemma4Shape, spec: TensorSpec, seed: int, index: int) -> np.ndarray:
    """synthetic_full's random tensor, but rope_freqs' fixed factors, the scales about 1 and Q's
    and K's norms about head_dim^-1/4 (QK_NORMS)."""
    if spec.name == "rope_freqs.weight":
        return shape.rope_freqs()
    data = tensor_data(spec, seed, index)
    if spec.name.endswith(QK_NORMS):
        return data * np.float32(spec.shape[0] ** -0.25)
    return data + np.float32(1.0) if spec.name.endswith(SCALES) else data


def write_full_gguf(path, shape: Gemma4Shape, qtype: str = "Q8_0", tokenizer_metadata: dict | None = None,
                    seed: int = 0, name: str = "impnb synthetic", workers: int = 2) -> list[TensorSpec]:
    """Write `shape` as a random `qtype` gemma4 GGUF and return its tensors."""
    if qtype not in QTYPES:
        raise ValueError(f"gemma4 full-size files are {' or '.join(QTYPES)}, not {qtype!r}")
    if tokenizer_metadata is None:
        tokenizer_metadata = minimal_tokenizer_metadata(min(shape.vocab_size, MINIMAL_VOCAB))
    specs = tensor_specs(shape, qtype)
    writer = GGUFWriter(os.fspath(path), "gemma4")
    add_hparams(writer, shape, FILE_TYPES[qtype], name)
    add_tokenizer(writer, padded_tokenizer(tokenizer_metadata, shape.vocab_size))
    items = ((shape, s, seed, i) for i, s in enumerate(specs))
    stream_tensors(writer, specs, prefetched(tensor_values, items, workers))
    return specs
