"""A tensor-parallel rank's launches on the simulator, recorded without running them
(launch_trace.py) with a stand-in group for NCCL: every launcher takes the rank's shapes (its
heads, its FFN and expert width), each layer all-reduces twice on the model's stream (after
attn_output and after the FFN's down), the logits (a slice of the vocabulary each) are gathered
once a forward, and each sample broadcasts rank 0's id; rank 1's launches
are rank 0's but for the accumulate flags of the linears before a fused decode all-reduce."""

import types as pytypes

import numpy as np
import pytest

from impnb.synthetic import tiny_gguf
from tests.sim import launch_trace
from tests.sim.launch_trace import DP4A, WRAPPED, FakeCublas, FakeGraph, FakeReplays, Recorder, script_decode


def record_launches(holder: list, monkeypatch) -> None:
    """launch_trace's patch_launches and patch_wrappers into the recorder holder[0], undone after
    the test (other files of the simulator's run launch for real)."""
    import importlib
    import pkgutil
    import sys

    import impnb.kernels
    import impnb.launch

    for mod in pkgutil.walk_packages(impnb.kernels.__path__, "impnb.kernels."):
        importlib.import_module(mod.name)
    monkeypatch.setattr(launch_trace, "_current", holder)
    originals = {"launch": impnb.launch.launch}
    import impnb.kernels.attention.attention_wgmma as aw
    import impnb.kernels.gemm.gemm_tc_quant as tq
    import impnb.kernels.gemm.gemm_wgmma_quant as wq

    originals.update(gemm_quant=tq.gemm_quant, gemm_wgmma_quant=wq.gemm_wgmma_quant, attention_wgmma=aw.attention_wgmma)
    assert set(originals) == {"launch", *WRAPPED}

    def launch(*args, **kwargs):
        holder[-1].launch(*args, **kwargs)

    def wrapper(name):
        def call(*args, **kwargs):
            rec = holder[-1]
            rec.calls.append({"wrapper": name, "args": [rec.value(a) for a in args], "kwargs": rec.value(kwargs)})
        return call
    for mod_name, module in list(sys.modules.items()):
        if not mod_name.startswith("impnb"):
            continue
        for name, fn in originals.items():
            if getattr(module, name, None) is fn:
                monkeypatch.setattr(module, name, launch if name == "launch" else wrapper(name))


class FakeGroup:
    """TensorParallel's collectives, recorded into the trace."""

    def __init__(self, rank, rec):
        self.rank, self.world, self.local_rank, self.rec = rank.rank, rank.world, rank.local_rank, rec

    @property
    def leader(self):
        return self.rank == 0

    def all_reduce(self, buf):
        assert buf.dtype == np.float32 and buf.is_c_contiguous()
        self.rec.calls.append({"all_reduce": self.rec.value(buf)})

    def all_gather(self, part, whole):
        assert whole.size == self.world * part.size and part.is_c_contiguous() and whole.is_c_contiguous()
        self.rec.calls.append({"all_gather": [self.rec.value(part), self.rec.value(whole)]})

    def broadcast(self, buf, root=0):
        self.rec.calls.append({"broadcast": self.rec.value(buf)})


HOLDER: list = []  # the recorder launches go to, while a test's patches hold


@pytest.fixture(autouse=True)
def _fresh_holder():
    HOLDER.clear()
    yield
    HOLDER.clear()


def trace(path, rank: int, env: dict, monkeypatch, graphs=False):
    import impnb.engine_cuda as engine_cuda
    from impnb.gguf_file import open_model_file
    from impnb.parallel.ranks import Rank
    from impnb.sampling import SamplingParams

    rec = Recorder()
    if not HOLDER:
        record_launches(HOLDER, monkeypatch)
    HOLDER[:] = [rec]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(engine_cuda.TensorParallel, "join",
                        classmethod(lambda cls, r, ctx: FakeGroup(r, rec)))
    engine = engine_cuda.CudaEngine(open_model_file(path), 64, graphs=False, tp=Rank(rank, 2, rank, "x", 1))
    dev = engine.m
    dev.cublas = dev.mm.cublas = FakeCublas(rec)
    dev.ctx.device = pytypes.SimpleNamespace(compute_capability=(9, 0))
    if graphs:
        monkeypatch.setattr(engine_cuda, "Graph", FakeGraph)
        engine.use_graphs, engine.graph_disabled, engine.replays = True, None, FakeReplays()
    engine._checked = lambda token: token & 0xFFFF
    engine.reset(SamplingParams(temperature=0))
    script_decode(engine)
    return engine, rec.calls


def _forwards(calls) -> list[list]:
    """The calls between one embedding launch and the next (one forward each)."""
    out = []
    for c in calls:
        if "kernel" in c and "embedding" in c["kernel"][1]:
            out.append([])
        if out:
            out[-1].append(c)
    return out


def _without_accumulate(calls):
    """calls with the GEMV's accumulate flags (an np.int32 / bool scalar argument) blanked."""
    def blank(c):
        if "kernel" not in c:
            return c
        return {**c, "args": [a if not (isinstance(a, list) and len(a) == 2 and a[0] in ("<i4", "|b1"))
                              else "scalar" for a in c["args"]]}
    return [blank(c) for c in calls]


@pytest.mark.parametrize("arch,qtype,env,moe_ff", [
    ("qwen3", "Q8_0", {}, 32), ("qwen3", "Q8_0", DP4A, 32), ("qwen3moe", "Q8_0", {}, 64),
    ("qwen3moe", "Q8_0", DP4A, 32), ("qwen3", "Q8_0_V_Q4_1", {}, 32)],
    ids=["qwen3-Q8_0", "qwen3-Q8_0-dp4a", "qwen3moe-Q8_0-width", "qwen3moe-Q8_0-experts-dp4a", "qwen3-Q8_0_V_Q4_1"])
def test_rank_launches(arch, qtype, env, moe_ff, tmp_path, monkeypatch):
    """(qwen3moe: experts 64 wide split by width, 32 wide by whole experts.)"""
    _, path = tiny_gguf(arch, qtype, tmp_path, seed=1, moe_ff=moe_ff)
    e0, calls0 = trace(path, 0, env, monkeypatch)
    e1, calls1 = trace(path, 1, env, monkeypatch)
    by_expert = arch == "qwen3moe" and moe_ff == 32
    assert (e1.m.expert_range == (4, 4)) if by_expert else e1.m.expert_range is None
    localized = [c for c in calls1 if "kernel" in c and c["kernel"][1] == "_localize_kernel"]
    assert (len(localized) > 0) == by_expert
    if by_expert:  # rank 1's range in its launches, rank 0's in rank 0's
        assert all(c["args"][2:] == [["<i4", 4], ["<i4", 4]] for c in localized)
    cfg, full = e1.m.cfg, e1.m.full_cfg
    assert (cfg.n_head, cfg.n_head_kv) == (full.n_head // 2, max(1, full.n_head_kv // 2))
    assert e1.m.kv.k[0].shape[-2:] == e0.m.kv.k[0].shape[-2:]
    forwards = _forwards(calls1)
    assert len(forwards) >= 8
    for f in forwards:
        reduces = [c for c in f if "all_reduce" in c]
        assert len(reduces) == 2 * full.n_layer, [list(c)[0] for c in f]
    assert sum("broadcast" in c for c in calls1) == sum("broadcast" in c for c in calls0) >= 5
    assert e1.m.vocab_split and e1.m.output.w.rows == full.n_vocab // 2
    assert all(sum("all_gather" in c for c in f) == 1 for f in forwards)  # the logits, one gather a forward
    assert len(calls0) == len(calls1)
    assert _without_accumulate(calls0) == _without_accumulate(calls1)


def test_rank_launches_in_graphs(tmp_path, monkeypatch):
    """With graphs captured (as on an H100): the all-reduces and the broadcast inside the capture."""
    _, path = tiny_gguf("qwen3", "Q8_0", tmp_path, seed=1)
    _, calls = trace(path, 1, {}, monkeypatch, graphs=True)
    spans, open_at = [], {}
    for i, c in enumerate(calls):
        if "capture" in c:
            open_at[c["capture"]] = i
        elif "captured" in c:
            spans.append(calls[open_at.pop(c["captured"]):i])
    assert len(spans) >= 2  # a prefill graph and a decode graph
    assert all(sum("all_reduce" in c for c in g) == 2 * 3 for g in spans)
    assert sorted(sum("broadcast" in c for c in g) for g in spans)[-1] == 1  # the decode graph samples


@pytest.mark.parametrize("arch,moe_ff", [("qwen3", 32), ("qwen3moe", 32)])
def test_batched_rank_launches(arch, moe_ff, tmp_path, monkeypatch):
    """The batched engine on rank 1 of 2: prompts, then a decode step of three sequences; every
    forward all-reduces twice a layer, the logits stay whole (no gather), each sample broadcasts."""
    import impnb.engine_cuda as engine_cuda
    from impnb.engine_batch import CudaBatchEngine, DecodeRow
    from impnb.gguf_file import open_model_file
    from impnb.parallel.ranks import Rank
    from impnb.sampling import SamplingParams

    _, path = tiny_gguf(arch, "Q8_0", tmp_path, seed=1, moe_ff=moe_ff)
    rec = Recorder()
    record_launches(HOLDER, monkeypatch)
    HOLDER[:] = [rec]
    monkeypatch.setattr(engine_cuda.TensorParallel, "join", classmethod(lambda cls, r, ctx: FakeGroup(r, rec)))
    engine = CudaBatchEngine(open_model_file(path), 64, kv_tokens=192, max_batch=4, graphs=False,
                             tp=Rank(1, 2, 1, "x", 1))
    engine.m.cublas = engine.m.mm.cublas = FakeCublas(rec)
    engine.m.ctx.device = pytypes.SimpleNamespace(compute_capability=(9, 0))
    engine._checked = lambda token: token & 0xFFFF
    assert not engine.m.vocab_split
    greedy = SamplingParams(temperature=0)
    pages = [np.arange(b * 2, b * 2 + 2, dtype=np.int32) for b in range(3)]  # 2 pages of 32 tokens
    for b in range(3):
        engine.prefill_seq(np.arange(3 + b, dtype=np.int32) + 1, 0, pages[b], greedy)
    engine.b_outs.copy_to_device(np.zeros(4, np.int32))  # nothing runs: the ids read back are these
    engine.decode([DecodeRow(5, 3 + b, pages[b], greedy, 1) for b in range(3)])
    forwards = _forwards(rec.calls)
    assert len(forwards) == 4
    assert all(sum("all_reduce" in c for c in f) == 2 * engine.m.full_cfg.n_layer for f in forwards)
    assert not any("all_gather" in c for c in rec.calls)
    assert sum("broadcast" in c for c in rec.calls) == 4
