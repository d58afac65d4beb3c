"""Synthetic qwen3/qwen3moe GGUFs: llama.cpp's names, shapes, types and keys; HF's GGUF loader reads them back."""

import copy
import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from impnb import synthetic  # noqa: E402
from impnb.gguf_file import open_model_file  # noqa: E402
from impnb.tokenizer import Tokenizer  # noqa: E402
from tests.conftest import real_model_path  # noqa: E402

F32, Q8 = GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0
T = 32
F32_TOL = 1e-5  # max|Δ| / max|logit|; the F32 round trip is in fact bit-exact
# Q8_0 against the float model: measured 0.010-0.018 (vocab 512) and up to 0.039 (SmolLM2's 49152);
# top-1 agreement measured 0.94-1.0 over seeds 0-5.
Q8_TOL, Q8_TOP1 = 5e-2, 0.9
SEED = 0
TEXT = "Hello world, it's 2024!\n  def f(x): return x ** 2  <|endoftext|>"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny(arch, qtype) -> (hf_model, gguf_path); one model per arch, written in both types."""
    root = tmp_path_factory.mktemp("synthetic")

    @functools.cache
    def build(arch, qtype):
        return synthetic.tiny_gguf(arch, qtype, root, None, SEED)

    return build


@functools.cache
def _loaded(path):
    return synthetic.hf_from_gguf(path)


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.as_tensor(ids)[None]).logits[0].numpy()


def _ids(vocab_size):
    return np.random.default_rng(SEED).integers(0, vocab_size, T)


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(a).max())


def _expected_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """GGUF names and numpy shapes, written out independently of the exporter."""
    h, hd, v = cfg.hidden_size, cfg.head_dim, cfg.vocab_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    out = {"token_embd.weight": (v, h), "output_norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = (v, h)
    for i in range(cfg.num_hidden_layers):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": (h,), b + "attn_q.weight": (q, h), b + "attn_k.weight": (kv, h),
                b + "attn_v.weight": (kv, h), b + "attn_output.weight": (h, q),
                b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,), b + "ffn_norm.weight": (h,)}
        if cfg.model_type == "qwen3_moe":
            e, ff = cfg.num_experts, cfg.moe_intermediate_size
            out |= {b + "ffn_gate_inp.weight": (e, h), b + "ffn_gate_exps.weight": (e, ff, h),
                    b + "ffn_up_exps.weight": (e, ff, h), b + "ffn_down_exps.weight": (e, h, ff)}
        else:
            ff = cfg.intermediate_size
            out |= {b + "ffn_gate.weight": (ff, h), b + "ffn_up.weight": (ff, h), b + "ffn_down.weight": (h, ff)}
    return out


def _expected_weights(model, qtype):
    """The exporter's float arrays, Q8_0-rounded by the gguf package where llama.cpp quantizes."""
    out = {}
    for name, a in synthetic.gguf_tensors(model):
        quantized = qtype == "Q8_0" and a.ndim > 1 and ".ffn_gate_inp." not in name
        out[name] = dequantize(quantize(a, Q8), Q8).reshape(a.shape) if quantized else a
    return out


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.parametrize("arch", synthetic.ARCHS)
def test_file_layout(tiny, arch, qtype):
    model, path = tiny(arch, qtype)
    mf = open_model_file(path)
    shapes = _expected_shapes(model.config)
    assert mf.arch == arch
    assert {n: t.shape for n, t in mf.tensors.items()} == shapes
    weights = _expected_weights(model, qtype)
    for name, t in mf.tensors.items():
        is_f32 = len(t.shape) == 1 or ".ffn_gate_inp." in name
        assert t.ggml_type == (F32 if qtype == "F32" or is_f32 else Q8), name
        assert np.array_equal(t.dequantize(), weights[name]), name


@pytest.mark.parametrize("arch", synthetic.ARCHS)
def test_metadata(tiny, arch):
    model, path = tiny(arch, "F32")
    cfg = model.config
    want = {
        "block_count": cfg.num_hidden_layers, "context_length": 2048, "embedding_length": 64,
        "feed_forward_length": cfg.intermediate_size, "attention.head_count": 4,
        "attention.head_count_kv": 2, "attention.key_length": cfg.head_dim,
        "attention.value_length": cfg.head_dim, "rope.freq_base": 10000.0,
        "attention.layer_norm_rms_epsilon": float(np.float32(1e-6)),
    }
    if arch == "qwen3moe":
        want |= {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32}
    fields = GGUFReader(path).fields
    assert {k for k in fields if k.startswith(arch + ".")} == {f"{arch}.{k}" for k in want}
    md = open_model_file(path).metadata
    for key, value in want.items():
        assert md[f"{arch}.{key}"] == value, key
        assert fields[f"{arch}.{key}"].types == [GGUFValueType.FLOAT32 if isinstance(value, float)
                                                 else GGUFValueType.UINT32], key
    assert md["general.file_type"] == 0 and md["general.quantization_version"] == 2
    assert open_model_file(tiny(arch, "Q8_0")[1]).metadata["general.file_type"] == 7  # MOSTLY_Q8_0


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.parametrize("arch", synthetic.ARCHS)
def test_hf_gguf_loader_gives_back_the_model(tiny, arch, qtype):
    """transformers reads the file back (names, stacked experts, RoPE layout) to the same logits."""
    model, path = tiny(arch, qtype)
    loaded = _loaded(path)
    got = dict(synthetic.gguf_tensors(loaded))
    for name, want in _expected_weights(model, qtype).items():
        assert np.array_equal(got[name], want), name
    ids = _ids(model.config.vocab_size)
    want, have = _logits(model, ids), _logits(loaded, ids)
    if qtype == "F32":
        assert _rel(want, have) <= F32_TOL
    else:
        assert _rel(want, have) <= Q8_TOL
        assert np.mean(want.argmax(-1) == have.argmax(-1)) >= Q8_TOP1


@pytest.mark.parametrize("arch", synthetic.ARCHS)
def test_rope_layout_is_neox(tiny, arch):
    """Q/K rows permuted as llama's converter does for `llama` move the logits far past F32_TOL,
    so the loader test above pins the unpermuted (NeoX, rotate-half) layout llama.cpp uses for qwen3."""
    model, _ = tiny(arch, "F32")
    permuted = copy.deepcopy(model)
    with torch.no_grad():
        for layer in permuted.model.layers:
            for proj, n_head in ((layer.self_attn.q_proj, model.config.num_attention_heads),
                                 (layer.self_attn.k_proj, model.config.num_key_value_heads)):
                w = proj.weight
                proj.weight.copy_(w.reshape(n_head, 2, -1, w.shape[1]).transpose(1, 2).reshape(w.shape))
    ids = _ids(model.config.vocab_size)
    assert _rel(_logits(model, ids), _logits(permuted, ids)) > 1000 * F32_TOL


def test_minimal_tokenizer_loads_in_hf_and_impnb(tiny):
    from transformers import AutoTokenizer

    _, path = tiny("qwen3", "F32")
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = Tokenizer.from_metadata(open_model_file(path).metadata).encode(TEXT)
    assert hf.encode(TEXT) == ids and ids[-1] == 0 and len(hf) == synthetic.MINIMAL_VOCAB


def test_tokenizer_array_types(tmp_path):
    tok = synthetic.minimal_tokenizer_metadata(synthetic.MINIMAL_VOCAB)
    tok["tokenizer.ggml.scores"] = [-float(i) for i in range(synthetic.MINIMAL_VOCAB)]
    synthetic.make_tiny_gguf("qwen3", "F32", tmp_path / "t.gguf", tok)
    fields = GGUFReader(tmp_path / "t.gguf").fields
    arr, s = GGUFValueType.ARRAY, GGUFValueType
    assert fields["tokenizer.ggml.tokens"].types == [arr, s.STRING]
    assert fields["tokenizer.ggml.merges"].types == [arr, s.STRING]
    assert fields["tokenizer.ggml.token_type"].types == [arr, s.INT32]
    assert fields["tokenizer.ggml.scores"].types == [arr, s.FLOAT32]
    assert fields["tokenizer.ggml.eos_token_id"].types == [s.UINT32]
    assert fields["tokenizer.ggml.add_bos_token"].types == [s.BOOL]
    assert fields["tokenizer.ggml.model"].types == [s.STRING]


def test_smollm2_tokenizer(tmp_path):
    """SmolLM2's vocabulary copied over: vocab_size 49152, same ids, and HF still loads the model."""
    source = real_model_path("smollm2-135m")
    tok = synthetic.tokenizer_metadata_from(source)
    model, path = synthetic.tiny_gguf("qwen3", "F32", tmp_path, tok, SEED)
    assert model.config.vocab_size == len(tok["tokenizer.ggml.tokens"]) == 49152
    md = open_model_file(path).metadata
    assert {k: v for k, v in md.items() if k.startswith("tokenizer.")} == tok
    assert Tokenizer.from_metadata(md).encode(TEXT) == Tokenizer.from_metadata(tok).encode(TEXT)
    ids = _ids(model.config.vocab_size)
    assert _rel(_logits(model, ids), _logits(synthetic.hf_from_gguf(path), ids)) <= F32_TOL
