"""The warm-up's dry run (impnb/warmup.py) drives the CUDA engine through its load, every prompt
bucket and every context bucket under each sampler configuration, recording launches and making
none; here on the simulator's device arrays, at a non-wgmma target."""

from types import SimpleNamespace

import pytest

from impnb.gguf_file import open_model_file
from impnb.launch import precompile
from impnb.synthetic_full import Shape, write_full_gguf
from impnb import warmup

SHAPES = {"qwen3": Shape("qwen3", 1, 256, 512, 4, 2, 64, 512),
          "qwen3moe": Shape("qwen3moe", 1, 256, 512, 4, 2, 64, 512, 8, 2, 128)}


@pytest.mark.parametrize("arch", SHAPES)
def test_dry_run_records_every_phase_and_launches_nothing(arch, tmp_path, monkeypatch):
    path = tmp_path / f"{arch}.gguf"
    write_full_gguf(path, SHAPES[arch], "Q8_0")
    monkeypatch.setattr("impnb.gpu.context.GpuContext.device",
                        SimpleNamespace(compute_capability=(8, 0)), raising=False)
    launched = []

    def note(self, kernel, args):  # the simulator's arrays have no numba signature: names stand in
        launched.append(kernel.__name__)
        self.jobs.setdefault(kernel.__name__, (kernel, None))

    monkeypatch.setattr(precompile.Recorder, "__call__", note)
    rec = warmup.dry_run(open_model_file(path), 2048, (8, 0, ""))
    names = set(rec.jobs)
    assert {"_embedding_kernel", "_argmax_kernel", "_pick_kernel", "_penalty_kernel", "_push_kernel",
            "_advance_kernel", "_gather_row_kernel"} <= names  # prompt, sampler, graph body
    assert any("decode_short" in n for n in names)  # decode attention
    assert any("fa2" in n for n in names)  # prompt attention
    if arch == "qwen3moe":
        assert {"_route_kernel", "_group_kernel", "_combine_kernel"} <= names
    import impnb.launch

    assert impnb.launch.recorder is None


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_dry_run_of_gemma4(variant, tmp_path, monkeypatch):
    """gemma4's own layer loop through the same dry run: its kernels recorded, none launched."""
    from impnb.synthetic_full_gemma4 import TINY_SHAPES, write_full_gguf as write_gemma4

    path = tmp_path / f"gemma4-{variant}.gguf"
    write_gemma4(path, TINY_SHAPES[variant], workers=1)
    monkeypatch.setattr("impnb.gpu.context.GpuContext.device",
                        SimpleNamespace(compute_capability=(8, 0)), raising=False)
    launched = []

    def note(self, kernel, args):
        launched.append(kernel.__name__)
        self.jobs.setdefault(kernel.__name__, (kernel, None))

    monkeypatch.setattr(precompile.Recorder, "__call__", note)
    names = set(warmup.dry_run(open_model_file(path), 1024, (8, 0, "")).jobs)
    assert {"_softcap_kernel", "_qkv_post_kernel"} <= names
    assert any("fa2" in n for n in names) and any("decode_short" in n for n in names)
    if variant == "dense":  # PLE; Q alone on shared layers; the output scale with the next norm
        assert {"_per_layer_inputs_kernel", "_rope_kernel", "_scale_rms_norm_kernel"} <= names
    else:
        assert {"_expert_scale_kernel", "_route_kernel", "_combine_kernel", "_moe_layer_end_kernel"} <= names
