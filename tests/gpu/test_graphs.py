"""Decode through the captured CUDA graph equals eager decode bit for bit; a failed capture
falls back to eager with its reason logged."""

import logging

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.sampling import SamplingParams
from impnb.tokenizer import Tokenizer

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
PROMPT = "The Eiffel Tower is located in the city of Paris. It was built for the World's Fair of"
N_STEPS = 64


def decode(engine, ids, params, n=N_STEPS):
    """(tokens, logits (n, V)) of n decode steps after the prompt."""
    engine.reset(params)
    token = engine.prefill(ids)
    tokens, rows = [token], []
    logits = engine.m.arena.get("logits", (1, engine.cfg.n_vocab))
    for _ in range(n):
        token = engine.step(token)
        tokens.append(token)
        rows.append(logits.copy_to_host()[0])
    return tokens, np.stack(rows)


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    path = request.getfixturevalue(f"{request.param}_path")
    mf = open_model_file(path)
    return mf, Tokenizer.from_metadata(mf.metadata).encode(PROMPT)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0),
                                    SamplingParams(temperature=0.8, seed=3, repeat_penalty=1.1)],
                         ids=["greedy", "sampled"])
def test_graph_replay_equals_eager(model, params):
    from impnb.engine_cuda import CudaEngine

    mf, ids = model
    eager = CudaEngine(mf, 512, graphs=False)
    graphed = CudaEngine(mf, 512, graphs=True, lookahead=False)  # logits read after each step
    t_eager, l_eager = decode(eager, ids, params)
    t_graph, l_graph = decode(graphed, ids, params)
    assert graphed.graphs and graphed.graph_disabled is None
    print(f"graph: {next(iter(graphed.graphs.values())).n_nodes} nodes")
    assert t_graph == t_eager
    assert np.array_equal(l_graph, l_eager)


def test_lookahead_equals_step_by_step(model):
    """Steps queued on the device's own token give the same tokens; feeding back another token
    drops the queued step and continues from the host's token."""
    from impnb.engine_cuda import CudaEngine

    mf, ids = model
    params = SamplingParams(temperature=0.8, seed=5, repeat_penalty=1.1)
    plain = CudaEngine(mf, 512, graphs=True, lookahead=False)
    ahead = CudaEngine(mf, 512, graphs=True, lookahead=True)
    assert decode(ahead, ids, params)[0] == decode(plain, ids, params)[0]
    forced = []
    for engine in (plain, ahead):
        engine.reset(params)
        token = engine.prefill(ids)
        out = []
        for i in range(24):
            token = engine.step(token if i != 12 else 1234)  # a forced token midway
            out.append(token)
        forced.append(out)
    assert forced[0] == forced[1]
    assert ahead.ahead is not None  # the last step queued one ahead


def test_context_bucket_change_mid_decode(model):
    """Decode from 220 to 284 tokens crosses the 256-key context bucket: a second graph with its
    own decode-attention split count takes over (the step queued ahead included), and the
    tokens and logits still equal eager decode's."""
    from impnb.engine_cuda import CudaEngine

    mf, ids = model
    ids = (ids * (220 // len(ids) + 1))[:220]
    params = SamplingParams(temperature=0)
    eager = CudaEngine(mf, 1024, graphs=False)
    graphed = CudaEngine(mf, 1024, graphs=True, lookahead=False)
    ahead = CudaEngine(mf, 1024, graphs=True, lookahead=True)
    t_eager, l_eager = decode(eager, ids, params)
    t_graph, l_graph = decode(graphed, ids, params)
    assert sorted(key[2] for key in graphed.graphs) == [256, 1024], graphed.graphs.keys()
    assert t_graph == t_eager and np.array_equal(l_graph, l_eager)
    assert decode(ahead, ids, params)[0] == t_eager


def test_capture_failure_falls_back_to_eager(model, monkeypatch, caplog):
    import impnb.engine_cuda as engine_cuda
    from impnb.graphs.capture import CaptureError

    def broken(*_):
        raise CaptureError("cuStreamBeginCapture failed: forced by test")

    mf, ids = model
    eager = engine_cuda.CudaEngine(mf, 512, graphs=False)
    monkeypatch.setattr(engine_cuda, "Graph", broken)
    fallback = engine_cuda.CudaEngine(mf, 512, graphs=True)
    with caplog.at_level(logging.WARNING, logger="impnb.engine"):
        t_fallback, _ = decode(fallback, ids, SamplingParams(temperature=0), 16)
    assert "disable_due_to_capture_failure" in caplog.text and "forced by test" in caplog.text
    assert not fallback.graphs
    assert t_fallback == decode(eager, ids, SamplingParams(temperature=0), 16)[0]


@pytest.mark.parametrize("n,n_ctx", [(5, 1024), (17, 1024), (300, 1024), (700, 1024), (590, 600)],
                         ids=["bucket16", "bucket32", "bucket512", "two-chunks", "past-n_ctx-eager"])
def test_prefill_graphs(model, n, n_ctx):
    """A prompt through chunk graphs (padded to their buckets) equals the same chunks run
    eagerly, bit for bit: the last logits row and the greedy continuation, on the bucket's
    first run (eager, then captured) and on its replay."""
    from impnb.engine_cuda import CudaEngine

    mf, ids = model
    prompt = (list(ids) * (n // len(ids) + 1))[:n]
    greedy = SamplingParams(temperature=0)

    def run(engine):
        engine.reset(greedy)
        token = engine.prefill(prompt)
        logits = engine.m.arena.get("logits", (1, engine.cfg.n_vocab)).copy_to_host()[0]
        tokens = [token]
        for _ in range(8):
            tokens.append(engine.step(tokens[-1]))
        return tokens, logits

    eager = run(CudaEngine(mf, n_ctx, graphs=False))
    graphed = CudaEngine(mf, n_ctx, graphs=True, lookahead=False)
    first = run(graphed)
    replay = run(graphed)
    assert graphed.graph_disabled is None
    if n_ctx > n + 64:
        assert graphed.prefill_graphs, "no prefill graph was captured"
    for got in (first, replay):
        assert got[0] == eager[0] and np.array_equal(got[1], eager[1])
