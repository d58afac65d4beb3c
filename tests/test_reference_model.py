"""The numpy reference model against HF transformers (torch CPU) on the real GGUF weights."""

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from tests.hf_ref import hf_logits, hf_model, hf_tokenizer

pytestmark = pytest.mark.slow

TEXT = ("The Eiffel Tower is located in the city of Paris. It was built for the 1889 World's Fair "
        "and at first many artists hated it. def fib(n):\n    return n if n < 2 else fib(n-1) + "
        "fib(n-2)\n\nToday about seven million people visit it every year, 日本語 too.")


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def case(request):
    path = request.getfixturevalue(f"{request.param}_path")
    return path, load_reference(open_model_file(path)), hf_model(path)


def test_logits_match_transformers(case):
    path, model, hf = case
    ids = hf_tokenizer(path)(TEXT).input_ids
    assert len(ids) >= 64
    ref = hf_logits(hf, ids)
    out = model.forward(ids, model.new_cache(256))
    rel = np.abs(out - ref).max() / np.abs(ref).max()
    print(f"{path.name}: {len(ids)} tokens, max|dlogit|/max|logit| = {rel:.2e}")
    assert rel <= 1e-3
    assert np.array_equal(out[:64].argmax(-1), ref[:64].argmax(-1))


def test_incremental_decode_equals_full_forward(case):
    path, model, _ = case
    ids = np.random.default_rng(7).integers(0, model.cfg.n_vocab, 40)
    full = model.forward(ids, model.new_cache(64))
    cache = model.new_cache(64)
    steps = [model.forward(ids[:23], cache)] + [model.forward(ids[t:t + 1], cache) for t in range(23, 40)]
    np.testing.assert_allclose(np.concatenate(steps), full, rtol=0, atol=1e-4 * np.abs(full).max())


@pytest.mark.parametrize("case", ["gemma3"], indirect=True)
def test_gemma3_sliding_window_beyond_512_tokens(case):
    """600 tokens: the local layers' 512-token window masks the oldest keys. The model and HF's come
    from the module's gemma3 case (each load is about a minute of CPU)."""
    import dataclasses

    path, model, hf = case
    assert model.cfg.sliding_window == 512 and model.cfg.swa_layers[:6] == (True,) * 5 + (False,)
    ids = [2] + list(np.random.default_rng(3).integers(10, 20000, 599))
    ref = hf_logits(hf, ids)
    out = model.forward(ids, model.new_cache(600))
    rel = np.abs(out - ref).max() / np.abs(ref).max()
    print(f"gemma3 600 tokens: {rel:.2e}")
    assert rel <= 1e-3
    # the window matters: a model that attends globally everywhere gives other logits
    cfg = model.cfg
    model.cfg = model.ops.cfg = dataclasses.replace(cfg, swa_layers=(False,) * cfg.n_layer)
    try:
        full = model.forward(ids, model.new_cache(600))
    finally:
        model.cfg = model.ops.cfg = cfg  # the shared model back as the other tests take it
    assert np.abs(full[-1] - ref[-1]).max() / np.abs(ref).max() > 1e-2
