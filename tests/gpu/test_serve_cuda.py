"""The serving engine on the batched CUDA runner (serve/cuda_runner.py): the LLM API with several
prompts at once on tiny random qwen3 / qwen3moe, judged by the numpy reference.

Each generated token must be the reference's choice given everything before it (teacher-forced
on the sequence generated), up to numerical ties: a token whose reference logit is within 1% of
the row's largest |logit| of the maximum counts as a tie. Covered: a mixed batch (prompt lengths
from 1 token to several chunks of the step budget), a pool so small that sequences are preempted
and recomputed, prefix-cache hits on a shared 70-token prefix, and every block free at the end.
"""

import numpy as np
import pytest

from impnb.errors import ParameterError
from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.sampling import SamplingParams, apply_penalties
from impnb.serve.llm import LLM
from impnb.synthetic import tiny_gguf

pytestmark = pytest.mark.gpu

N_CTX = 256


@pytest.fixture(scope="module", params=["qwen3", "qwen3moe"])
def tiny(request, tmp_path_factory):
    _, path = tiny_gguf(request.param, "Q8_0", tmp_path_factory.mktemp("tiny"), seed=6)
    return path, load_reference(open_model_file(path))


def prompts(ref, lengths, seed=0, prefix=()):
    rng = np.random.default_rng(seed)
    return [list(prefix) + rng.integers(0, ref.cfg.n_vocab, n).tolist() for n in lengths]


def assert_reference_choices(ref, prompt, generated):
    ids = np.array(prompt + generated)
    logits = ref.forward(ids, ref.new_cache(len(ids)))[len(prompt) - 1:len(ids) - 1]
    scale = np.abs(logits).max()
    chosen = logits[np.arange(len(generated)), generated]
    assert (logits.max(-1) - chosen <= 1e-2 * scale).all(), (generated, logits.argmax(-1).tolist())


def all_free(llm) -> bool:
    bm = llm.engine.blocks
    return bm.n_free == len(bm.blocks) and all(b.ref_count == 0 for b in bm.blocks)


def test_mixed_batch_follows_the_reference(tiny):
    path, ref = tiny
    llm = LLM(str(path), device="cuda", n_ctx=N_CTX, kv_cache_tokens=2048, max_num_seqs=8,
              max_num_batched_tokens=64)
    assert llm.engine.runner.__class__.__name__ == "CudaBatchRunner"
    ps = prompts(ref, (1, 9, 40, 100, 17, 3))
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    out = llm.generate(ps, params)
    for p, c in zip(ps, out):
        assert len(c.token_ids) == 20 and c.finish_reason == "length"
        assert_reference_choices(ref, p, c.token_ids)
    assert all_free(llm)


def test_preemption_in_a_small_pool(tiny):
    """Six sequences of up to 120 tokens in a pool of 10 pages (320 tokens): the newest are
    preempted and recomputed; their outputs still follow the reference."""
    path, ref = tiny
    llm = LLM(str(path), device="cuda", n_ctx=128, kv_cache_tokens=320, max_num_seqs=6,
              max_num_batched_tokens=64)
    ps = prompts(ref, (50, 60, 40, 70, 30, 55), seed=1)
    out = llm.generate(ps, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    assert sum(c.n_preempted for c in out) > 0
    for p, c in zip(ps, out):
        assert_reference_choices(ref, p, c.token_ids)
    assert all_free(llm)


def test_prefix_cache_hits(tiny):
    path, ref = tiny
    llm = LLM(str(path), device="cuda", n_ctx=N_CTX, kv_cache_tokens=2048, max_num_seqs=4)
    shared = prompts(ref, (70,), seed=2)[0]
    first = llm.generate([shared + [5, 6]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    ps = prompts(ref, (4, 11, 1), seed=3, prefix=shared)
    out = llm.generate(ps, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert first.n_cached_tokens == 0 and all(c.n_cached_tokens >= 64 for c in out)
    for p, c in zip(ps, out):
        assert_reference_choices(ref, p, c.token_ids)
    assert all_free(llm)


def test_seeded_sampling_whatever_the_batch(tiny):
    """A seeded request gives the same tokens alone and among others (dense model: each row's
    logits do not depend on its neighbours at one bucket; the draw holds no row index)."""
    path, ref = tiny
    if ref.cfg.n_expert:
        pytest.skip("routed experts group the batch's tokens")
    llm = LLM(str(path), device="cuda", n_ctx=N_CTX, kv_cache_tokens=2048, max_num_seqs=4)
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=123, max_tokens=12,
                       ignore_eos=True)
    mine = prompts(ref, (7,), seed=4)[0]
    others = prompts(ref, (5, 9, 3), seed=5)
    together = llm.generate([others[0], mine, others[1], others[2]], p)[1].token_ids
    pair = llm.generate([others[2], mine, others[0]], p)[1].token_ids
    assert together == pair


def test_bad_input(tiny):
    path, ref = tiny
    llm = LLM(str(path), device="cuda", n_ctx=64, kv_cache_tokens=256, max_num_seqs=4)
    with pytest.raises(ParameterError):
        llm.generate([])
    with pytest.raises(ParameterError):
        llm.generate([list(range(64))])
    with pytest.raises(ParameterError):
        llm.generate(["hello"], SamplingParams(temperature=-1.0))
    assert not llm.engine.has_unfinished_requests()


def test_penalties_follow_the_reference(tiny):
    """Greedy rows with repetition, presence and frequency penalties (and one without) in one
    batch: each token is the reference's choice after apply_penalties over the last repeat_last_n
    tokens, prompt included, up to ties."""
    path, ref = tiny
    llm = LLM(str(path), device="cuda", n_ctx=N_CTX, kv_cache_tokens=2048, max_num_seqs=4)
    rng = np.random.default_rng(9)
    ps = [rng.integers(0, 40, n).tolist() for n in (30, 7, 90, 12)]  # few distinct ids: repeats in the window
    configs = [dict(presence_penalty=1.5), dict(frequency_penalty=0.7), dict(repeat_penalty=1.2, presence_penalty=-0.5,
               frequency_penalty=0.4), dict()]
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, **c) for c in configs]
    out = llm.generate(ps, params)
    for p, sp, c in zip(ps, params, out):
        ids = np.array(p + c.token_ids)
        logits = ref.forward(ids, ref.new_cache(len(ids)))[len(p) - 1:len(ids) - 1]
        scale = np.abs(logits).max()
        for t, token in enumerate(c.token_ids):
            window = ids[max(0, len(p) + t - sp.repeat_last_n):len(p) + t]
            x = apply_penalties(logits[t], window, sp)
            assert x.max() - x[token] <= 1e-2 * scale, (sp, t, token, int(np.argmax(x)))
    plain = llm.generate(ps[:3], params[3])
    assert any(c.token_ids != q.token_ids for c, q in zip(out, plain))  # the penalties changed something
    assert all_free(llm)
