"""A Qwen3.5 hybrid loaded for the GPU on the simulator's device arrays: the recurrent state's
buffers, each layer's weights by role (the DeltaNet projections and the shared expert's gate|up
stacked, attn_q split into queries and gates), no router fold, the state zeroed by reset, and
the gated attn_q split row for row."""

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.gpu.layer_weights import DeltaNet
from impnb.gpu.model import DeviceModel
from impnb.gpu.weights import split_gated_q
from impnb.models import model_config
from impnb.sampling import SamplingParams
from impnb.synthetic_qwen35 import tiny_gguf


@pytest.fixture(scope="module")
def qwen35moe(tmp_path_factory):
    return tiny_gguf("qwen35moe", "Q8_0", tmp_path_factory.mktemp("tiny"), seed=1, gpu=True)[1]


def test_weights_by_role_and_state_buffers(qwen35moe, monkeypatch):
    monkeypatch.setenv("IMPNB_DP4A_MIN_MB", "0")  # every Q8_0 GEMV on dp4a: a fold would be possible
    monkeypatch.setenv("IMPNB_DP4A_MIN_K", "0")
    m = DeviceModel(open_model_file(qwen35moe), 64)
    cfg, d = m.cfg, m.cfg.deltanet
    assert not m.router_folds and m.rec is not None
    for il, (spec, lw) in enumerate(zip(m.layers, m.blk)):
        ex = lw.ffn
        assert ex.shared.gate_up.w.rows == 2 * cfg.n_ff_shexp and ex.shared_gate.w.rows == 1
        if cfg.is_recurrent(il):
            assert spec.mixer == "gated_deltanet" and isinstance(lw.attn, DeltaNet)
            assert lw.attn.qkvz.w.rows == d.conv_channels + d.n_v_heads * d.head_v_dim
            assert lw.attn.beta_alpha.w.rows == 2 * d.n_v_heads and lw.attn.conv_w.shape == (d.conv_channels, 4)
            assert m.rec.conv[il].shape == (2, d.conv_channels, 3)  # a slot pair (by position's parity)
            assert m.rec.ssm[il].shape == (2, d.n_v_heads, d.head_k_dim, d.head_v_dim)
        else:
            assert spec.mixer == "attention" and m.rec.conv[il] is None and m.rec.ssm[il] is None
            att = lw.attn
            assert att.q_gate.w.rows == cfg.n_head * cfg.head_dim
            assert att.qkv.w.rows == (cfg.n_head + 2 * cfg.n_head_kv) * cfg.head_dim


def test_reset_zeroes_the_state(qwen35moe):
    from impnb.engine_cuda import CudaEngine

    engine = CudaEngine(open_model_file(qwen35moe), 64, graphs=False)
    assert engine.lookahead
    rng = np.random.default_rng(0)
    for buf in [b for b in engine.m.rec.conv + engine.m.rec.ssm if b is not None]:
        buf.copy_to_device(rng.standard_normal(buf.shape).astype(np.float32))
    engine.reset(SamplingParams(temperature=0))
    for buf in [b for b in engine.m.rec.conv + engine.m.rec.ssm if b is not None]:
        assert not buf.copy_to_host().any()


def test_split_gated_q_keeps_each_heads_rows(qwen35moe):
    mf = open_model_file(qwen35moe)
    cfg = model_config(mf)
    tensors = {name.removesuffix(".weight"): t for name, t in mf.tensors.items()}
    split = split_gated_q(tensors, cfg)
    H, Dh = cfg.n_head, cfg.head_dim
    for il in range(cfg.n_layer):
        name = f"blk.{il}.attn_q"
        if cfg.is_recurrent(il):
            assert name not in split
            continue
        full = tensors[name].dequantize().reshape(H, 2, Dh, -1)
        assert np.array_equal(split[name].dequantize(), full[:, 0].reshape(H * Dh, -1))
        assert np.array_equal(split[name + "_gate"].dequantize(), full[:, 1].reshape(H * Dh, -1))


@pytest.mark.parametrize("legacy", [False, True], ids=["attn_qkv", "ssm_in"])
def test_split_fused_ssm_gives_the_references_projections(tmp_path, legacy):
    """qwen3next's fused ssm_ba (and an older file's ssm_in), regrouped at load, project h as the
    reference's splits do (models/deltanet.py: ssm_ba's [b, a] a QK head, split_qkvz)."""
    from impnb.gpu.weights import split_fused_ssm
    from impnb.models.deltanet import split_qkvz
    from impnb.synthetic import MINIMAL_VOCAB
    from impnb.synthetic_qwen35 import build_hf_model, export_gguf

    path = tmp_path / "next.gguf"
    export_gguf(build_hf_model("qwen3next", MINIMAL_VOCAB, seed=2, gpu=True), path, "Q8_0", legacy=legacy)
    mf = open_model_file(path)
    cfg = model_config(mf)
    d = cfg.deltanet
    assert d.fused_qkvz == legacy and not d.v_tiled
    tensors = {name.removesuffix(".weight"): t for name, t in mf.tensors.items()}
    split = split_fused_ssm(tensors, cfg)
    h = np.random.default_rng(0).standard_normal((3, cfg.n_embd)).astype(np.float32)
    p = "blk.0."
    ba = (h @ tensors[p + "ssm_ba"].dequantize().T).reshape(3, d.n_k_heads, 2, -1)
    assert np.allclose(h @ split[p + "ssm_beta"].dequantize().T, ba[:, :, 0].reshape(3, -1), rtol=1e-5, atol=1e-5)
    assert np.allclose(h @ split[p + "ssm_alpha"].dequantize().T, ba[:, :, 1].reshape(3, -1), rtol=1e-5, atol=1e-5)
    if legacy:
        qkv, z = split_qkvz(h @ tensors[p + "ssm_in"].dequantize().T, d)
        assert np.allclose(h @ split[p + "attn_qkv"].dequantize().T, qkv, rtol=1e-5, atol=1e-5)
        assert np.allclose(h @ split[p + "attn_gate"].dequantize().T, z, rtol=1e-5, atol=1e-5)
    else:
        assert p + "attn_qkv" not in split


def test_chunked_prefill_is_chosen_by_the_override(monkeypatch):
    """tuning.GDN_CHUNKED_MIN_ROWS and its override (0: token by token everywhere), read at load;
    a malformed value is a ParameterError."""
    from impnb.errors import ParameterError
    from impnb.tuning import GDN_CHUNKED_MIN_ROWS, Overrides

    assert Overrides.from_env().gdn_chunked_min_rows == GDN_CHUNKED_MIN_ROWS
    monkeypatch.setenv("IMPNB_GDN_CHUNKED_MIN_ROWS", "64")
    assert Overrides.from_env().gdn_chunked_min_rows == 64
    monkeypatch.setenv("IMPNB_GDN_CHUNKED_MIN_ROWS", "many")
    with pytest.raises(ParameterError, match="IMPNB_GDN_CHUNKED_MIN_ROWS"):
        Overrides.from_env()
