"""Broken Qwen3.5 / Qwen3-Next files end in one clear error before any weight is read: a missing or
misshapen Gated DeltaNet tensor, V heads that are not a multiple of the QK heads (GGUFError from
validate_model); the GPU path refuses the hybrids with an UnsupportedError until it has one."""

import copy

import pytest

from impnb.errors import GGUFError, UnsupportedError
from impnb.gguf_file import open_model_file
from impnb.models.validate import validate_model
from impnb.synthetic import MINIMAL_VOCAB
from impnb.synthetic_qwen35 import build_hf_model, export_gguf


@pytest.fixture(scope="module")
def qwen35():
    return build_hf_model("qwen35", MINIMAL_VOCAB, seed=3)


def broken(model, path, drop=(), **config_changes):
    config = copy.deepcopy(model.config)
    for key, value in config_changes.items():
        setattr(config, key, value)
    export_gguf(model, path, drop=drop, config=config)
    return open_model_file(path)


def test_the_intact_file_validates(qwen35, tmp_path):
    cfg = validate_model(broken(qwen35, tmp_path / "ok.gguf"), device="cpu")
    assert cfg.deltanet.conv_channels == 2 * 2 * 16 + 4 * 24 and cfg.n_ff_shexp == 0


@pytest.mark.parametrize("name", ["blk.0.ssm_a", "blk.2.ssm_dt.bias", "blk.0.ssm_conv1d.weight",
                                  "blk.2.ssm_alpha.weight", "blk.0.ssm_norm.weight", "blk.1.attn_q.weight"])
def test_missing_tensor(qwen35, tmp_path, name):
    mf = broken(qwen35, tmp_path / "missing.gguf", drop=(name,))
    with pytest.raises(GGUFError, match=f"tensor {name} is missing"):
        validate_model(mf)


def test_v_heads_not_a_multiple_of_the_qk_heads(qwen35, tmp_path):
    mf = broken(qwen35, tmp_path / "heads.gguf", linear_num_key_heads=3)
    with pytest.raises(GGUFError, match="ssm.time_step_rank 4 .* multiple of .*ssm.group_count 3"):
        validate_model(mf)


def test_head_counts_that_disagree_with_the_tensors(qwen35, tmp_path):
    mf = broken(qwen35, tmp_path / "shape.gguf", linear_num_value_heads=2, linear_value_head_dim=48)
    with pytest.raises(GGUFError, match=r"blk\.0\.ssm_dt\.bias has shape \[4\]; qwen35 with 2 V heads needs \[2\]"):
        validate_model(mf)


def test_the_gpu_path_refuses_the_hybrids(qwen35, tmp_path):
    from impnb.gpu.model import DeviceModel

    with pytest.raises(UnsupportedError, match="architecture qwen35 has no GPU path yet"):
        DeviceModel(broken(qwen35, tmp_path / "ok.gguf"), 64)
