"""The gemma4 fuzz seed's keys and tensors (seeds.write_seed writes them): sliding and global
layers with their own head dims and KV heads, the last two layers sharing the first two's K/V
(with the double-wide MLP), K = V on the global layers, routed experts beside the MLP, per-layer
embeddings, rope_freqs, layer output scales and logit softcapping, in four layers."""

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter

N_LAYER, D_MODEL, N_HEAD, N_FF, MATRIX_TYPE = 4, 64, 2, 64, T.Q4_1
SWA = [True, False, True, False]
KV_HEADS = [2, 1, 2, 1]
HEAD_DIMS = (32, 64)  # sliding, global
N_SHARED, N_PLE = 2, 32
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 4, 2, 32


def _n_ff(il: int) -> int:
    return N_FF * (2 if il >= N_LAYER - N_SHARED else 1)


def add_keys(w: GGUFWriter) -> None:
    """The keys beyond seeds.write_seed's common ones."""
    w.add_feed_forward_length([_n_ff(il) for il in range(N_LAYER)])
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIMS[1])
    w.add_value_length(HEAD_DIMS[1])
    w.add_key_length_swa(HEAD_DIMS[0])
    w.add_value_length_swa(HEAD_DIMS[0])
    w.add_rope_freq_base_swa(10000.0)
    w.add_sliding_window(16)
    w.add_sliding_window_pattern(SWA)
    w.add_shared_kv_layers(N_SHARED)
    w.add_embedding_length_per_layer_input(N_PLE)
    w.add_final_logit_softcapping(30.0)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_feed_forward_length(N_FF_EXP)


def tensors(n_vocab: int, rng) -> list[tuple[str, np.ndarray, T]]:
    """(name, values, type) of every tensor, weights N(0, 1/sqrt(cols)), norms and scales near 1."""
    D, H, L, P, qtype = D_MODEL, N_HEAD, N_LAYER, N_PLE, MATRIX_TYPE

    def matrix(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    dh = HEAD_DIMS[1]  # a quarter of the global heads rotates
    out = [("token_embd.weight", matrix(n_vocab, D), T.Q8_0), ("output_norm.weight", norm(D), T.F32),
           ("rope_freqs.weight", np.array([1.0] * (dh // 8) + [1e30] * (dh // 2 - dh // 8), np.float32), T.F32),
           ("per_layer_token_embd.weight", matrix(n_vocab, L * P), T.Q8_0),
           ("per_layer_model_proj.weight", matrix(L * P, D), T.F16), ("per_layer_proj_norm.weight", norm(P), T.F32)]
    for il in range(L):
        p, hkv, hd, ff = f"blk.{il}.", KV_HEADS[il], HEAD_DIMS[0 if SWA[il] else 1], _n_ff(il)
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
        if il < L - N_SHARED:
            out += [(p + "attn_k.weight", matrix(hkv * hd, D), qtype), (p + "attn_k_norm.weight", norm(hd), T.F32)]
            if SWA[il]:
                out.append((p + "attn_v.weight", matrix(hkv * hd, D), qtype))
    return out
