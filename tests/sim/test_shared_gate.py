"""Qwen3.5's shared expert gate folded into the MoE decode on the simulator (tiny qwen35moe): the
router's rows and the gate's row stacked at load (ffn_gate_inps; the router's and the gate's
Linears views of its rows, the file's bytes), and moe_ffn_decode with the fold (the router GEMV
writes the gate's logit as logit E, the shared down GEMV takes its sigmoid: no gate GEMV and no
sigmoid_gate, against the unfolded decode's launches, IMPNB_SHARED_GATE_FOLD=0) against the numpy
reference's moe_shared_ffn. The experts' down stays fp32 (IMPNB_MOE_DOWN_DP4A=0, as the GPU engine
test has it) so that the bound is fp32 rounding's: 1e-3 of the FFN output's largest value (fp32
GEMVs of the same Q8_0 weights; a gate left out or read from another logit moves the shared
expert's share by tens of percent). tests/gpu/test_engine_qwen35.py compares the two decodes'
logits on the GPU."""

import sys

import numpy as np
import pytest
from numba import cuda

from impnb.gguf_file import open_model_file
from impnb.gpu.model import DeviceModel
from impnb.gpu.moe import moe_ffn_decode
from impnb.kernels.common.repack import PackedWeight, unpack
from impnb.models import layers, load_reference
from impnb.synthetic_qwen35 import tiny_gguf


@pytest.fixture(scope="module")
def qwen35moe(tmp_path_factory):
    return tiny_gguf("qwen35moe", "Q8_0", tmp_path_factory.mktemp("tiny"), seed=1, gpu=True)[1]


@pytest.fixture(scope="module")
def models(qwen35moe) -> tuple:
    """The tiny model loaded with the gate folded and not."""
    return load(qwen35moe, True), load(qwen35moe, False)


def load(path, fold: bool) -> DeviceModel:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMPNB_MOE_DOWN_DP4A", "0")
        mp.setenv("IMPNB_SHARED_GATE_FOLD", "1" if fold else "0")
        return DeviceModel(open_model_file(path), 64)


def host_bytes(w: PackedWeight) -> np.ndarray:
    """The GGUF bytes (rows, row_bytes) of a device PackedWeight."""
    return unpack(PackedWeight(w.ggml_type, w.rows, w.cols, None, tuple(p.copy_to_host() for p in w.parts)))


def test_router_and_gate_are_views_of_one_stack(qwen35moe, models):
    mf = open_model_file(qwen35moe)
    m, plain = models
    E = m.cfg.n_expert
    for il, lw in enumerate(m.blk):
        p, ex = f"blk.{il}.", lw.ffn
        assert ex.gate_inps is m.lin[p + "ffn_gate_inps"] and ex.gate_inps.w.rows == E + 1
        assert ex.router is m.lin[p + "ffn_gate_inp"] and ex.shared_gate is m.lin[p + "ffn_gate_inp_shexp"]
        assert ex.router.w.rows == E and ex.shared_gate.w.rows == 1
        assert ex.router.w.buffer is ex.shared_gate.w.buffer is ex.gate_inps.w.buffer  # one allocation
        stacked = host_bytes(ex.gate_inps.w)
        for lin, rows in ((ex.router, stacked[:E]), (ex.shared_gate, stacked[E:])):
            raw = mf.tensors[lin.name + ".weight"].data.view(np.uint8).reshape(lin.w.rows, -1)
            assert np.array_equal(rows, raw) and np.array_equal(host_bytes(lin.w), raw)
    assert all(lw.ffn.gate_inps is None for lw in plain.blk) and not any(n.endswith("ffn_gate_inps") for n in plain.w)


def record_launches(monkeypatch, run: bool) -> list:
    """The names of the kernels every impnb module launches from now on, run or (run False) not."""
    import impnb.launch

    names, original = [], impnb.launch.launch

    def launch(kernel, *args, **kwargs):
        names.append(kernel.__name__)
        if run:
            original(kernel, *args, **kwargs)

    for mod_name, module in list(sys.modules.items()):
        if mod_name.startswith("impnb") and getattr(module, "launch", None) is original:
            monkeypatch.setattr(module, "launch", launch)
    return names


def test_decode_with_the_gate_folded(qwen35moe, models, monkeypatch):
    """One token (test_gemv_gated.py and test_moe.py here take T up to 8 through the two kernels;
    the simulator takes about a minute a token through a layer's FFN): the folded decode's
    launches are the unfolded one's less the gate's GEMV and sigmoid_gate, the shared down on the
    gated GEMV (the unfolded one recorded, not run), and its output the reference's."""
    folded, plain = models
    ref = load_reference(open_model_file(qwen35moe))
    cfg, il = folded.cfg, 0
    x0 = (np.random.default_rng(2).standard_normal((1, cfg.n_embd)) * 2).astype(np.float32)
    launched = []
    for m, run in ((plain, False), (folded, True)):
        with monkeypatch.context() as mp:
            names = record_launches(mp, run)
            x = cuda.to_device(x0)
            moe_ffn_decode(m, x, m.blk[il].ffn, (m.blk[il].ffn.norm, cfg.eps))
        launched.append(names)
    apart, together = launched
    assert "_gemv_gated_kernel" in together and "_sigmoid_gate_kernel" not in together
    assert "_gemv_gated_kernel" not in apart and "_sigmoid_gate_kernel" in apart
    assert len(together) == len(apart) - 2, launched  # the gate's GEMV and sigmoid_gate
    got = x.copy_to_host() - x0
    want = layers.moe_shared_ffn(ref.ops, il, ref.ops.norm(x0, f"blk.{il}." + ref.layers[il].ffn_norm))
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-3 * scale, np.abs(got - want).max() / scale
