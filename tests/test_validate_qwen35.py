"""Broken Qwen3.5 / Qwen3-Next files end in one clear error before any weight is read: a missing or
misshapen Gated DeltaNet tensor, V heads that are not a multiple of the QK heads (GGUFError from
validate_model); the GPU path refuses the shapes its kernels do not take with an UnsupportedError."""

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


def test_the_gpu_path_refuses_shapes_its_kernels_do_not_take(qwen35, tmp_path):
    """The tiny CPU model's attention head dim 32 and DeltaNet V head dim 24 have no GPU kernel:
    one UnsupportedError each (DeviceModel before any device memory; check_deltanet alone)."""
    from impnb.gpu.model import DeviceModel, check_deltanet

    mf = broken(qwen35, tmp_path / "ok.gguf")
    with pytest.raises(UnsupportedError, match="qwen35 with head dim 32 .* has no GPU attention kernel"):
        DeviceModel(mf, 64)
    with pytest.raises(UnsupportedError, match=r"head dims 16 \(K\) / 24 \(V\) has no GPU kernel"):
        check_deltanet(validate_model(mf))


def test_mtp_layers_are_left_out(qwen35, tmp_path):
    """llama.cpp appends the MTP layer after the model's own (block_count + 1, nextn_predict_layers 1):
    its tensors pass validation unread and the model runs the layers before it alone."""
    import numpy as np
    from gguf import GGUFWriter, LlamaFileType

    from impnb.models import load_reference
    from impnb.synthetic import add_tokenizer, minimal_tokenizer_metadata
    from impnb.synthetic_qwen35 import add_hparams, gguf_tensors

    def write(path, n_blocks, extra):
        config = copy.deepcopy(qwen35.config)
        config.num_hidden_layers = n_blocks
        w = GGUFWriter(str(path), "qwen35")
        add_hparams(w, config, "qwen35", LlamaFileType.ALL_F32, "mtp")
        w.add_uint32("qwen35.nextn_predict_layers", 1)
        add_tokenizer(w, minimal_tokenizer_metadata(MINIMAL_VOCAB))
        for name, array in gguf_tensors(qwen35) + extra:
            w.add_tensor(name, np.ascontiguousarray(array, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return open_model_file(path)

    mtp = [("blk.4.nextn.eh_proj.weight", np.ones((64, 128))), ("blk.4.nextn.enorm.weight", np.ones(64)),
           ("blk.4.attn_norm.weight", np.ones(64))]
    mf = write(tmp_path / "mtp.gguf", 5, mtp)
    cfg = validate_model(mf)
    assert (cfg.n_layer, cfg.n_layer_nextn, len(cfg.recurrent_layers)) == (4, 1, 4)
    ids = np.arange(7)
    with_mtp, plain = load_reference(mf), load_reference(broken(qwen35, tmp_path / "plain.gguf"))
    np.testing.assert_array_equal(with_mtp.forward(ids, with_mtp.new_cache(8)), plain.forward(ids, plain.new_cache(8)))
    with pytest.raises(GGUFError, match="blk.5.attn_norm.weight belongs to layer 5, but qwen35.block_count is 5"):
        validate_model(write(tmp_path / "past.gguf", 5, mtp + [("blk.5.attn_norm.weight", np.ones(64))]))
