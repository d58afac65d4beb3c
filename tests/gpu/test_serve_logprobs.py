"""Log-probabilities on the batched CUDA runner (the GPU samples; the rows that ask get their raw
logits back) against the numpy reference's log-softmax, teacher-forced on the tokens generated,
on a tiny random qwen3: greedy, seeded and repeat-penalized rows (their logits are kept before the
penalty rewrites them) in one batch beside a row that asks none."""

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.sampling import SamplingParams, apply_repeat_penalty
from impnb.serve.llm import LLM
from impnb.synthetic import tiny_gguf

pytestmark = pytest.mark.gpu

TOP = 5
PENALTY = 20.0  # large, so that penalized and raw log-probabilities differ by far more than the tolerance


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _, path = tiny_gguf("qwen3", "Q8_0", tmp_path_factory.mktemp("tiny"), seed=6)
    return path, load_reference(open_model_file(path))


def log_softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def reference_logits(ref, prompt, generated) -> np.ndarray:
    ids = np.array(prompt + generated)
    return ref.forward(ids, ref.new_cache(len(ids)))[len(prompt) - 1:len(ids) - 1]


def run(llm, requests):
    """requests: (prompt ids, params, logprobs) -> (generated ids, their TokenLogprobs) each."""
    ids = [llm.engine.add_request(p, params, logprobs=lp) for p, params, lp in requests]
    entries = {i: [] for i in ids}
    while llm.engine.has_unfinished_requests():
        for d in llm.engine.step():
            entries[d.request_id] += d.logprobs or []
    return [(llm.engine.completion(i).token_ids, entries[i]) for i in ids]


def test_logprobs_match_the_reference_log_softmax(tiny):
    path, ref = tiny
    llm = LLM(str(path), device="cuda", n_ctx=256, kv_cache_tokens=2048, max_num_seqs=8,
              max_num_batched_tokens=64)
    rng = np.random.default_rng(7)
    ps = [rng.integers(0, ref.cfg.n_vocab, n).tolist() for n in (1, 9, 100, 40, 23)]
    n_gen = 12
    greedy = SamplingParams(temperature=0.0, max_tokens=n_gen, ignore_eos=True)
    seeded = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5, max_tokens=n_gen,
                            ignore_eos=True)
    penalized = SamplingParams(temperature=0.0, repeat_penalty=PENALTY, max_tokens=n_gen, ignore_eos=True)
    requests = [(ps[0], greedy, TOP), (ps[1], seeded, TOP), (ps[2], penalized, TOP), (ps[3], greedy, None),
                (ps[4], penalized, 0)]
    out = run(llm, requests)
    assert llm.engine.blocks.n_free == len(llm.engine.blocks.blocks)
    assert out[3][1] == []  # asked none
    penalty_gap = 0.0
    for (prompt, params, top), (generated, entries) in zip(requests, out):
        if top is None:
            continue
        assert [e.token_id for e in entries] == generated and len(generated) == n_gen
        logits = reference_logits(ref, prompt, generated)
        want = log_softmax(logits)
        tol = 1e-2 * float(np.abs(logits).max())  # the GPU's fp16 activations against float32
        for t, e in enumerate(entries):
            assert abs(e.logprob - want[t, e.token_id]) <= tol, (t, e.logprob, want[t, e.token_id])
            assert len(e.top) == top
            kth = np.sort(want[t])[::-1][top - 1] if top else 0.0
            for rank, (tok, lp) in enumerate(e.top):
                assert abs(lp - want[t, tok]) <= tol, (t, tok, lp, want[t, tok])
                assert want[t, tok] >= kth - 2 * tol  # listed alternatives are the best ones
                assert rank == 0 or lp <= e.top[rank - 1][1]
            if params.greedy and params.repeat_penalty == 1.0 and top:
                assert e.top[0][1] == e.logprob or abs(e.top[0][1] - e.logprob) <= tol  # ties aside
        if params.repeat_penalty != 1.0:
            seq = prompt + generated
            for t in range(n_gen):
                seen = seq[max(0, len(prompt) + t - params.repeat_last_n):len(prompt) + t]
                pen = log_softmax(apply_repeat_penalty(logits[t], seen, params.repeat_penalty))
                penalty_gap = max(penalty_gap, abs(pen[generated[t]] - want[t, generated[t]]) - tol)
    assert penalty_gap > 0  # the penalized rows would have failed had their logits not been kept raw
