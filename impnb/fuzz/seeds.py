"""Tiny valid GGUFs of every architecture, written in milliseconds with numpy (no torch), to mutate.

Each seed runs end to end on the CPU reference: weights N(0, 1/sqrt(cols)), norms near 1, a
byte-level BPE vocabulary (llama, qwen3, qwen3moe) or a SentencePiece one with byte fallback
(gemma3), a chat template where the architecture has no built-in one, and a mix of tensor
types (F32, F16, Q8_0, Q4_1, Q5_0) so that retyping and NaN scales have blocks to hit.
"""

from functools import partial
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFValueType, GGUFWriter, TokenType
from gguf.quants import quantize

from impnb.tokenizer import bytes_to_unicode

SEED_ARCHS = ("llama", "qwen3", "qwen3moe", "gemma3", "gemma4")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# (layers, d_model, heads, KV heads, head dim, FFN, matrix type)
# Head dims of 64: the smallest the GPU attention kernels take, so the seeds run on both devices.
SIZES = {
    "llama": (2, 128, 2, 1, 64, 128, T.Q8_0),
    "qwen3": (2, 64, 4, 2, 64, 96, T.Q4_1),
    "qwen3moe": (2, 64, 2, 1, 64, 64, T.F16),
    "gemma3": (7, 64, 2, 1, 64, 128, T.Q5_0),  # seven layers: one of them global
    "gemma4": (4, 64, 2, 0, 0, 64, T.Q4_1),  # KV heads and head dims: GEMMA4_* below
}
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 4, 2, 32
# gemma4: sliding/global layers with their own head dims and KV heads, the last two layers
# sharing the first two's K/V (with the double-wide MLP), K = V on global layers, routed experts
# beside the MLP, per-layer embeddings of GEMMA4_PLE
GEMMA4_SWA = [True, False, True, False]
GEMMA4_KV_HEADS = [2, 1, 2, 1]
GEMMA4_HEAD_DIMS = (32, 64)  # sliding, global
GEMMA4_SHARED, GEMMA4_PLE = 2, 32


def byte_level_vocab(n_pairs: int = 64) -> dict:
    """gpt2-kind tokenizer keys: two control tokens, the 256 byte symbols, `n_pairs` merged pairs."""
    symbols = list(bytes_to_unicode().values())
    pairs = [(a, b) for a in symbols[64:72] for b in symbols[64:72]][:n_pairs]
    tokens = ["<|im_start|>", "<|im_end|>", *symbols, *(a + b for a, b in pairs)]
    return {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [TokenType.CONTROL] * 2 + [TokenType.NORMAL] * (len(tokens) - 2),
        "tokenizer.ggml.merges": [f"{a} {b}" for a, b in pairs],
        "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": CHATML,
    }


def sentencepiece_vocab() -> dict:
    """llama-kind (SentencePiece BPE, byte fallback) keys as Gemma's: pad, eos, bos, unk, bytes, pieces."""
    pieces = ["\u2581", "\u2581h", "\u2581hi", "e", "l", "o", "\u2581he", "ll", "llo", "\u2581hello"]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{b:02X}>" for b in range(256)), *pieces,
              "<start_of_turn>", "<end_of_turn>"]
    types = ([TokenType.CONTROL] * 3 + [TokenType.UNKNOWN] + [TokenType.BYTE] * 256
             + [TokenType.NORMAL] * len(pieces) + [TokenType.CONTROL] * 2)
    return {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": [-float(i) for i in range(len(tokens))],
        "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
    }


def _add_keys(w: GGUFWriter, md: dict) -> None:
    for key, value in md.items():
        if isinstance(value, list):
            sub = (GGUFValueType.STRING if isinstance(value[0], str) else
                   GGUFValueType.FLOAT32 if isinstance(value[0], float) else GGUFValueType.INT32)
            w.add_key_value(key, [int(v) if sub == GGUFValueType.INT32 else v for v in value],
                            GGUFValueType.ARRAY, sub)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)


def _tensors(arch: str, n_vocab: int, rng) -> list[tuple[str, np.ndarray, T]]:
    n_layer, D, H, Hkv, Dh, F, qtype = SIZES[arch]

    def matrix(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    out = [("token_embd.weight", matrix(n_vocab, D), T.Q8_0), ("output_norm.weight", norm(D), T.F32)]
    if arch in ("llama", "qwen3moe"):
        out.append(("output.weight", matrix(n_vocab, D), T.F16))
    for il in range(n_layer):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", norm(D), T.F32), (p + "ffn_norm.weight", norm(D), T.F32),
                (p + "attn_q.weight", matrix(H * Dh, D), qtype), (p + "attn_k.weight", matrix(Hkv * Dh, D), qtype),
                (p + "attn_v.weight", matrix(Hkv * Dh, D), qtype), (p + "attn_output.weight", matrix(D, H * Dh), qtype)]
        if arch != "llama":
            out += [(p + "attn_q_norm.weight", norm(Dh), T.F32), (p + "attn_k_norm.weight", norm(Dh), T.F32)]
        if arch == "gemma3":
            out += [(p + "post_attention_norm.weight", norm(D), T.F32),
                    (p + "post_ffw_norm.weight", norm(D), T.F32)]
        if arch == "qwen3moe":
            out += [(p + "ffn_gate_inp.weight", matrix(N_EXPERT, D), T.F32),
                    (p + "ffn_gate_exps.weight", matrix(N_EXPERT, N_FF_EXP, D), T.Q8_0),
                    (p + "ffn_up_exps.weight", matrix(N_EXPERT, N_FF_EXP, D), T.Q8_0),
                    (p + "ffn_down_exps.weight", matrix(N_EXPERT, D, N_FF_EXP), T.Q8_0)]
        else:
            out += [(p + "ffn_gate.weight", matrix(F, D), qtype), (p + "ffn_up.weight", matrix(F, D), qtype),
                    (p + "ffn_down.weight", matrix(D, F), T.Q8_0)]
    return out


def _gemma4_tensors(n_vocab: int, rng) -> list[tuple[str, np.ndarray, T]]:
    n_layer, D, H, _, _, F, qtype = SIZES["gemma4"]
    L, P = n_layer, GEMMA4_PLE

    def matrix(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    dh = GEMMA4_HEAD_DIMS[1]
    out = [("token_embd.weight", matrix(n_vocab, D), T.Q8_0), ("output_norm.weight", norm(D), T.F32),
           ("rope_freqs.weight", np.array([1.0] * (dh // 8) + [1e30] * (dh // 2 - dh // 8), np.float32), T.F32),
           ("per_layer_token_embd.weight", matrix(n_vocab, L * P), T.Q8_0),
           ("per_layer_model_proj.weight", matrix(L * P, D), T.F16), ("per_layer_proj_norm.weight", norm(P), T.F32)]
    for il in range(n_layer):
        p, swa, hkv = f"blk.{il}.", GEMMA4_SWA[il], GEMMA4_KV_HEADS[il]
        hd, ff = GEMMA4_HEAD_DIMS[0 if swa else 1], F * (2 if il >= n_layer - GEMMA4_SHARED else 1)
        out += [(p + n + ".weight", norm(D), T.F32) for n in ("attn_norm", "post_attention_norm", "ffn_norm",
                "post_ffw_norm", "pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2", "post_norm")]
        out += [(p + "attn_q.weight", matrix(H * hd, D), qtype), (p + "attn_q_norm.weight", norm(hd), T.F32),
                (p + "attn_output.weight", matrix(D, H * hd), qtype),
                (p + "ffn_gate.weight", matrix(ff, D), qtype), (p + "ffn_up.weight", matrix(ff, D), qtype),
                (p + "ffn_down.weight", matrix(D, ff), T.Q8_0), (p + "layer_output_scale.weight", norm(1), T.F32),
                (p + "ffn_gate_inp.weight", matrix(N_EXPERT, D), T.F32), (p + "ffn_gate_inp.scale", norm(D), T.F32),
                (p + "ffn_gate_up_exps.weight", matrix(N_EXPERT, 2 * N_FF_EXP, D), T.Q8_0),
                (p + "ffn_down_exps.weight", matrix(N_EXPERT, D, N_FF_EXP), T.Q8_0),
                (p + "ffn_down_exps.scale", norm(N_EXPERT), T.F32),
                (p + "inp_gate.weight", matrix(P, D), T.F16), (p + "proj.weight", matrix(D, P), T.Q8_0)]
        if il < n_layer - GEMMA4_SHARED:
            out += [(p + "attn_k.weight", matrix(hkv * hd, D), qtype), (p + "attn_k_norm.weight", norm(hd), T.F32)]
            if swa:
                out.append((p + "attn_v.weight", matrix(hkv * hd, D), qtype))
    return out


def _gemma4_keys(w: GGUFWriter) -> None:
    n_layer, _, _, _, _, F, _ = SIZES["gemma4"]
    w.add_head_count_kv(GEMMA4_KV_HEADS)
    w.add_feed_forward_length([F * (2 if il >= n_layer - GEMMA4_SHARED else 1) for il in range(n_layer)])
    w.add_key_length(GEMMA4_HEAD_DIMS[1])
    w.add_value_length(GEMMA4_HEAD_DIMS[1])
    w.add_key_length_swa(GEMMA4_HEAD_DIMS[0])
    w.add_value_length_swa(GEMMA4_HEAD_DIMS[0])
    w.add_rope_freq_base_swa(10000.0)
    w.add_sliding_window(16)
    w.add_sliding_window_pattern(GEMMA4_SWA)
    w.add_shared_kv_layers(GEMMA4_SHARED)
    w.add_embedding_length_per_layer_input(GEMMA4_PLE)
    w.add_final_logit_softcapping(30.0)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_feed_forward_length(N_FF_EXP)


def write_seed(arch: str, path, seed: int = 0) -> Path:
    """A tiny valid `arch` GGUF at path."""
    n_layer, D, H, Hkv, Dh, F, _ = SIZES[arch]
    md = sentencepiece_vocab() if arch == "gemma3" else byte_level_vocab()
    n_vocab = len(md["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(path), arch)
    w.add_name(f"impnb fuzz seed {arch}")
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_head_count(H)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if arch == "gemma4":
        _gemma4_keys(w)
    else:
        w.add_feed_forward_length(F)
        w.add_head_count_kv(Hkv)
        w.add_key_length(Dh)
        w.add_value_length(Dh)
    if arch == "gemma3":
        w.add_sliding_window(16)
    if arch == "qwen3moe":
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_expert_feed_forward_length(N_FF_EXP)
    _add_keys(w, md)
    make = _gemma4_tensors if arch == "gemma4" else partial(_tensors, arch)
    for name, array, qtype in make(n_vocab, np.random.default_rng(seed)):
        if qtype == T.F32:
            w.add_tensor(name, array)
        elif qtype == T.F16:
            w.add_tensor(name, array.astype(np.float16))
        else:
            w.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_seeds(directory) -> dict[str, Path]:
    """arch -> a tiny GGUF of it in directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return {arch: write_seed(arch, directory / f"seed-{arch}.gguf") for arch in SEED_ARCHS}
