"""Tiny random llama / gemma3 GGUFs written straight from numpy (no torch), for the engine's tests:
a byte-level tokenizer of 256 bytes, an end-of-text token and one merge, two layers, a short context."""

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

from impnb.tokenizer import bytes_to_unicode

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 32, 4, 2, 16, 48
N_LAYER = 2
N_CTX = 256
SLIDING_WINDOW = 12  # gemma3's local layers: short, so that tests cross it
EOT = 256  # the end-of-text token's id


def tokenizer_metadata() -> dict:
    symbols = list(bytes_to_unicode().values())
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": [*symbols, "<|endoftext|>", "\u0120t"],
        "tokenizer.ggml.token_type": [int(TokenType.NORMAL)] * 256 + [int(TokenType.CONTROL),
                                                                    int(TokenType.NORMAL)],
        "tokenizer.ggml.merges": ["\u0120 t"],
        "tokenizer.ggml.eos_token_id": EOT,
    }


def write_tiny_model(directory, arch: str = "llama", seed: int = 0) -> Path:
    """directory/tiny-{arch}-s{seed}.gguf: F32 weights N(0, 1) (norms 1 + 0.1 N(0, 1))."""
    path = Path(directory) / f"tiny-{arch}-s{seed}.gguf"
    rng = np.random.default_rng(seed)
    md = tokenizer_metadata()
    V = len(md["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(path), arch)
    for key, value in {"block_count": N_LAYER, "context_length": N_CTX, "embedding_length": N_EMBD,
                       "feed_forward_length": N_FF, "attention.head_count": N_HEAD,
                       "attention.head_count_kv": N_HEAD_KV, "attention.key_length": HEAD_DIM,
                       "attention.value_length": HEAD_DIM}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    if arch == "gemma3":
        w.add_uint32("gemma3.attention.sliding_window", SLIDING_WINDOW)
    for key, value in md.items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_uint32(key, value)

    def matrix(*shape):
        return (1.0 * rng.standard_normal(shape)).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", matrix(V, N_EMBD))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "attn_q.weight", matrix(N_HEAD * HEAD_DIM, N_EMBD))
        w.add_tensor(p + "attn_k.weight", matrix(N_HEAD_KV * HEAD_DIM, N_EMBD))
        w.add_tensor(p + "attn_v.weight", matrix(N_HEAD_KV * HEAD_DIM, N_EMBD))
        w.add_tensor(p + "attn_output.weight", matrix(N_EMBD, N_HEAD * HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", matrix(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", matrix(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", matrix(N_EMBD, N_FF))
        if arch == "gemma3":
            for name in ("attn_q_norm", "attn_k_norm"):
                w.add_tensor(p + name + ".weight", norm(HEAD_DIM))
            for name in ("post_attention_norm", "post_ffw_norm"):
                w.add_tensor(p + name + ".weight", norm(N_EMBD))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    # an output matrix of its own: tied to gemma3's scaled embedding, the model repeats its input
    w.add_tensor("output.weight", matrix(V, N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
