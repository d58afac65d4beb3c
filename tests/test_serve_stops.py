"""Stop strings (StopMatcher alone, and through LLMEngine across token boundaries) and
log-probabilities from the host's logits and from a runner that samples itself, on a tiny random
model."""

import math

import numpy as np
import pytest

from impnb.errors import ParameterError
from impnb.serve.cpu_runner import CpuRunner
from impnb.serve.engine import LLMEngine
from impnb.serve.runner import StepOutput
from impnb.serve.stops import StopMatcher, check_stops
from tests.tiny_models import write_tiny_model


def feed(stops, chunks):
    m = StopMatcher(tuple(stops))
    out, stopped = [], False
    for c in chunks:
        text, stopped = m.push(c)
        out.append(text)
        if stopped:
            break
    if not stopped:
        out.append(m.flush())
    return out, stopped


def test_a_stop_string_split_over_chunks_is_found_and_never_shown():
    out, stopped = feed(["STOP"], ["abc S", "T", "OP tail"])
    assert stopped and "".join(out) == "abc "
    assert out == ["abc ", "", ""]  # "S" and "ST" held back until they could not grow


def test_held_text_is_released_when_it_cannot_be_a_stop():
    out, stopped = feed(["STOP"], ["xS", "Tx", "y"])
    assert not stopped and out == ["x", "STx", "y", ""]


def test_the_earliest_of_several_stops_wins_and_flush_releases_the_tail():
    assert feed(["cd", "b"], ["abcd"]) == (["a"], True)
    assert feed(["xyz"], ["abxy"]) == (["ab", "xy"], False)


def test_check_stops():
    assert check_stops(None) == () and check_stops("a") == ("a",) and check_stops(["a", "b"]) == ("a", "b")
    for bad in ([""], [1], {"a": 1}, ["a"] * 17):
        with pytest.raises(ParameterError):
            check_stops(bad)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from impnb import LLM

    return LLM(str(write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama")), device="cpu", n_ctx=64)


def run(llm, prompt, params, **kw):
    rid = llm.engine.add_request(prompt, params, **kw)
    deltas = []
    while llm.engine.has_unfinished_requests():
        deltas += [d for d in llm.engine.step() if d.request_id == rid]
    return deltas, llm.engine.completion(rid)


def test_engine_stop_string_across_token_boundaries(llm):
    from impnb import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    deltas, full = run(llm, "hello the world", params)
    pieces = [d.text for d in deltas]
    k = next(i for i in range(1, len(pieces) - 1) if pieces[i] and pieces[i + 1])
    stop = pieces[k][-1] + pieces[k + 1][:1]  # the last character of one token and the first of the next
    expected = full.text[:full.text.index(stop)]
    deltas, c = run(llm, "hello the world", params, stop=[stop])
    assert c.text == expected == "".join(d.text for d in deltas)
    assert c.finish_reason == "stop" and deltas[-1].finish_reason == "stop"
    assert len(c.token_ids) <= k + 2
    assert llm.engine.blocks.n_free == len(llm.engine.blocks.blocks)


def test_engine_logprobs_from_the_logits(llm):
    from impnb import SamplingParams

    deltas, c = run(llm, "abc", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), logprobs=3)
    entries = [lp for d in deltas for lp in d.logprobs or ()]
    assert [e.token_id for e in entries] == c.token_ids
    for e in entries:
        assert e.logprob <= 0 and len(e.top) == 3
        assert e.top[0] == (e.token_id, e.logprob)  # greedy picks the most likely token
        assert e.top[0][1] >= e.top[1][1] >= e.top[2][1]
        assert math.exp(e.logprob) <= 1
    with pytest.raises(ParameterError, match="logprobs"):
        llm.engine.add_request("abc", logprobs=21)


def test_logprobs_need_a_runner_that_returns_logits(llm, monkeypatch):
    monkeypatch.setattr(llm.engine.runner, "returns_logits", False)
    with pytest.raises(ParameterError, match="logprobs are not available"):
        llm.engine.add_request("abc", logprobs=0)
    assert not llm.engine.has_unfinished_requests()


class SamplingCpuRunner(CpuRunner):
    """The reference as a runner that samples itself (greedy) and returns the raw logits of the
    rows that ask only, the contract of the GPU's batched runner; it records which rows asked."""

    returns_logits = False
    logits_on_request = True

    def __init__(self, model, n_blocks):
        super().__init__(model, n_blocks)
        self.asked: list[tuple[int, bool]] = []

    def execute(self, step):
        logits = super().execute(step).logits
        rows = [r for r in step.rows if r.sample]
        self.asked += [(r.seq_id, r.logprobs) for r in rows]
        return StepOutput(tokens=[int(np.argmax(x)) for x in logits],
                          logprob_logits=[x.copy() if r.logprobs else None for r, x in zip(rows, logits)])


def test_logprobs_from_a_runner_that_samples_equal_the_host_logits_ones(llm):
    from impnb import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    host_deltas, host = run(llm, "abc", params, logprobs=4)
    runner = SamplingCpuRunner(llm.engine.runner.model, 16)
    engine = LLMEngine(runner, llm.tokenizer, 64)
    a = engine.add_request("abc", params, logprobs=4)
    b = engine.add_request("xyz", params)  # beside it, asking none
    seq_a = engine.requests[a].seq.seq_id
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step()
    got = [lp for d in deltas if d.request_id == a for lp in d.logprobs or ()]
    want = [lp for d in host_deltas for lp in d.logprobs or ()]
    assert engine.completion(a).token_ids == host.token_ids and len(got) == 5
    assert [(e.token_id, e.logprob, e.top) for e in got] == [(e.token_id, e.logprob, e.top) for e in want]
    assert all(not d.logprobs for d in deltas if d.request_id == b)
    assert sorted({asked for _, asked in runner.asked}) == [False, True]
    assert all(asked == (s == seq_a) for s, asked in runner.asked)
