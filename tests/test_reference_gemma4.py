"""The numpy reference on tiny random Gemma 4 models from transformers (impnb/synthetic_gemma4.py),
and gemma4 files with inconsistent metadata refused before a load.

"dense" covers per-layer embeddings, KV sharing and the double-wide MLP; "moe" the experts beside
the dense MLP, K = V and global layers' own KV head count; both have sliding and global layers
(their own head dims, RoPE base and width), the layer scale and logit softcapping. Prompts are
five times the sliding window.
"""

import numpy as np
import pytest
import torch
from gguf import GGUFValueType as V

from impnb.errors import GGUFError, UnsupportedError
from impnb.fuzz.mutate import parse, set_kv
from impnb.fuzz.seeds import write_seed
from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.models.validate import validate_model
from impnb.synthetic_gemma4 import SLIDING_WINDOW, tiny_gguf

N_TOKENS = 5 * SLIDING_WINDOW
RTOL = 1e-4  # max |dlogit| / max |logit|; float32 both sides


@pytest.fixture(scope="module", params=[("dense", "F32"), ("moe", "F32"), ("dense", "Q8_0"), ("moe", "Q8_0")],
                ids=lambda p: "-".join(p))
def built(request, tmp_path_factory):
    """(reference model, HF logits of the prompt, prompt ids, HF model); for Q8_0 HF holds the
    file's weights."""
    variant, qtype = request.param
    hf, path = tiny_gguf(variant, qtype, tmp_path_factory.mktemp("gemma4"), seed=1)
    model = load_reference(open_model_file(path))
    ids = np.random.default_rng(5).integers(0, model.cfg.n_vocab, N_TOKENS)
    with torch.no_grad():
        ref = hf(torch.as_tensor(ids)[None]).logits[0].numpy()
    return model, ref, ids, hf


def _rel(out, ref):
    return np.abs(out - ref).max() / np.abs(ref).max()


def test_prefill_matches_transformers(built):
    model, ref, ids, _ = built
    out = model.forward(ids, model.new_cache(N_TOKENS))
    assert _rel(out, ref) <= RTOL, _rel(out, ref)
    assert np.array_equal(out.argmax(-1), ref.argmax(-1))


def test_incremental_decode_matches_transformers(built):
    """A prompt chunk, then one token at a time and a chunk again, past the window: each row as
    transformers' full-sequence logits (KV sharing reads the source layer's cache)."""
    model, ref, ids, _ = built
    cache = model.new_cache(N_TOKENS)
    steps = [(0, 13)] + [(t, t + 1) for t in range(13, 31)] + [(31, N_TOKENS)]
    out = np.concatenate([model.forward(ids[a:b], cache) for a, b in steps])
    assert _rel(out, ref) <= RTOL, _rel(out, ref)


def test_decode_matches_transformers_cached_decode(built):
    """Token by token after a prompt, against transformers' own cached decode (its sliding cache
    and shared K/V states)."""
    model, _, ids, hf = built
    cache = model.new_cache(N_TOKENS)
    ours = [model.forward(ids[:13], cache)] + [model.forward(ids[t:t + 1], cache) for t in range(13, N_TOKENS)]
    with torch.no_grad():
        out = hf(torch.as_tensor(ids[:13])[None], use_cache=True)
        theirs = [out.logits[0].numpy()]
        for t in range(13, N_TOKENS):
            out = hf(torch.as_tensor(ids[t:t + 1])[None], cache=out.cache, use_cache=True)
            theirs.append(out.logits[0].numpy())
    ours, theirs = np.concatenate(ours), np.concatenate(theirs)
    assert _rel(ours, theirs) <= RTOL, _rel(ours, theirs)


def test_softcap_and_features_are_exercised(built):
    model, ref, _, _ = built
    cfg = model.cfg
    assert cfg.final_logit_softcap and np.abs(ref).max() > 0.3 * cfg.final_logit_softcap
    assert not all(cfg.swa_layers) and any(cfg.swa_layers)
    assert cfg.head_dims(0) != cfg.head_dims(cfg.swa_layers.index(False))
    if cfg.n_expert:
        assert "blk.1.attn_v" not in model.ops.w and cfg.kv_heads(1) != cfg.kv_heads(0)  # K = V
    else:
        assert cfg.n_embd_per_layer and cfg.n_kv_shared == 2
        assert [cfg.kv_layer(il) for il in range(cfg.n_layer)] == [0, 1, 2, 3, 3, 2]


def test_moe_routing_is_exercised(built):
    """Tokens pick most experts, with a margin between the k-th and the next so that float32 and
    float64 routers pick the same."""
    model, _, ids, _ = built
    if not model.cfg.n_expert:
        pytest.skip("dense")
    ops, k = model.ops, model.cfg.n_expert_used
    x = ops.embed(ids)
    r = ops.unit_norm(x) * ops.w["blk.0.ffn_gate_inp.scale"] * model.cfg.n_embd ** -0.5
    logits = np.sort(ops.linear(r, "blk.0.ffn_gate_inp"), axis=-1)[:, ::-1]
    picked = np.argsort(-ops.linear(r, "blk.0.ffn_gate_inp"), axis=-1)[:, :k]
    assert len(np.unique(picked)) >= 6
    assert (logits[:, k - 1] - logits[:, k]).min() > 1e-4


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    return parse(write_seed("gemma4", tmp_path_factory.mktemp("seed") / "seed-gemma4.gguf"))


@pytest.mark.parametrize("key, value, words", [
    ("attention.head_count_kv", [2, 1, 2], "head_count_kv has 3 entries"),
    ("feed_forward_length", [64, 64, 128, 128, 128], "feed_forward_length has 5 entries"),
    ("attention.head_count_kv", [2, 1, 1, 1], "reads layer 0's K/V"),  # a shared layer's heads
    ("attention.head_count_kv", [2, 2, 2, 2], "blk.1.attn_k.weight has shape"),
    ("attention.shared_kv_layers", 4, "shared_kv_layers"),
])
def test_inconsistent_metadata_is_refused(seed, tmp_path, key, value, words):
    path = set_kv(seed, f"gemma4.{key}", value, V.ARRAY if isinstance(value, list) else V.UINT32).write(
        tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match=words):
        validate_model(open_model_file(path))


def test_sliding_pattern_must_be_per_layer(seed, tmp_path):
    path = set_kv(seed, "gemma4.attention.sliding_window_pattern", 6, V.UINT32).write(tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match="sliding_window_pattern is not a per-layer array"):
        validate_model(open_model_file(path))


def test_cuda_path_takes_gemma4_at_its_kernels_head_dims(seed, tmp_path):
    """The tiny parity models' heads of 16 and 32 have no GPU attention kernel: one clear refusal;
    heads of 64 .. 512 (synthetic_full_gemma4.TINY_SHAPES, the 26B-A4B's 256 and 512) pass."""
    from impnb.synthetic_full_gemma4 import TINY_SHAPES, write_full_gguf

    with pytest.raises(UnsupportedError, match="gemma4 with head dim (16|32) .* no GPU attention kernel"):
        validate_model(open_model_file(seed.source), device="cuda")
    write_full_gguf(tmp_path / "wide.gguf", TINY_SHAPES["wide"], workers=1)
    cfg = validate_model(open_model_file(tmp_path / "wide.gguf"), device="cuda")
    assert {cfg.head_dims(il) for il in range(cfg.n_layer)} == {(256, 256), (512, 512)}
