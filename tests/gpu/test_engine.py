"""End to end on the GPU with real weights: logits against the numpy reference, greedy answers."""

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.generate import generate
from impnb.models import load_reference
from impnb.sampling import SamplingParams
from impnb.tokenizer import Tokenizer

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

TEXT = ("The Eiffel Tower is located in the city of Paris. It was built for the 1889 World's Fair "
        "and at first many artists hated it. Today about seven million people visit it every year, "
        "and from the top you can see the Seine, the Louvre, Montmartre and the whole city spread "
        "out below. def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
        "The capital of Japan is Tokyo, which is also its largest city, home to about fourteen million "
        "people and famous for its food, its trains and its temples.")
N = 128


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def case(request):
    path = request.getfixturevalue(f"{request.param}_path")
    mf = open_model_file(path)
    tok = Tokenizer.from_metadata(mf.metadata)
    ids = tok.encode(TEXT)[:N]
    assert len(ids) == N
    ref = load_reference(mf)
    ref_logits = ref.forward(ids, ref.new_cache(N + 8))
    from impnb.engine_cuda import CudaEngine

    return request.param, mf, tok, np.asarray(ids, np.int32), ref_logits, CudaEngine(mf, 1024)


def _agreement(name, out, ref, what):
    top1 = float(np.mean(out.argmax(-1) == ref.argmax(-1)))
    rel = float(np.abs(out - ref).max() / np.abs(ref).max())
    print(f"{name} {what}: top-1 agreement {top1:.4f}, max|dlogit|/max|logit| {rel:.2e}")
    assert np.isfinite(out).all()
    assert top1 >= 0.99
    return rel


def test_prefill_logits_match_reference(case):
    """All N prompt positions at once: the cuBLAS GEMM path and prefill attention."""
    name, _, _, ids, ref, engine = case
    engine.reset(SamplingParams(temperature=0))
    engine.m.arena.get("logits", (N, engine.cfg.n_vocab)).copy_to_device(
        np.full((N, engine.cfg.n_vocab), np.nan, np.float32))  # poisoned
    out = engine.logits(ids)
    assert _agreement(name, out, ref, "prefill") < 5e-2


def test_decode_logits_match_reference(case):
    """Teacher-forced one token at a time: GEMV and split-K decode attention over the cache."""
    name, _, _, ids, ref, engine = case
    engine.reset(SamplingParams(temperature=0))
    out = np.concatenate([engine.logits([t]) for t in ids])
    assert _agreement(name, out, ref, "decode") < 5e-2


def test_greedy_answers(case):
    name, mf, tok, _, _, engine = case
    if name == "gemma3":
        ids, want = tok.encode("The Eiffel Tower is located in the city of"), "Paris"
    else:
        from impnb.chat import render_chat

        text = render_chat(mf.metadata, [{"role": "user", "content": "What is the capital of France?"}])
        ids, want = tok.encode(text, add_special=False), "Paris"
    out, stats = generate(engine, tok, ids, 24, SamplingParams(temperature=0), lambda s: None)
    text = tok.decode(out)
    print(f"{name}: {text!r} ({stats.line()})")
    assert want in text


def test_gpu_greedy_equals_reference_greedy(case):
    """16 greedy tokens from the GPU engine equal the CPU reference's."""
    name, mf, tok, ids, _, engine = case
    from impnb.engine_cpu import CpuEngine

    prompt = list(ids[:20])
    gpu, _ = generate(engine, tok, prompt, 16, SamplingParams(temperature=0), lambda s: None)
    cpu, _ = generate(CpuEngine(mf, 64), tok, prompt, 16, SamplingParams(temperature=0), lambda s: None)
    agree = next((i for i, (a, b) in enumerate(zip(gpu, cpu)) if a != b), len(cpu))
    print(f"{name}: first {agree} of {len(cpu)} greedy tokens agree")
    assert agree >= 8


def test_seeded_sampling_is_reproducible(case):
    name, _, tok, ids, _, engine = case
    p = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=7)
    a, _ = generate(engine, tok, list(ids[:12]), 16, p, lambda s: None)
    b, _ = generate(engine, tok, list(ids[:12]), 16, p, lambda s: None)
    assert a == b and len(set(a)) > 3


def test_short_prompt_prefill(case):
    """A prompt of 20 tokens (the GEMM table's 32-row bucket): in a fresh engine, where the table
    names an impnb path for every one of the model's prefill GEMMs at that bucket (Gemma3), prefill
    as generate runs it (the last row's logits) makes no cuBLAS handle and samples the reference's
    greedy token; the 20 rows' logits, poisoned first, agree with the reference."""
    from impnb.engine_cuda import CudaEngine
    from impnb.gpu import gemm_dispatch as gd

    name, mf, _, ids, ref, _ = case
    engine = CudaEngine(mf, 1024)
    engine.reset(SamplingParams(temperature=0))
    token = engine.prefill(ids[:20])
    assert token == int(ref[19].argmax()) or ref[19].max() - ref[19][token] < 1e-2 * np.abs(ref[19]).max()
    table = gd.load_table()
    shapes = {gd.shape_key(lin.w.ggml_type, lin.w.rows, lin.w.cols) for lin in engine.m.lin.values()
              if not lin.name.startswith(("token_embd", "output"))}
    if all(table.get(s, {}).get("32") for s in shapes):
        assert not engine.m.cublas.handle, "a cuBLAS handle for a prefill the table keeps off cuBLAS"
    engine.reset(SamplingParams(temperature=0))
    engine.m.arena.get("logits", (20, engine.cfg.n_vocab)).copy_to_device(
        np.full((20, engine.cfg.n_vocab), np.nan, np.float32))
    out = engine.logits(ids[:20])
    assert _agreement(name, out, ref[:20], "20-row prefill") < 5e-2
