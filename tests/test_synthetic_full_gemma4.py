"""The full-size Gemma-4-26B-A4B generator on a scaled-down copy of its shape: the file validates,
rope_freqs holds the converter's factors, scales sit about 1, and the numpy reference runs to
finite, spread-out logits."""

import dataclasses

import numpy as np
import pytest

from impnb import synthetic_full_gemma4 as sg
from impnb.gguf_file import open_model_file
from impnb.models import load_reference

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
    move by less than 1e-3 of their largest logit when K/V are rounded to fp16, as the GPU's cache
    holds them: attention at scale 1 over Q and K normed about 1 spreads the scores as
    sqrt(head dim), and that near-argmax softmax moved them by 3e-3 (dense) to 7e-2 (wide)."""
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
    assert rel.max() < 1e-3 and np.array_equal(fp16.argmax(-1), ref.argmax(-1)), (np.median(rel), rel.max())
