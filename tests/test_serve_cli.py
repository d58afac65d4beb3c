"""`impnb generate` through the engine: the output of the single-sequence loop (generate.generate)
on the CPU, and on the GPU's runner the same engine calls in the same order."""

import pytest

from impnb.cli import main
from impnb.engine_cpu import CpuEngine
from impnb.generate import generate
from impnb.gguf_file import open_model_file
from impnb.sampling import SamplingParams
from impnb.serve.engine import LLMEngine
from impnb.serve.single_runner import SingleSequenceRunner
from impnb.tokenizer import Tokenizer
from tests.tiny_models import write_tiny_model

PROMPT = "The tiny model reads bytes: " + "".join(chr(33 + (7 * i) % 90) for i in range(150))


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), "gemma3")


def loop_output(path, params, n_ctx):
    """What generate.generate streams on the single-sequence CPU engine."""
    mf = open_model_file(path)
    tok = Tokenizer.from_metadata(mf.metadata)
    text = []
    tokens, stats = generate(CpuEngine(mf, n_ctx), tok, tok.encode(PROMPT), params.max_tokens, params,
                             text.append)
    return "".join(text), stats


@pytest.mark.parametrize("flags, params, n_ctx", [
    (["-t", "0", "-n", "20"], SamplingParams(temperature=0, max_tokens=20), 256),
    (["-t", "0.9", "--seed", "5", "--repeat-penalty", "1.2", "-n", "30"],
     SamplingParams(temperature=0.9, seed=5, repeat_penalty=1.2, max_tokens=30), 256),
    (["-t", "0", "-n", "100", "--ctx", "180"], SamplingParams(temperature=0, max_tokens=100), 180),
])
def test_cli_prints_what_the_single_sequence_loop_does(path, flags, params, n_ctx, capsys):
    assert main(["generate", PROMPT, "-m", str(path), "--device", "cpu", *flags]) == 0
    out, err = capsys.readouterr()
    text, stats = loop_output(path, params, n_ctx)
    assert out == text + "\n"
    assert err.count("\n") == 1 and err.startswith("impnb: cpu: prompt ")
    assert f"generated {stats.n_gen} tokens" in err and f"stop: {stats.stop}" in err


class CallLog:
    """A single-sequence engine that records its calls and answers from a fixed script of tokens."""

    device, n_ctx = "cuda", 64

    def __init__(self, answers):
        self.answers, self.calls, self.pos = list(answers), [], 0

    def reset(self, params):
        self.calls.append(("reset", params))
        self.pos = 0

    def prefill(self, ids):
        self.calls.append(("prefill", list(ids)))
        self.pos += len(ids)
        return self.answers.pop(0)

    def step(self, token):
        self.calls.append(("step", token))
        self.pos += 1
        return self.answers.pop(0)


@pytest.mark.parametrize("answers, max_tokens", [([5] * 8, 8), ([5, 6, 0, 9], 8), ([7] * 70, 100)])
def test_single_sequence_runner_makes_the_loops_calls(answers, max_tokens):
    """The GPU path's engine sees reset, prefill, step(token)... exactly as generate.generate makes
    them: to the end of generation (token 0 here), max_tokens or the context."""

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    prompt = [1, 2, 3]
    direct = CallLog(answers)
    want, _ = generate(direct, _Text(), prompt, max_tokens, params, lambda t: None)
    runner_engine = CallLog(answers)
    engine = LLMEngine(SingleSequenceRunner(runner_engine), _Text(), 64)
    rid = engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.completion(rid).token_ids == want
    assert runner_engine.calls == direct.calls


class _Text:
    """A tokenizer stand-in: token 0 ends generation, every token is the text 'x'."""

    eog_ids = frozenset({0})
    vocab_size = 100

    def stream(self):
        return self

    def push(self, token):
        return "x"

    def flush(self):
        return ""


@pytest.mark.parametrize("flag, value", [("--max-num-batched-tokens", "0"), ("--max-seqs", "-3")])
def test_serve_bad_sizes_exit_2_with_one_line(flag, value, capsys):
    """Checked before the model or the port is touched: one line on stderr, exit 2."""
    assert main(["serve", "-m", "no-such-model", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"impnb: error: {flag} must be a positive integer")
