"""The batched engine on the CPU runner: every sequence of a mixed batch gets what it gets alone.

Tiny random models (tests/tiny_models.py); the reference is each sequence run alone, teacher-forced
through models.ReferenceModel with its contiguous cache, and the single-sequence CpuEngine."""

from collections import defaultdict

import numpy as np
import pytest

from impnb.engine_cpu import CpuEngine
from impnb.generate import generate
from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.sampling import SamplingParams
from impnb.serve.cpu_runner import CpuRunner
from impnb.serve.engine import LLMEngine
from impnb.serve.runner import ModelRunner
from impnb.serve.single_runner import SingleSequenceRunner
from impnb.tokenizer import Tokenizer
from tests.tiny_models import write_tiny_model

N_CTX = 96
GREEDY = SamplingParams(temperature=0, max_tokens=12)


class Recording(ModelRunner):
    """A runner that keeps the logits of every sampled row, by sequence and position, and the
    shape of every step."""

    def __init__(self, inner: ModelRunner):
        self.inner = inner
        for name in ("device", "block_size", "n_blocks", "max_num_seqs", "chunked_prefill", "prefix_caching"):
            setattr(self, name, getattr(inner, name))
        self.logits = defaultdict(dict)  # seq_id -> {position: logits row}
        self.steps = []  # per step: [(seq_id, start, n rows)]

    def execute(self, step):
        out = self.inner.execute(step)
        self.steps.append([(r.seq_id, r.start, len(r.token_ids)) for r in step.rows])
        sampled = [r for r in step.rows if r.sample]
        if out.logits is not None:
            for r, row in zip(sampled, out.logits):
                self.logits[r.seq_id][r.start + len(r.token_ids) - 1] = row.copy()
        return out

    def finished(self, seq_id):
        self.inner.finished(seq_id)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("tiny"), request.param)
    mf = open_model_file(path)
    return mf, load_reference(mf), Tokenizer.from_metadata(mf.metadata)


def engine_for(tiny, kv_tokens=1024, budget=32, max_seqs=8, prefix_caching=True, block_size=8):
    mf, model, tok = tiny
    runner = Recording(CpuRunner(model, -(-kv_tokens // block_size), block_size))
    return LLMEngine(runner, tok, N_CTX, max_seqs, budget, prefix_caching), runner


def run(engine, script=None, max_steps=2000):
    """Step until done; script maps a step number to a callable run before that step."""
    script = script or {}
    for n in range(max_steps):
        if n in script:
            script[n]()
        elif not engine.has_unfinished_requests() and n > max(script, default=-1):
            return n
        engine.step()
    raise AssertionError("the engine did not finish")


def alone(tiny, prompt_ids, params) -> list[int]:
    """What the single-sequence CPU engine generates."""
    mf, _, tok = tiny
    tokens, _ = generate(CpuEngine(mf, N_CTX), tok, prompt_ids, params.max_tokens, params, lambda t: None)
    return tokens


def prompt(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def assert_teacher_forced(tiny, runner, seq):
    """The logits seq was sampled from equal those of its tokens run alone, position by position."""
    _, model, _ = tiny
    ids = seq.token_ids
    ref = model.forward(ids, model.new_cache(len(ids)))
    got = runner.logits[seq.seq_id]
    assert got and min(got) >= seq.n_prompt - 1
    for pos, row in got.items():
        np.testing.assert_allclose(row, ref[pos], rtol=0, atol=1e-4 * np.abs(ref).max(), err_msg=f"pos {pos}")


def all_free(engine) -> bool:
    bm = engine.blocks
    return bm.n_free == len(bm.blocks) and all(b.ref_count == 0 for b in bm.blocks)


MIXED = [  # prompt length, params
    (5, GREEDY),
    (40, SamplingParams(temperature=0.8, top_k=20, seed=1, max_tokens=10)),
    (17, SamplingParams(temperature=0, repeat_penalty=1.3, max_tokens=8)),
    (70, SamplingParams(temperature=1.1, top_p=0.9, min_p=0.0, seed=9, max_tokens=14)),
    (3, SamplingParams(temperature=0.5, seed=4, max_tokens=20, ignore_eos=True)),
]


def test_mixed_batch_matches_each_sequence_alone(tiny):
    engine, runner = engine_for(tiny)
    seqs = {}

    def add(i):
        n, params = MIXED[i]
        rid = engine.add_request(prompt(n, i), params)
        seqs[rid] = engine.requests[rid].seq

    script = {0: lambda: (add(0), add(1)), 3: lambda: add(2), 5: lambda: engine.abort("1"),
              6: lambda: add(3), 9: lambda: add(4)}
    run(engine, script)
    steps = runner.steps
    # prompts arrived in chunks beside decode steps, several sequences a step
    assert any(any(n > 1 for *_, n in s) and any(n == 1 for *_, n in s) for s in steps)
    assert max(len(s) for s in steps) >= 3
    long_prompt = seqs["3"].seq_id  # 70 tokens, in chunks of what the budget of 32 leaves
    assert len([n for s in steps for sid, _, n in s if sid == long_prompt and n > 1]) >= 3
    for rid, seq in seqs.items():
        assert_teacher_forced(tiny, runner, seq)
        result = engine.completion(rid)
        if rid == "1":
            assert result.finish_reason == "abort" and len(result.token_ids) < 10
        else:
            n, params = MIXED[int(rid)]
            assert result.token_ids == alone(tiny, prompt(n, int(rid)), params), rid
            assert result.finish_reason in ("length", "eog")
    assert all_free(engine)


def test_preemption_resumes_with_the_same_output(tiny):
    prompts = [(prompt(20 + 3 * i, 10 + i), SamplingParams(temperature=0.9 * (i % 2), seed=i, max_tokens=30,
                                                            ignore_eos=True)) for i in range(5)]
    roomy, _ = engine_for(tiny)
    ids = [roomy.add_request(p, params) for p, params in prompts]
    run(roomy)
    want = [roomy.completion(i).token_ids for i in ids]
    # a pool of one context: five sequences of ~50 tokens cannot all hold their blocks
    tight, runner = engine_for(tiny, kv_tokens=N_CTX, prefix_caching=False)
    ids = [tight.add_request(p, params) for p, params in prompts]
    seqs = [tight.requests[i].seq for i in ids]
    run(tight)
    assert sum(s.n_preempted for s in seqs) > 0
    for i, seq in zip(ids, seqs):
        assert_teacher_forced(tiny, runner, seq)
        assert tight.completion(i).token_ids == want[int(i)]
    assert all_free(tight)


def test_prefix_cache_hits_give_the_logits_of_misses(tiny):
    system = prompt(41, 77)
    suffixes = [prompt(3 + i, 90 + i) for i in range(4)]
    results = {}
    for caching in (True, False):
        engine, runner = engine_for(tiny, prefix_caching=caching)
        seqs = []

        def add(i):
            rid = engine.add_request(system + suffixes[i], GREEDY)
            seqs.append(engine.requests[rid].seq)

        # one alone, then one after it finished (its freed blocks), then two at once
        run(engine, {0: lambda: add(0), 20: lambda: add(1), 40: lambda: (add(2), add(3))})
        results[caching] = [(s.n_cached, s.output_ids, runner.logits[s.seq_id]) for s in seqs]
        assert all_free(engine)
    cached, plain = results[True], results[False]
    assert cached[0][0] == 0 and all(n == 40 for n, *_ in cached[1:])
    assert all(n == 0 for n, *_ in plain)
    for (_, ids_c, logits_c), (_, ids_p, logits_p) in zip(cached, plain):
        assert ids_c == ids_p
        for pos in logits_p:
            np.testing.assert_allclose(logits_c[pos], logits_p[pos], rtol=0,
                                       atol=1e-4 * np.abs(logits_p[pos]).max())


def test_seeded_sampling_whatever_the_batch(tiny):
    """One seeded request alone, among others joining, and among more with a pool that preempts."""
    target = (prompt(9, 5), SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=123,
                                           max_tokens=24, ignore_eos=True))
    outputs, preempted = [], 0
    for kv_tokens, others in ((1024, 0), (1024, 4), (N_CTX, 6)):
        engine, _ = engine_for(tiny, kv_tokens=kv_tokens, prefix_caching=False)
        seqs = []

        def add(p, params):
            seqs.append(engine.requests[engine.add_request(p, params)].seq)

        script = {2 * i: (lambda i=i: add(prompt(15 + 7 * i, i), SamplingParams(
            seed=i, max_tokens=25, ignore_eos=True))) for i in range(others)}
        script[1] = lambda: add(*target)
        run(engine, script)
        target_seq = next(s for s in seqs if s.params is target[1])
        outputs.append(target_seq.output_ids)
        preempted += sum(s.n_preempted for s in seqs)
    assert preempted > 0
    assert outputs[0] == outputs[1] == outputs[2] == alone(tiny, *target)


def test_single_sequence_runner_runs_batches_of_one(tiny):
    mf, _, tok = tiny
    runner = Recording(SingleSequenceRunner(CpuEngine(mf, N_CTX)))
    engine = LLMEngine(runner, tok, N_CTX, max_num_seqs=8)
    cases = [(prompt(6 + 5 * i, 30 + i), SamplingParams(seed=i, max_tokens=9)) for i in range(3)]
    ids = [engine.add_request(p, params) for p, params in cases]
    run(engine)
    assert max(len(s) for s in runner.steps) == 1
    for i, (p, params) in zip(ids, cases):
        assert engine.completion(i).token_ids == alone(tiny, p, params)
