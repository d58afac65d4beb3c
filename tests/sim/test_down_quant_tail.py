"""DOWN_QUANT_TAIL's wiring on the simulator (launches recorded, none run): a tiny qwen3moe with
every decode GEMV on dp4a; each layer's routed experts' down kernel takes the tail, whose int8
buffers are the ones the next layer's Q|K|V GEMV reads, and a decode step makes one quantize_x
launch a layer fewer after the first. The tail's numbers: tests/sim/test_moe.py and
tests/gpu/test_moe.py (the kernel), tests/gpu/test_engine_moe.py (the engine)."""

import types as pytypes

from impnb.gguf_file import open_model_file
from impnb.sampling import SamplingParams
from impnb.synthetic import tiny_gguf
from tests.sim.launch_trace import FakeCublas, Recorder
from tests.sim.test_tp_trace import record_launches

STEPS = 2


def trace(path, monkeypatch, tail: bool) -> tuple:
    """(the launches of STEPS decode steps as (kernel name, args), the model's layers)."""
    from impnb.engine_cuda import CudaEngine

    for name, value in (("IMPNB_DP4A_MIN_MB", "0"), ("IMPNB_DP4A_MIN_K", "0"),
                        ("IMPNB_DOWN_QUANT_TAIL", "1" if tail else "0")):
        monkeypatch.setenv(name, value)
    engine = CudaEngine(open_model_file(path), 64, graphs=False)
    holder = [Recorder()]
    with monkeypatch.context() as mp:
        record_launches(holder, mp)
        engine.m.cublas = engine.m.mm.cublas = FakeCublas(holder[0])
        engine.m.ctx.device = pytypes.SimpleNamespace(compute_capability=(9, 0))
        engine._checked = lambda token: 1
        engine.reset(SamplingParams(temperature=0))
        for t in range(STEPS):
            engine.logits([3 + t])
    calls = [(c["kernel"][1].rsplit(".", 1)[-1], c["args"]) for c in holder[0].calls if "kernel" in c]
    return calls, engine.m.cfg.n_layer


def test_the_down_writes_what_the_next_qkv_reads(tmp_path, monkeypatch):
    _, path = tiny_gguf("qwen3moe", "Q8_0", tmp_path, seed=1)
    plain, n_layer = trace(path, monkeypatch, False)
    tailed, _ = trace(path, monkeypatch, True)
    count = lambda calls, *names: sum(n in names for n, _ in calls)  # noqa: E731
    quant = ("_quantize_x_kernel", "_quantize_x_norm_row_kernel")  # quantize_x's kernels (the pre-norm's by width)
    assert count(plain, *quant) - count(tailed, *quant) == STEPS * (n_layer - 1)
    assert count(tailed, "_down_sum_dp4a_tail_kernel") == STEPS * (n_layer - 1)
    assert count(tailed, "_down_sum_dp4a_kernel") == STEPS  # the last layer's: the logits' input follows
    assert count(plain, "_down_sum_dp4a_tail_kernel") == 0
    for i, (name, args) in enumerate(tailed):
        if name != "_down_sum_dp4a_tail_kernel":
            continue
        _, qkv_args = next(c for c in tailed[i + 1:] if c[0].startswith("_gemv_dp4a"))
        assert qkv_args[1:4] == args[8:11], "the next Q|K|V GEMV reads other int8 buffers than the tail wrote"
