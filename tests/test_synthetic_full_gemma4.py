"""The full-size Gemma-4-26B-A4B generator on a scaled-down copy of its shape: the file validates,
rope_freqs holds the converter's factors, scales sit about 1, and the numpy reference runs to
finite, spread-out logits; Q4_K_M gives each tensor the type llama-quantize gives it."""

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from impnb import synthetic_full_gemma4 as sg
from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.models.validate import validate_model

pytest.importorskip("transformers")  # the minimal tokenizer's byte symbols

FULL = sg.SHAPES["gemma4-26b-a4b"]
SMALL = dataclasses.replace(
    FULL, num_hidden_layers=6, layer_types=FULL.layer_types[:6], hidden_size=256, intermediate_size=192,
    num_attention_heads=4, num_key_value_heads=2, num_global_key_value_heads=1, head_dim=64,
    global_head_dim=128, vocab_size=1000, num_experts=8, top_k_experts=2, moe_intermediate_size=64,
    sliding_window=16)


def test_published_shape():
    assert FULL.layer_types.count(sg.GLOBAL) == 5 and FULL.layer_types[5] == sg.GLOBAL
    assert (FULL.num_experts, FULL.top_k_experts, FULL.moe_intermediate_size) == (128, 8, 704)
    n_params = sum(int(np.prod(s.shape)) for s in sg.tensor_specs(FULL))
    assert 25.0e9 < n_params < 26.5e9, n_params


def test_scaled_down_file_runs(tmp_path):
    path = tmp_path / "g4.gguf"
    specs = sg.write_full_gguf(path, SMALL)
    model = load_reference(open_model_file(path))
    assert {s.name.removesuffix(".weight") for s in specs} == set(model.ops.w)
    w = model.ops.w
    assert np.array_equal(w["rope_freqs"], SMALL.rope_freqs())
    assert "blk.5.attn_v" not in w and "blk.4.attn_v" in w  # K = V on the global layer
    assert abs(w["blk.0.ffn_down_exps.scale"].mean() - 1) < 0.1
    logits = model.forward(np.arange(40), model.new_cache(64))
    assert np.isfinite(logits).all() and 0.3 < logits.std() < 3


@pytest.mark.parametrize("variant", sorted(sg.TINY_SHAPES))
def test_tiny_models_tolerate_an_fp16_cache(tmp_path, variant):
    """The GPU tests' tiny models (96 tokens, past the window, KV-shared layers, heads of 512)
    move by less than 2e-3 of their largest logit when K/V are rounded to fp16, as the GPU's cache
    holds them (up to 1.02e-3 measured, the figure moving with the CPU's BLAS kernels): attention
    at scale 1 over Q and K normed about 1 spreads the scores as sqrt(head dim), and that
    near-argmax softmax moved them by 3e-3 (dense) to 7e-2 (wide)."""
    path = tmp_path / f"{variant}.gguf"
    sg.write_full_gguf(path, sg.TINY_SHAPES[variant], seed=3, workers=1)
    model = load_reference(open_model_file(path))
    ids = np.random.default_rng(5).integers(0, model.cfg.n_vocab, 96)
    ref = model.forward(ids, model.new_cache(104))
    cache, cfg = model.new_cache(104), model.cfg
    for il in range(cfg.n_layer):  # fp16 arrays: every write rounds; shared layers keep their source's
        src = cfg.kv_layer(il)
        cache.k[il], cache.v[il] = ((cache.k[il].astype(np.float16), cache.v[il].astype(np.float16)) if src == il
                                    else (cache.k[src], cache.v[src]))
    fp16 = model.forward(ids, cache)
    rel = np.abs(fp16 - ref).max(-1) / np.abs(ref).max()
    assert rel.max() < 2e-3 and np.array_equal(fp16.argmax(-1), ref.argmax(-1)), (np.median(rel), rel.max())


def test_q4_k_m_types_are_llama_quantize_s():
    """26B-A4B in Q4_K_M as llama.cpp's llama_tensor_get_type (src/llama-quant.cpp) gives it,
    worked by hand: token_embd (tied, 2816 = 11 Q4_K blocks) Q6_K; attn_v Q6_K on the 25 V
    matrices (sliding layers) whose index j among them has use_more_bits(j, 25): j 0-2, 5, 8, ...,
    20, 21-24, i.e. layers 0-2, 6, 9, 13, 16, 20, 24-28; ffn_down and ffn_down_exps Q6_K where
    use_more_bits(layer, 30), else Q4_K, then tensor_type_fallback (2112 and 704 columns are
    no whole 256 blocks): Q6_K -> Q8_0, Q4_K -> Q5_0; the other matrices Q4_K; norms, scales, the
    router and rope_freqs stay F32."""
    types = {s.name: s.ggml_type for s in sg.tensor_specs(FULL, "Q4_K_M")}
    assert types["token_embd.weight"] == T.Q6_K and "output.weight" not in types
    sliding = [i for i in range(30) if i % 6 != 5]
    assert [i for i in sliding if types[f"blk.{i}.attn_v.weight"] == T.Q6_K] == [
        0, 1, 2, 6, 9, 13, 16, 20, 24, 25, 26, 27, 28]
    assert {types[f"blk.{i}.attn_v.weight"] for i in (3, 4, 7, 8, 10, 22)} == {T.Q4_K}
    assert not any(f"blk.{i}.attn_v.weight" in types for i in range(5, 30, 6))
    more = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    for i in range(30):
        want = T.Q8_0 if i in more else T.Q5_0
        assert types[f"blk.{i}.ffn_down.weight"] == types[f"blk.{i}.ffn_down_exps.weight"] == want, i
        for n in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up", "ffn_gate_up_exps"):
            assert types[f"blk.{i}.{n}.weight"] == T.Q4_K, (i, n)
        for n in ("attn_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp.scale", "ffn_down_exps.scale",
                  "layer_output_scale.weight", "pre_ffw_norm_2.weight"):
            assert types[f"blk.{i}.{n}"] == T.F32, (i, n)
    assert types["rope_freqs.weight"] == T.F32
    assert set(types.values()) == {T.F32, T.Q4_K, T.Q5_0, T.Q6_K, T.Q8_0}


def test_eight_experts_take_llama_quantize_s_eight_expert_rules():
    """With 8 experts llama_tensor_get_type bumps attn_v and attn_k to Q8_0 and attn_output to Q5_K."""
    types = {s.name: s.ggml_type for s in sg.tensor_specs(SMALL, "Q4_K_M")}
    assert types["blk.0.attn_v.weight"] == types["blk.5.attn_k.weight"] == T.Q8_0
    assert types["blk.1.attn_output.weight"] == T.Q5_K


# SMALL at 16 experts (no 8-expert rules) draws in Q4_K_M every type 26B-A4B's file has (its 192
# and 64 columns fall back as 2112 and 704 do); TINY_SHAPES' moe (64 wide, 8 experts) falls back
# to Q5_0 everywhere but attn_output (Q5_K) and attn_k, attn_v, token_embd (Q8_0)
QUANTIZED = {
    "small-Q4_K_M": (dataclasses.replace(SMALL, num_experts=16), "Q4_K_M", {T.Q4_K, T.Q5_0, T.Q6_K, T.Q8_0}),
    "small-NVFP4": (dataclasses.replace(SMALL, num_experts=16), "NVFP4", {T.Q8_0, T.NVFP4}),
    "tiny-moe-Q4_K_M": (sg.TINY_SHAPES["moe"], "Q4_K_M", {T.Q5_0, T.Q5_K, T.Q8_0}),
}


@pytest.mark.parametrize("case", sorted(QUANTIZED))
def test_quantized_file_runs(tmp_path, case):
    """The file validates for the GPU, holds the types above, each dequantizing to finite values
    of the intended std, and the reference runs to finite logits."""
    shape, qtype, want = QUANTIZED[case]
    path = tmp_path / f"{case}.gguf"
    specs = sg.write_full_gguf(path, shape, qtype, seed=1, workers=1)
    mf = open_model_file(path)
    validate_model(mf, device="cuda")
    assert {s.ggml_type for s in specs} == want | {T.F32}
    for spec in specs:
        t = mf.tensor(spec.name)
        assert t.ggml_type == spec.ggml_type, spec.name
        if spec.ggml_type != T.F32:
            x = dequantize(np.asarray(t.data), t.ggml_type)
            assert np.isfinite(x).all() and abs(x.std() / spec.std - 1) < 0.05, (spec.name, x.std())
            assert abs(x.mean()) < 0.05 * spec.std, (spec.name, x.mean())
    model = load_reference(mf)
    logits = model.forward(np.arange(12), model.new_cache(16))
    assert np.isfinite(logits).all() and 0.3 < logits.std() < 3
