"""The numpy reference on tiny random Qwen3.5 / Qwen3.5-MoE / Qwen3-Next hybrids built in transformers,
every parameter randomised (norms, A_log and dt_bias included), exported as llama.cpp's converter
does (impnb/synthetic_qwen35.py): prefill logits, and decode token by token after a prefill against
transformers' own cached decode. 2 QK heads and 4 V heads: qwen35's grouped -> tiled V-head reorder
and qwen3next's grouped layout both show up here as logit mismatches if read wrong."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.synthetic_qwen35 import ARCHS, tiny_gguf

N_PROMPT = 80  # more than the chunked delta rule's 64-token chunk: two chunks
N_DECODE = 6
RTOL = 1e-3  # max |dlogit| / max |logit|


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    hf, path = tiny_gguf(request.param, "F32", tmp_path_factory.mktemp(request.param), seed=1)
    return request.param, hf, path


def rel_err(out, ref):
    return np.abs(out - ref).max() / np.abs(ref).max()


def test_prefill_matches_transformers(tiny):
    arch, hf, path = tiny
    model = load_reference(open_model_file(path))
    cfg = model.cfg
    assert cfg.arch == arch and cfg.attn_output_gate and cfg.n_rot == cfg.head_dim // 4
    assert cfg.deltanet.v_tiled == (arch != "qwen3next")
    assert cfg.recurrent_layers == (True, False, True, False)
    ids = np.random.default_rng(5).integers(0, cfg.n_vocab, N_PROMPT)
    with torch.no_grad():
        ref = hf(torch.as_tensor(ids)[None]).logits[0].numpy()
    out = model.forward(ids, model.new_cache(N_PROMPT))
    print(f"{arch} prefill: max|dlogit|/max|logit| = {rel_err(out, ref):.2e}")
    assert rel_err(out, ref) <= RTOL
    assert np.array_equal(out.argmax(-1), ref.argmax(-1))


def test_decode_after_prefill_matches_transformers(tiny):
    """Prefill, then one token a forward on both sides, each through its own cache: the conv and
    delta-rule states carried across calls, the recurrent (T == 1) path after the chunked one."""
    arch, hf, path = tiny
    model = load_reference(open_model_file(path))
    ids = np.random.default_rng(6).integers(0, model.cfg.n_vocab, 20 + N_DECODE)
    cache = model.new_cache(len(ids))
    # one cache is the sequence's whole state: K/V for attention layers, conv and S for the others
    assert cache.k[0] is None and cache.conv[1] is None and cache.k[1].shape == (len(ids), 2, 32)
    assert cache.conv[0].shape == (2 * 2 * 16 + 4 * 24, 3) and cache.ssm[2].shape == (4, 16, 24)
    ours = [model.forward(ids[:20], cache)[-1]]
    ours += [model.forward(ids[t:t + 1], cache)[-1] for t in range(20, len(ids))]
    with torch.no_grad():
        out = hf(torch.as_tensor(ids[:20])[None], use_cache=True)
        ref = [out.logits[0, -1].numpy()]
        for t in range(20, len(ids)):
            out = hf(torch.as_tensor(ids[t:t + 1])[None], cache=out.past_key_values, use_cache=True)
            ref.append(out.logits[0, -1].numpy())
    ours, ref = np.array(ours), np.array(ref)
    print(f"{arch} decode: max|dlogit|/max|logit| = {rel_err(ours, ref):.2e}")
    assert cache.pos == len(ids)
    assert rel_err(ours, ref) <= RTOL
    assert np.array_equal(ours.argmax(-1), ref.argmax(-1))


def test_quantized_file_reads_its_blocks_in_place(tmp_path):
    """A Q8_0 file (the conv, norms, routers, ssm_a and ssm_dt.bias stay F32) gives the logits of the
    F32 file with its matrices rounded through Q8_0 here: every quantized tensor, 2-D and stacked
    experts alike, is read in its place. (Against the unrounded F32 logits the difference is the
    tiny random model's sensitivity, several percent, which says nothing about the reading.)"""
    _, f32_path = tiny_gguf("qwen35moe", "F32", tmp_path, seed=2)
    _, q8_path = tiny_gguf("qwen35moe", "Q8_0", tmp_path, seed=2)
    ids = np.random.default_rng(7).integers(0, 512, 24)
    q8 = load_reference(open_model_file(q8_path))
    rounded = load_reference(open_model_file(f32_path))
    types = {n.removesuffix(".weight"): t.ggml_type for n, t in open_model_file(q8_path).tensors.items()}
    assert types["blk.0.attn_qkv"] == GGMLQuantizationType.Q8_0
    assert types["blk.0.ssm_conv1d"] == types["blk.0.ssm_a"] == GGMLQuantizationType.F32
    for name, w in rounded.ops.w.items():
        if types[name] == GGMLQuantizationType.Q8_0:
            rounded.ops.w[name] = dequantize(quantize(w, types[name]), types[name]).reshape(w.shape)
    out = q8.forward(ids, q8.new_cache(len(ids)))
    ref = rounded.forward(ids, rounded.new_cache(len(ids)))
    assert rel_err(out, ref) <= 1e-5


def test_qwen3next_fused_ssm_in_of_older_files(tmp_path):
    """Older converters wrote in_proj_qkvz unsplit as ssm_in ([q, k, v, z] a QK head); llama.cpp
    reads both layouts, and so does the reference."""
    from impnb.synthetic import MINIMAL_VOCAB
    from impnb.synthetic_qwen35 import build_hf_model, export_gguf

    hf = build_hf_model("qwen3next", MINIMAL_VOCAB, seed=4)
    export_gguf(hf, tmp_path / "legacy.gguf", legacy=True)
    mf = open_model_file(tmp_path / "legacy.gguf")
    assert mf.has("blk.0.ssm_in") and not mf.has("blk.0.attn_qkv")
    model = load_reference(mf)
    assert model.cfg.deltanet.fused_qkvz
    ids = np.random.default_rng(8).integers(0, model.cfg.n_vocab, 24)
    with torch.no_grad():
        ref = hf(torch.as_tensor(ids)[None]).logits[0].numpy()
    assert rel_err(model.forward(ids, model.new_cache(len(ids))), ref) <= RTOL
