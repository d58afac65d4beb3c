"""The Python API: `from impnb import LLM, SamplingParams` without numba, generate / stream / chat
on tiny models, and bad input raising the project's error types with one clear message."""

import subprocess
import sys

import pytest

from impnb.errors import ImpnbError, ParameterError, UnsupportedError
from tests.test_startup import GPU_MODULES
from tests.tiny_models import EOT, write_tiny_model

N_CTX = 64


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny_model(d, arch) for arch in ("llama", "gemma3")}


@pytest.fixture(scope="module")
def llm(paths):
    from impnb import LLM

    return LLM(str(paths["llama"]), device="cpu", n_ctx=N_CTX, max_num_batched_tokens=24)


def test_the_api_imports_no_gpu_module():
    gpu = tuple(m for m in GPU_MODULES if "." in m)
    probe = ("import sys\nfrom impnb import LLM, SamplingParams\n"
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite')"
             f" or m.startswith({gpu!r})))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_generate_returns_one_result_per_prompt(llm):
    from impnb import SamplingParams

    prompts = ["hello the world", "abc", [5, 6, 7, 8]]
    params = [SamplingParams(temperature=0, max_tokens=5), SamplingParams(seed=3, max_tokens=9),
              SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)]
    out = llm.generate(prompts, params)
    assert [o.prompt for o in out] == ["hello the world", "abc", None]
    assert out[0].prompt_token_ids == llm.tokenizer.encode("hello the world")
    assert out[2].prompt_token_ids == [5, 6, 7, 8]
    for o, p in zip(out, params):
        assert o.text == llm.tokenizer.decode(o.token_ids)
        assert EOT not in o.token_ids
        assert o.finish_reason == "eog" or len(o.token_ids) == min(p.max_tokens, N_CTX + 1 - len(o.prompt_token_ids))
        t = o.timing
        assert 0 <= t.queued_s and 0 < t.prefill_s and 0 <= t.decode_s and t.total_s >= t.prefill_s
    # 100 tokens after 4 would pass the context: it ends once its last token has no room
    assert out[2].finish_reason == "context" and len(out[2].prompt_token_ids) + len(out[2].token_ids) == N_CTX + 1
    again = llm.generate("abc", params[1])[0]  # a single prompt, same seed: the same answer
    assert again.token_ids == out[1].token_ids


def test_stream_gives_the_text_of_generate(llm):
    from impnb import SamplingParams

    params = SamplingParams(temperature=0.7, seed=11, max_tokens=12)
    want = llm.generate(["one", "two three"], params)
    text, ids, ends = {}, {}, {}
    for d in llm.stream(["one", "two three"], params):
        text[d.request_id] = text.get(d.request_id, "") + d.text
        ids.setdefault(d.request_id, []).extend(d.token_ids)
        if d.finished:
            ends[d.request_id] = d.finish_reason
    assert sorted(text) == sorted(ends) and len(text) == 2
    got = [text[k] for k in sorted(text, key=int)]
    assert got == [w.text for w in want]
    assert [ids[k] for k in sorted(ids, key=int)] == [w.token_ids for w in want]


def test_closing_a_stream_aborts_and_frees(llm):
    from impnb import SamplingParams

    stream = llm.stream(["a long one", "b"], SamplingParams(max_tokens=40, ignore_eos=True))
    next(stream)
    stream.close()
    engine = llm.engine
    assert not engine.has_unfinished_requests() and not engine.requests
    assert engine.blocks.n_free == len(engine.blocks.blocks)


def test_engine_abort_reports_the_end(llm):
    from impnb import SamplingParams

    engine = llm.engine
    rid = engine.add_request("abc", SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    engine.abort(rid)
    (delta,) = engine.step()
    assert delta.request_id == rid and delta.finished and delta.finish_reason == "abort"
    assert engine.completion(rid).finish_reason == "abort"
    assert not engine.has_unfinished_requests()


def test_chat_applies_the_template(paths):
    from impnb import LLM, SamplingParams

    gemma = LLM(str(paths["gemma3"]), device="cpu", n_ctx=N_CTX)  # no template: Gemma's built-in one
    chat = [{"role": "user", "content": "hi"}]
    (out,) = gemma.chat(chat, SamplingParams(temperature=0, max_tokens=4))
    text = gemma.tokenizer.decode(out.prompt_token_ids)
    assert text.endswith("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"), text
    assert len(gemma.chat([chat, chat], SamplingParams(max_tokens=2))) == 2
    llama = LLM(str(paths["llama"]), device="cpu", n_ctx=N_CTX)
    with pytest.raises(UnsupportedError, match="no chat template"):
        llama.chat(chat)


def one_line_error(kind, fn, *words):
    with pytest.raises(kind) as e:
        fn()
    message = str(e.value)
    assert "\n" not in message and message
    for w in words:
        assert w in message, message
    return message


def test_bad_input_raises_one_clear_error(llm, paths):
    from impnb import LLM, SamplingParams

    one_line_error(ParameterError, lambda: llm.generate([]), "no prompts")
    one_line_error(ParameterError, lambda: llm.generate(""), "the prompt is empty")
    one_line_error(ParameterError, lambda: llm.generate("x" * 200), "200 tokens", "context holds 64")
    one_line_error(ParameterError, lambda: llm.generate([[1, 10**6]]), "not a token id")
    one_line_error(ParameterError, lambda: llm.generate("hi", SamplingParams(temperature=-1)), "temperature")
    one_line_error(ParameterError, lambda: llm.generate("hi", SamplingParams(top_k=2.5)), "top-k", "integer")
    one_line_error(ParameterError, lambda: llm.generate("hi", SamplingParams(max_tokens=0)), "max-tokens")
    one_line_error(ParameterError, lambda: llm.generate(["a", "b"], [SamplingParams()]), "one per prompt")
    one_line_error(ParameterError, lambda: llm.generate("hi", {"temperature": 0}), "SamplingParams")
    one_line_error(ParameterError, lambda: llm.generate(3), "no prompts")
    one_line_error(ParameterError, lambda: llm.stream(["ok", "x" * 100]), "context holds 64")
    # a bad prompt among good ones queues none of them
    one_line_error(ParameterError, lambda: llm.generate(["fine", ""]), "empty")
    assert not llm.engine.has_unfinished_requests() and not llm.engine.requests
    path = str(paths["llama"])
    one_line_error(ParameterError, lambda: LLM(path, device="tpu"), "device")
    one_line_error(ParameterError, lambda: LLM(path, device="cpu", n_ctx=0), "n_ctx")
    one_line_error(ParameterError, lambda: LLM(path, device="cpu", n_ctx=N_CTX, kv_cache_tokens=16),
                   "KV pool holds 16 tokens")
    one_line_error(ParameterError, lambda: LLM(path, device="cpu", max_num_seqs=0), "max_num_seqs")
    one_line_error(ImpnbError, lambda: LLM("/nonexistent/model.gguf"), "no such file")
    one_line_error(ParameterError, lambda: LLM(path, gpu_memory_utilization=1.5), "gpu_memory_utilization")


def test_engine_requests_are_checked(llm):
    engine = llm.engine
    one_line_error(ParameterError, lambda: engine.add_request("hi", {"seed": 1}), "not SamplingParams")
    one_line_error(ParameterError, lambda: engine.completion("nope"), "not known")
    rid = engine.add_request("hi", request_id="mine")
    one_line_error(ParameterError, lambda: engine.add_request("hi", request_id="mine"), "already in use")
    one_line_error(ParameterError, lambda: engine.completion(rid), "not finished")
    engine.drop(rid)
    assert not engine.has_unfinished_requests() and not engine.requests
