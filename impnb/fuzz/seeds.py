"""Tiny valid GGUFs of every architecture, written in milliseconds with numpy (no torch), to mutate.

Each seed runs end to end on the CPU reference: weights N(0, 1/sqrt(cols)), norms near 1, a
byte-level BPE vocabulary (llama, qwen3, qwen3moe, qwen35moe, gemma4) or a SentencePiece one with byte fallback
(gemma3), a chat template where the architecture has no built-in one, and a mix of tensor
types (F32, F16, Q8_0, Q4_1, Q5_0) so that retyping and NaN scales have blocks to hit.
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFValueType, GGUFWriter, TokenType

from impnb.fuzz import seed_gemma4 as sg
from impnb.synthetic import write_gguf
from impnb.tokenizer import bytes_to_unicode

SEED_ARCHS = ("llama", "qwen3", "qwen3moe", "gemma3", "qwen35moe", "gemma4")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# (layers, d_model, heads, KV heads, head dim, FFN, matrix type)
# Head dims of 64: the smallest the GPU attention kernels take, so the seeds run on both devices.
SIZES = {
    "llama": (2, 128, 2, 1, 64, 128, T.Q8_0),
    "qwen3": (2, 64, 4, 2, 64, 96, T.Q4_1),
    "qwen3moe": (2, 64, 2, 1, 64, 64, T.F16),
    "gemma3": (7, 64, 2, 1, 64, 128, T.Q5_0),  # seven layers: one of them global
    "qwen35moe": (2, 64, 2, 1, 64, 64, T.F16),  # a Gated DeltaNet layer, then a gated attention one
    "gemma4": (sg.N_LAYER, sg.D_MODEL, sg.N_HEAD, 0, 0, sg.N_FF, sg.MATRIX_TYPE),  # per layer: seed_gemma4
}
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 4, 2, 32
# the hybrid's Gated DeltaNet: QK heads, V heads, their dims, the conv kernel; its shared expert's FFN
GDN_HK, GDN_HV, GDN_DK, GDN_DV, GDN_KERNEL, N_FF_SHEXP = 1, 2, 32, 32, 4, 32


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
    if arch in ("llama", "qwen3moe", "qwen35moe"):
        out.append(("output.weight", matrix(n_vocab, D), T.F16))
    for il in range(n_layer):
        p = f"blk.{il}."
        if arch == "qwen35moe":
            out += _hybrid_layer(p, il, matrix, norm)
            continue
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


def _hybrid_layer(p: str, il: int, matrix, norm) -> list[tuple[str, np.ndarray, T]]:
    """A qwen35moe layer: Gated DeltaNet (even il) or gated attention, then routed and shared experts."""
    _, D, H, Hkv, Dh, _, qtype = SIZES["qwen35moe"]
    C, V = 2 * GDN_HK * GDN_DK + GDN_HV * GDN_DV, GDN_HV * GDN_DV
    out = [(p + "attn_norm.weight", norm(D), T.F32), (p + "post_attention_norm.weight", norm(D), T.F32)]
    if il % 2 == 0:
        out += [(p + "attn_qkv.weight", matrix(C, D), qtype), (p + "attn_gate.weight", matrix(V, D), qtype),
                (p + "ssm_beta.weight", matrix(GDN_HV, D), T.F32), (p + "ssm_alpha.weight", matrix(GDN_HV, D), T.F32),
                (p + "ssm_conv1d.weight", matrix(C, GDN_KERNEL), T.F32),
                (p + "ssm_a", -np.exp(norm(GDN_HV)), T.F32), (p + "ssm_dt.bias", norm(GDN_HV) - 1, T.F32),
                (p + "ssm_norm.weight", norm(GDN_DV), T.F32), (p + "ssm_out.weight", matrix(D, V), qtype)]
    else:
        out += [(p + "attn_q.weight", matrix(2 * H * Dh, D), qtype), (p + "attn_k.weight", matrix(Hkv * Dh, D), qtype),
                (p + "attn_v.weight", matrix(Hkv * Dh, D), qtype), (p + "attn_output.weight", matrix(D, H * Dh), qtype),
                (p + "attn_q_norm.weight", norm(Dh), T.F32), (p + "attn_k_norm.weight", norm(Dh), T.F32)]
    return out + [(p + "ffn_gate_inp.weight", matrix(N_EXPERT, D), T.F32),
                  (p + "ffn_gate_exps.weight", matrix(N_EXPERT, N_FF_EXP, D), T.Q8_0),
                  (p + "ffn_up_exps.weight", matrix(N_EXPERT, N_FF_EXP, D), T.Q8_0),
                  (p + "ffn_down_exps.weight", matrix(N_EXPERT, D, N_FF_EXP), T.Q8_0),
                  (p + "ffn_gate_inp_shexp.weight", matrix(1, D), T.F32),
                  (p + "ffn_gate_shexp.weight", matrix(N_FF_SHEXP, D), qtype),
                  (p + "ffn_up_shexp.weight", matrix(N_FF_SHEXP, D), qtype),
                  (p + "ffn_down_shexp.weight", matrix(D, N_FF_SHEXP), T.Q8_0)]


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
        sg.add_keys(w)
    else:
        w.add_feed_forward_length(F)
        w.add_head_count_kv(Hkv)
        w.add_key_length(Dh)
        w.add_value_length(Dh)
    if arch == "gemma3":
        w.add_sliding_window(16)
    if arch in ("qwen3moe", "qwen35moe"):
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_expert_feed_forward_length(N_FF_EXP)
    if arch == "qwen35moe":
        w.add_expert_shared_feed_forward_length(N_FF_SHEXP)
        w.add_ssm_conv_kernel(GDN_KERNEL)
        w.add_ssm_state_size(GDN_DK)
        w.add_ssm_group_count(GDN_HK)
        w.add_ssm_time_step_rank(GDN_HV)
        w.add_ssm_inner_size(GDN_HV * GDN_DV)
        w.add_full_attention_interval(2)
        w.add_rope_dimension_count(Dh // 4)
    _add_keys(w, md)
    rng = np.random.default_rng(seed)
    write_gguf(w, sg.tensors(n_vocab, rng) if arch == "gemma4" else _tensors(arch, n_vocab, rng))
    return Path(path)


def write_seeds(directory) -> dict[str, Path]:
    """arch -> a tiny GGUF of it in directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return {arch: write_seed(arch, directory / f"seed-{arch}.gguf") for arch in SEED_ARCHS}
