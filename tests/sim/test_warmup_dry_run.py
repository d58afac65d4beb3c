"""The warm-up's dry run (impnb/warmup.py) drives the CUDA engine through its load, every prompt
bucket and every context bucket under each sampler configuration, recording launches and making
none; here on the simulator's device arrays, at a non-wgmma target."""

from types import SimpleNamespace

import pytest

from impnb.errors import UnsupportedError
from impnb.gguf_file import open_model_file
from impnb.launch import precompile
from impnb.parallel.shard import TP_ARCHS
from impnb.synthetic_full import Shape, write_full_gguf
from impnb import warmup

SHAPES = {"qwen3": Shape("qwen3", 1, 256, 512, 4, 2, 64, 512),
          "qwen3moe": Shape("qwen3moe", 1, 256, 512, 4, 2, 64, 512, 8, 2, 128),
          "qwen35moe": Shape("qwen35moe", 2, 256, 0, 4, 2, 256, 512, 8, 2, 128, shared_expert_intermediate_size=128,
                             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                             linear_value_head_dim=32, full_attention_interval=2, partial_rotary_factor=0.25,
                             mrope_section=(11, 11, 10))}


@pytest.mark.parametrize("tp_world", [1, 2], ids=["tp1", "tp2"])
@pytest.mark.parametrize("arch", SHAPES)
def test_dry_run_records_every_phase_and_launches_nothing(arch, tp_world, tmp_path, monkeypatch):
    """(tp2: a tensor-parallel rank's load and steps, its collectives inert; the qwen35 family has
    no tensor-parallel layout and is refused.)"""
    path = tmp_path / f"{arch}.gguf"
    write_full_gguf(path, SHAPES[arch], "Q8_0")
    monkeypatch.setattr("impnb.gpu.context.GpuContext.device",
                        SimpleNamespace(compute_capability=(8, 0)), raising=False)
    launched = []

    def note(self, kernel, args):  # the simulator's arrays have no numba signature: names stand in
        launched.append(kernel.__name__)
        self.jobs.setdefault(kernel.__name__, (kernel, None))

    monkeypatch.setattr(precompile.Recorder, "__call__", note)
    if tp_world > 1 and arch not in TP_ARCHS:
        with pytest.raises(UnsupportedError, match="no tensor-parallel layout"):
            warmup.dry_run(open_model_file(path), 2048, (8, 0, ""), tp_world)
        return
    rec = warmup.dry_run(open_model_file(path), 2048, (8, 0, ""), tp_world)
    names = set(rec.jobs)
    assert {"_embedding_kernel", "_argmax_kernel", "_pick_kernel", "_penalty_kernel", "_push_kernel",
            "_advance_kernel", "_gather_row_kernel"} <= names  # prompt, sampler, graph body
    assert any("decode_short" in n for n in names)  # decode attention
    assert any("fa2" in n for n in names)  # prompt attention
    if arch in ("qwen3moe", "qwen35moe"):
        assert {"_route_kernel", "_group_kernel", "_combine_kernel"} <= names
    if arch == "qwen35moe":  # the DeltaNet layers at decode and prefill, the gates
        assert {"_conv1d_kernel", "_gdn_decode_kernel", "_gdn_prefill_kernel", "_sigmoid_gate_kernel"} <= names
    import impnb.launch

    assert impnb.launch.recorder is None


@pytest.mark.parametrize("variant", ["dense", "moe", "wide"])
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
    if variant == "wide":  # heads of 512: decode on FA2's decode form (DECODE_TC), prompt chunks on FA2's output slices
        assert any(n.startswith("_fa2_decode_d512") for n in names) and any(n.startswith("_fa2_d512_v256") for n in names)


def test_dry_run_records_the_batch_buckets(tmp_path, monkeypatch):
    """With max_batch: the batched engine's decode step at every bucket up to it is recorded too
    (the tensor-core attention of a batch past SHORT_DECODE_MAX_BATCH, the batch sampler), none
    launched; a model the batched engine refuses (recurrent state) records its single steps only."""
    launched = []

    def note(self, kernel, args):
        launched.append(kernel.__name__)
        self.jobs.setdefault(kernel.__name__, (kernel, None))

    monkeypatch.setattr(precompile.Recorder, "__call__", note)
    monkeypatch.setattr("impnb.gpu.context.GpuContext.device",
                        SimpleNamespace(compute_capability=(8, 0)), raising=False)
    path = tmp_path / "qwen3.gguf"
    write_full_gguf(path, SHAPES["qwen3"], "Q8_0")
    single = set(warmup.dry_run(open_model_file(path), 1024, (8, 0, "")).jobs)
    batched = set(warmup.dry_run(open_model_file(path), 1024, (8, 0, ""), max_batch=16).jobs)
    assert single < batched
    assert any(n.startswith("_decode_mma") for n in batched)
    path = tmp_path / "qwen35moe.gguf"
    write_full_gguf(path, SHAPES["qwen35moe"], "Q8_0")
    assert set(warmup.dry_run(open_model_file(path), 1024, (8, 0, ""), max_batch=16).jobs) \
        == set(warmup.dry_run(open_model_file(path), 1024, (8, 0, "")).jobs)


def test_dry_run_marks_the_first_tokens_kernels(tmp_path, monkeypatch):
    """With a sampler configuration given, the pairs before the mark are the load's and the
    prompt's under that configuration: a greedy first token needs no sampling kernel, and the
    decode graph's body comes after the mark."""
    from impnb.sampling import SamplingParams

    path = tmp_path / "qwen3.gguf"
    write_full_gguf(path, SHAPES["qwen3"], "Q8_0")
    monkeypatch.setattr("impnb.gpu.context.GpuContext.device",
                        SimpleNamespace(compute_capability=(8, 0)), raising=False)

    def note(self, kernel, args):
        self.jobs.setdefault(kernel.__name__, (kernel, None))

    monkeypatch.setattr(precompile.Recorder, "__call__", note)
    greedy = warmup.dry_run(open_model_file(path), 2048, (8, 0, ""), first=SamplingParams(temperature=0))
    sampled = warmup.dry_run(open_model_file(path), 2048, (8, 0, ""), first=SamplingParams(temperature=0.8))
    for rec in (greedy, sampled):
        names = list(rec.jobs)
        first, rest = set(names[:rec.first]), set(names[rec.first:])
        assert "_embedding_kernel" in first and any("fa2" in n for n in first)
        assert "_advance_kernel" in rest  # the decode graph's device-side advance
    greedy_first, sampled_first = set(list(greedy.jobs)[:greedy.first]), set(list(sampled.jobs)[:sampled.first])
    assert "_argmax_kernel" in greedy_first and "_pick_kernel" not in greedy_first
    assert "_pick_kernel" in sampled_first
    assert set(greedy.jobs) == set(sampled.jobs)
