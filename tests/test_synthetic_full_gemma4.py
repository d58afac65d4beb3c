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
