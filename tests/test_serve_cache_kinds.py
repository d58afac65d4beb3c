"""The serving engine on architectures whose per-sequence state the paged pool does not hold
(Gated DeltaNet's recurrent state, Gemma 4's per-layer and shared K/V): on the CPU they run one
sequence at a time through CpuEngine's own cache, and each prompt's greedy tokens are the
reference's, prompt by prompt, whatever was queued beside it."""

import numpy as np
import pytest

from impnb.fuzz.seeds import write_seeds
from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.models.paged_kv_cache import PagedKVPool
from impnb.sampling import SamplingParams
from impnb.serve.llm import LLM


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return write_seeds(tmp_path_factory.mktemp("seeds"))


def greedy_alone(ref, prompt, n):
    ids, cache, out = list(prompt), ref.new_cache(64), []
    logits = ref.forward(np.array(ids), cache)
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = ref.forward(np.array(out[-1:]), cache)
    return out


@pytest.mark.parametrize("arch", ["qwen35moe", "gemma4"])
def test_generate_runs_one_sequence_at_a_time(seeds, arch):
    ref = load_reference(open_model_file(seeds[arch]))
    assert not PagedKVPool.holds(ref.cfg)
    llm = LLM(str(seeds[arch]), device="cpu", n_ctx=64)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, ref.cfg.n_vocab, n).tolist() for n in (5, 11, 2)]
    out = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    for p, c in zip(prompts, out):
        assert c.token_ids == greedy_alone(ref, p, 4)


def test_the_pool_holds_plain_attention_models(seeds):
    for arch in ("llama", "qwen3", "qwen3moe"):
        assert PagedKVPool.holds(load_reference(open_model_file(seeds[arch])).cfg)
