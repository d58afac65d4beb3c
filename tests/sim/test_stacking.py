"""DeviceModel's load-time choices (the simulator's device arrays): a layer's Q|K stacked alone
where V's type differs and no type holds all three exactly (promotion: test_quant_promote), and
the decode-attention tables with their environment overrides."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from impnb.errors import ParameterError
from impnb.gguf_file import open_model_file
from impnb.gpu.model import DeviceModel
from impnb.tuning import fuses_post
from impnb.kernels.common.repack import unpack
from impnb.synthetic import tiny_gguf


def test_q_and_k_stack_where_v_type_differs(tmp_path):
    _, path = tiny_gguf("qwen3", "Q8_0_V_Q4_1", tmp_path, seed=1)
    mf = open_model_file(path)
    m = DeviceModel(mf, 64)
    for il in range(m.cfg.n_layer):
        p = f"blk.{il}."
        assert p + "attn_qkv" not in m.w and m.w[p + "attn_v"].ggml_type == T.Q4_1
        qk = m.w[p + "attn_qk"]
        q, k = mf.tensors[p + "attn_q.weight"], mf.tensors[p + "attn_k.weight"]
        assert qk.ggml_type == T.Q8_0 and qk.rows == q.shape[0] + k.shape[0]
        host = type(qk)(qk.ggml_type, qk.rows, qk.cols, qk.buffer.copy_to_host(),
                        tuple(part.copy_to_host() for part in qk.parts))
        assert np.array_equal(unpack(host), np.concatenate([q.data, k.data]))


def test_decode_overrides_from_the_environment(tmp_path, monkeypatch):
    # A/B overrides of the decode-attention tables; a malformed one is a ParameterError (one line
    # from the CLI), not a traceback at the first decode
    _, path = tiny_gguf("qwen3", "Q8_0", tmp_path, seed=1)
    mf = open_model_file(path)
    assert DeviceModel(mf, 64).plan.decode_step(10).short_blocks >= 1  # the table: the short kernel at 64 keys
    monkeypatch.setenv("IMPNB_SHORT_DECODE_MAX", "0")
    monkeypatch.setenv("IMPNB_FUSED_POST_DIMS", "")
    m = DeviceModel(mf, 64)
    assert m.plan.decode_step(10).short_blocks == 0 and not m.plan.decode_post
    monkeypatch.setenv("IMPNB_SHORT_CLUSTER", "two")
    with pytest.raises(ParameterError, match="IMPNB_SHORT_CLUSTER"):
        DeviceModel(mf, 64)


def test_fused_post_table():
    # qkv_post fused into the short decode attention where it measured faster (FUSED_POST):
    # SmolLM2 and Qwen3-8B yes; Gemma3 and Qwen3-30B-A3B (8 query heads a KV head) no
    assert fuses_post(64, 9, 3) and fuses_post(128, 32, 8)
    assert not fuses_post(256, 4, 1) and not fuses_post(128, 32, 4)
