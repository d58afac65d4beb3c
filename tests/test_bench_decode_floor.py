"""scripts/bench_decode_floor.py: its phases read the bytes `bench` counts a token (the router as
its fp16 fold, the KV cache besides), and its kernels build for sm_90 without spills."""

import sys
from pathlib import Path

import pytest
from numba import types

from impnb.commands.bench import bytes_per_token
from impnb.gguf_file import open_model_file
from impnb.kernels.common.build_info import runtime_info
from impnb.models import model_config
from impnb.synthetic import tiny_gguf

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

import bench_decode_floor as floor  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_without_spare_copies")


def test_phases_read_the_bound_s_weights(tmp_path):
    _, path = tiny_gguf("qwen3moe", "Q8_0", tmp_path)
    mf = open_model_file(path)
    cfg = model_config(mf)
    pb = floor.phase_bytes(mf, cfg, ctx=7)
    nbytes = {name: t.data.nbytes for name, t in mf.tensors.items()}
    fold = cfg.n_layer * 2 * cfg.n_expert * (cfg.n_embd + cfg.n_head * cfg.head_dim)
    rest = sum(n for name, n in nbytes.items() if "norm" in name or "ffn_gate_inp" in name)
    rest += nbytes["token_embd.weight"] // cfg.n_vocab
    assert pb["kv"] == cfg.n_layer * 7 * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * 2
    assert sum(pb.values()) - pb["kv"] - fold + rest == bytes_per_token(mf, cfg)


def test_kernels_build_for_sm90():
    a = lambda dt: types.Array(dt, 1, "C")
    step = (a(types.uint32), a(types.float32), a(types.float32), a(types.uint32), a(types.uint32),
            a(types.int64), a(types.int64)) + (types.int32,) * 4
    for kernel, sig in ((floor._step, step), (floor._link, (a(types.float32), types.int32))):
        info = runtime_info(kernel, sig)
        assert info.spill_bytes == 0 and info.registers <= 255, (kernel, info)
