"""The numpy reference on tiny random qwen3 / qwen3moe models built in transformers and exported.

The exporter writes Q/K unpermuted (llama.cpp runs qwen3 with NeoX RoPE, HF's rotate-half
layout); a wrong RoPE layout or permutation shows up here as a logit mismatch.
"""

import numpy as np
import pytest
import torch

from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.synthetic import hf_from_gguf, tiny_gguf

N_TOKENS = 64


def logits_of(hf, ids):
    with torch.no_grad():
        return hf(torch.as_tensor(ids)[None]).logits[0].numpy()


@pytest.fixture(scope="module", params=["qwen3", "qwen3moe"])
def arch(request):
    return request.param


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_reference_matches_transformers(arch, qtype, tmp_path):
    hf, path = tiny_gguf(arch, qtype, tmp_path, seed=1)
    # F32: against the original HF model. Q8_0: against HF reading the same quantized file.
    ref_model = hf if qtype == "F32" else hf_from_gguf(path)
    model = load_reference(open_model_file(path))
    assert model.cfg.arch == arch and model.cfg.rope_neox and model.cfg.qk_norm
    ids = np.random.default_rng(5).integers(0, model.cfg.n_vocab, N_TOKENS)
    ref = logits_of(ref_model, ids)
    out = model.forward(ids, model.new_cache(N_TOKENS))
    rel = np.abs(out - ref).max() / np.abs(ref).max()
    print(f"{arch} {qtype}: max|dlogit|/max|logit| = {rel:.2e}")
    assert rel <= 1e-3
    assert np.array_equal(out.argmax(-1), ref.argmax(-1))


def test_moe_routing_is_exercised(tmp_path):
    """Different tokens pick different experts, so a routing bug cannot hide."""
    from impnb.kernels.moe.moe import route_ref

    _, path = tiny_gguf("qwen3moe", "F32", tmp_path, seed=1)
    model = load_reference(open_model_file(path))
    x = model.ops.embed(np.arange(32))
    experts, weights = route_ref(model.ops.linear(model.ops.norm(x, "blk.0.ffn_norm"), "blk.0.ffn_gate_inp"),
                                 model.cfg.n_expert_used, True)
    assert len(np.unique(experts)) >= 6
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
