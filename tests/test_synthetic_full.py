"""Full-size synthetic GGUFs, checked on scaled-down shapes through the same writer: the file opens,
every tensor has llama.cpp's type and dequantizes to finite values of the intended mean and std,
and the numpy reference runs to finite, spread-out logits."""

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from impnb import synthetic_full as sf
from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.tokenizer import Tokenizer

pytest.importorskip("transformers")  # the minimal tokenizer's byte symbols

# Small copies of the real shapes: 8 layers so Q4_K_M's use_more_bits picks layers 0, 3, 6, 7.
SMALL = {
    "qwen3-8b": dict(num_hidden_layers=8, hidden_size=256, intermediate_size=768,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1000),
    "qwen3-30b-a3b": dict(num_hidden_layers=8, hidden_size=256, intermediate_size=512,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          vocab_size=1000, num_experts=8, num_experts_per_tok=2,
                          moe_intermediate_size=256),
    "qwen3.6-35b-a3b": dict(num_hidden_layers=8, hidden_size=256, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=64, vocab_size=1000, num_experts=8,
                            num_experts_per_tok=2, moe_intermediate_size=256,
                            shared_expert_intermediate_size=256, linear_num_key_heads=2,
                            linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
                            mrope_section=(4, 2, 2)),
}
CASES = [("qwen3-8b", "Q8_0"), ("qwen3-8b", "Q4_K_M"), ("qwen3-30b-a3b", "Q4_K_M"),
         ("qwen3.6-35b-a3b", "Q4_K_M")]
# Bounds: 5 sampling standard errors over n values, plus the blocks' own bias: fp16 scales
# (std, < 0.01) and Q6_K's q - 32 (mean -0.5, 0.027 of its std).
STD_BIAS, MEAN_BIAS = 0.01, 0.03


def test_use_more_bits_matches_llama_cpp():
    # llama.cpp's use_more_bits for 36 and 48 layers, written out
    assert [i for i in range(36) if sf.use_more_bits(i, 36)] == [
        0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35]
    assert sum(sf.use_more_bits(i, 48) for i in range(48)) == 24


def test_q4_k_scale_bytes_round_trip():
    """Every (scale, min) pair get_scale_min_k4 reads back is the one packed."""
    for sc, m in [(17, 17), (63, 0), (0, 63), (5, 40)]:
        b = sf._q4_k_scale_bytes(sc, m).astype(int)
        for j in range(8):
            if j < 4:
                got = (b[j] & 63, b[j + 4] & 63)
            else:
                got = ((b[j + 4] & 15) | ((b[j - 4] >> 6) << 4), (b[j + 4] >> 4) | ((b[j] >> 6) << 4))
            assert got == (sc, m), (sc, m, j)


def test_full_shapes_are_the_real_models():
    """Parameter counts of Qwen3-8B (8.19 B), Qwen3-30B-A3B (30.53 B) and Qwen3.6-35B-A3B's text model."""
    count = {k: sum(int(np.prod(s.shape)) for s in sf.tensor_specs(v, "Q4_K_M")) for k, v in sf.SHAPES.items()}
    assert abs(count["qwen3-8b"] / 8.19e9 - 1) < 0.005
    assert abs(count["qwen3-30b-a3b"] / 30.53e9 - 1) < 0.005
    assert abs(count["qwen3.6-35b-a3b"] / 34.66e9 - 1) < 0.005  # the text model less its MTP layer


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def small_file(request, tmp_path_factory):
    model, qtype = request.param
    shape = dataclasses.replace(sf.SHAPES[model], **SMALL[model])
    path = tmp_path_factory.mktemp("full") / f"{model}-{qtype}.gguf"
    specs = sf.write_full_gguf(path, shape, qtype, seed=3)
    return shape, qtype, specs, path


def test_types_and_values(small_file):
    shape, qtype, specs, path = small_file
    mf = open_model_file(path)
    assert mf.arch == shape.arch and mf.require("block_count") == shape.num_hidden_layers
    assert set(mf.tensors) == {s.name for s in specs}
    for spec in specs:
        t = mf.tensor(spec.name)
        assert t.ggml_type == spec.ggml_type, spec.name
        x = dequantize(np.asarray(t.data), t.ggml_type).reshape(spec.shape)
        assert np.isfinite(x).all(), spec.name
        if spec.name.endswith("ssm_a"):  # -exp(N(0, 1)): decays, not a centred weight
            assert (x < 0).all()
            continue
        mean = 1.0 if spec.name.endswith("_norm.weight") else 0.0
        n = x.size
        assert abs(x.std() / spec.std - 1) < STD_BIAS + 5 / np.sqrt(2 * n), (spec.name, x.std())
        assert abs(x.mean() - mean) < spec.std * (MEAN_BIAS + 5 / np.sqrt(n)), (spec.name, x.mean())
    q6 = {s.name for s in specs if s.ggml_type == T.Q6_K}
    if qtype == "Q8_0":
        assert {s.ggml_type for s in specs} == {T.Q8_0, T.F32}
    else:
        down = "ffn_down_exps" if shape.num_experts else "ffn_down"
        assert q6 == {"output.weight"} | ({f"blk.{i}.{n}.weight" for i in (0, 3, 6, 7)
                                           for n in ("attn_v", down, "ffn_down_shexp")}
                                          & {s.name for s in specs})


def test_reference_runs_to_spread_logits(small_file):
    shape, _, _, path = small_file
    mf = open_model_file(path)
    tok = Tokenizer.from_metadata(mf.metadata)
    assert tok.vocab_size == shape.vocab_size
    assert tok.decode(tok.encode("Hello, world!")) == "Hello, world!"
    ref = load_reference(mf)
    ids = np.random.default_rng(0).integers(0, shape.vocab_size, 5)
    logits = ref.forward(ids, ref.new_cache(16))
    assert logits.shape == (5, shape.vocab_size) and np.isfinite(logits).all()
    # output rows have std 1/sqrt(hidden) and the normed state rms ~1: logits ~N(0, 1)
    assert 0.3 < logits.std(axis=1).min() and logits.std(axis=1).max() < 3
    assert len(set(logits.argmax(axis=1))) > 1
