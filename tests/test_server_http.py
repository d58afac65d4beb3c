"""`python -m impnb serve` on SmolLM2 driven by the openai client and raw HTTP: chat and
completions, streaming and not, stop strings, seeds, usage, concurrent streams, a client that
leaves mid-stream, every error's status and shape, /health, /metrics, /v1/models, and SIGTERM.

Every test runs on each device of IMPNB_SERVE_TEST_DEVICES (default "cpu,cuda"); the cuda run is
marked `gpu` and skipped without a GPU (`-m gpu` runs it alone). Requests ask for a few tokens
each: the CPU reference makes a few tokens a second."""

import json
import os
import signal
import threading
import time

import pytest

from tests.serve_http import API_KEY, ServerProcess, open_stream, post_unread, request

openai = pytest.importorskip("openai")

DEVICES = [pytest.param(d, marks=[pytest.mark.gpu] if d == "cuda" else [], id=d)
           for d in os.environ.get("IMPNB_SERVE_TEST_DEVICES", "cpu,cuda").split(",")]
N_CTX = {"cpu": 256, "cuda": 4096}  # the GPU's long requests must outlast a disconnect and the grace
MAX_SEQS, MAX_WAITING = 8, 8
MODEL = "test-model"


def start_server(path, device: str) -> ServerProcess:
    n_ctx = N_CTX[device]
    s = ServerProcess(path, "--device", device, "--ctx", n_ctx, "--max-seqs", MAX_SEQS,
                      "--max-waiting", MAX_WAITING, "--grace", 2)
    s.device, s.n_ctx = device, n_ctx
    return s


@pytest.fixture(scope="module", params=DEVICES)
def server(request, smollm2_path):
    s = start_server(smollm2_path, request.param)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from impnb.gguf_file import open_model_file
    from impnb.tokenizer import Tokenizer

    return Tokenizer.from_metadata(open_model_file(smollm2_path).metadata)


def post(server, path, body, key=API_KEY):
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    return request(server.url, "POST", path, body, headers)


def assert_error(r, status, *words):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    for w in words:
        assert w in err["message"], err["message"]


# -- health, models, metrics --

def test_health_answers_503_while_loading_then_200(server):
    assert server.health[-1] == 200
    assert 503 in server.health, server.health


def test_models_lists_the_served_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]


def test_metrics_are_prometheus_text(server):
    text = request(server.url, "GET", "/metrics").text
    for name in ("impnb_num_requests_running", "impnb_num_requests_waiting", "impnb_kv_blocks_used",
                 "impnb_kv_blocks_free", "impnb_prompt_tokens_total", "impnb_generation_tokens_total",
                 "impnb_time_to_first_token_seconds_bucket", "impnb_time_per_output_token_seconds_bucket"):
        assert f"\n{name}" in "\n" + text, name
    assert "# TYPE impnb_time_to_first_token_seconds histogram" in text


# -- generation --

def test_chat_completion_with_usage(client, smollm2_path, tokenizer):
    from impnb.chat import render_chat
    from impnb.gguf_file import open_model_file

    messages = [{"role": "user", "content": "Say hi"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0, user="u1")
    text = render_chat(open_model_file(smollm2_path).metadata, messages)
    assert r.id.startswith("chatcmpl-") and r.created > 0 and r.object == "chat.completion"
    (choice,) = r.choices
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(tokenizer.encode(text, add_special=False))
    assert r.usage.completion_tokens == 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + 4


def test_completion_stream_equals_the_whole_answer(client, tokenizer):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.usage.prompt_tokens == len(tokenizer.encode(kw["prompt"]))


def test_chat_stream_sends_role_then_content_then_done(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "temperature": 0, "stream": True}
    r = post(server, "/v1/chat/completions", body)
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_stop_string_ends_the_text_before_it(client):
    kw = dict(model=MODEL, prompt="One, two, three, four,", max_tokens=8, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    stop = full[len(full) // 2 - 1:len(full) // 2 + 2]  # three characters, likely across tokens
    r = client.completions.create(**kw, stop=[stop, "never appears"])
    assert r.choices[0].text == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(**kw, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == full[:full.index(stop)]


def test_seed_reproduces_and_n_gives_choices(client, server):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=1.0, seed=1234)
    a, b = (client.completions.create(**kw).choices[0].text for _ in range(2))
    assert a == b
    r = client.completions.create(**kw, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    if server.device == "cpu":  # the reference runs each sequence alone: a batch of two changes nothing
        assert r.choices[0].text == a
    assert r.usage.completion_tokens <= 8


def test_prompt_as_token_ids_and_extensions(client, tokenizer):
    ids = tokenizer.encode("Hello there")
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0.7,
                                  extra_body={"top_k": 20, "min_p": 0.1, "repetition_penalty": 1.1,
                                              "ignore_eos": True})
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 3


def test_presence_and_frequency_penalties_change_a_greedy_output(client):
    kw = dict(model=MODEL, prompt="one one one one one one one one", max_tokens=12, temperature=0,
              extra_body={"ignore_eos": True})
    plain = client.completions.create(**kw).choices[0].text
    for extra in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        r = client.completions.create(**kw, **extra)
        assert r.choices[0].text != plain and r.usage.completion_tokens == 12, extra
    assert client.completions.create(**kw, presence_penalty=0.0, frequency_penalty=0.0).choices[0].text == plain


def test_logprobs(server, client):
    """On both runners: the CPU's hands every row's logits to the host, the GPU's the rows that ask."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "temperature": 0, "logprobs": True, "top_logprobs": 3}
    r = post(server, "/v1/chat/completions", body)
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 2
    for t in content:
        assert t["logprob"] <= 0 and len(t["top_logprobs"]) == 3
        assert t["top_logprobs"][0]["logprob"] == t["logprob"]  # greedy: the best token
    c = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0, logprobs=2)
    assert len(c.choices[0].logprobs.tokens) == 2 and len(c.choices[0].logprobs.top_logprobs[0]) == 2
    s = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0, logprobs=2, stream=True)
    streamed = [lp for chunk in s if chunk.choices and chunk.choices[0].logprobs
                for lp in chunk.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(c.choices[0].logprobs.token_logprobs, abs=1e-4)


def test_eight_concurrent_streams(client, server):
    results = [None] * 8

    def run(i):
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Count to {i + 2}"}], max_tokens=3,
            temperature=0, stream=True)
        chunks = list(stream)
        results[i] = ("".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                      chunks[-1].choices[0].finish_reason)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(r is not None and r[0] and r[1] in ("stop", "length") for r in results), results
    m = server.wait_idle()
    assert m["impnb_kv_blocks_used"] == 0 and m["impnb_num_requests_running"] == 0


def test_a_client_leaving_mid_stream_frees_its_sequence(server):
    body = {"model": MODEL, "prompt": "Tell me a long story", "max_tokens": server.n_ctx - 16,
            "ignore_eos": True, "stream": True}
    conn, r = open_stream(server.url, "/v1/completions", body, {"Authorization": f"Bearer {API_KEY}"})
    assert r.status == 200
    assert next(line for line in r if line.startswith(b"data: "))
    assert server.metrics()["impnb_num_requests_running"] == 1
    conn.close()
    m = server.wait_idle(timeout=30)
    assert m["impnb_num_requests_running"] == 0 and m["impnb_kv_blocks_used"] == 0
    assert m["impnb_generation_tokens_total"] >= 0


def test_a_client_leaving_before_a_whole_answer_frees_its_sequence(server):
    body = {"model": MODEL, "prompt": "Tell me a long story", "max_tokens": server.n_ctx - 16,
            "ignore_eos": True}
    conn = post_unread(server.url, "/v1/completions", body, {"Authorization": f"Bearer {API_KEY}"})
    deadline = time.monotonic() + 30
    while server.metrics()["impnb_num_requests_running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    conn.close()
    m = server.wait_idle(timeout=30)
    assert m["impnb_num_requests_running"] == 0 and m["impnb_kv_blocks_used"] == 0


# -- errors --

def test_malformed_json_and_wrong_types_are_400(server):
    assert_error(post(server, "/v1/completions", "{not json"), 400, "not valid JSON")
    assert_error(post(server, "/v1/completions", b"\xff\xfe"), 400)
    assert_error(post(server, "/v1/completions", [1, 2]), 400)
    assert_error(post(server, "/v1/completions", {"prompt": "x", "max_tokens": "many"}), 400, "max_tokens")
    assert_error(post(server, "/v1/completions", {"prompt": "x", "temperature": -1}), 400, "temperature")
    assert_error(post(server, "/v1/completions", {"prompt": [10**9]}), 400, "token id")
    assert_error(post(server, "/v1/completions", {"prompt": ""}), 400, "empty")
    assert_error(post(server, "/v1/chat/completions", {"messages": []}), 400, "messages")
    assert_error(post(server, "/v1/chat/completions", {"messages": [{"content": "no role"}]}), 400, "role")
    assert_error(post(server, "/v1/completions", {"prompt": "x", "stop": [""]}), 400, "stop")
    assert_error(post(server, "/v1/completions", {"prompt": "x", "presence_penalty": 3}), 400, "presence_penalty")
    assert_error(post(server, "/v1/completions", {"prompt": "x", "frequency_penalty": -2.5}), 400, "frequency_penalty")
    assert_error(post(server, "/v1/completions", '{"prompt": "\\ud800"}'), 400, "surrogate")
    assert_error(post(server, "/v1/completions", {"prompt": "x", "echo": True}), 400, "echo")
    assert_error(post(server, "/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udfff"}]}'),
                 400, "surrogate")
    assert_error(post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                       "top_logprobs": 2}), 400, "top_logprobs")


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert "no-such-model" in str(e.value)


def test_prompt_over_the_context_is_400_with_the_counts(client, server):
    n_ctx = server.n_ctx
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[100] * (n_ctx + 10), max_tokens=1)
    assert f"{n_ctx}" in str(e.value) and f"{n_ctx + 10}" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[100] * 100, max_tokens=n_ctx)
    assert f"{100 + n_ctx}" in str(e.value) and "100 in the prompt" in str(e.value)


def test_bad_api_key_is_401(server):
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert request(server.url, "GET", "/v1/models").status_code == 401
    assert request(server.url, "GET", "/health").status_code == 200  # health and metrics need no key


def test_overload_is_503(server):
    body = {"model": MODEL, "prompt": ["a", "b"], "n": MAX_SEQS + MAX_WAITING, "max_tokens": 1}
    assert_error(post(server, "/v1/completions", body), 503, "overloaded")


def test_unknown_route_is_404_in_openai_shape(server):
    assert_error(post(server, "/v1/nothing", {}), 404)


def test_nothing_leaks_and_the_server_still_answers(server, client):
    m = server.wait_idle()
    assert m["impnb_kv_blocks_used"] == 0 and m["impnb_num_requests_waiting"] == 0
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=1).usage.completion_tokens <= 1


def test_bench_serve_reports_every_column(server, capsys):
    from impnb.cli import main

    argv = ["bench-serve", "--url", server.url, "--api-key", API_KEY, "--concurrency", "1,2", "--requests", "2",
            "--input-len", "8", "--output-len", "2", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["concurrency"] for r in rows] == [1, 2] and all(r["failed"] == 0 for r in rows)
    assert all(r["output_throughput"] > 0 and r["ttft_p99_ms"] >= r["ttft_p50_ms"] > 0 for r in rows)


def test_bad_model_or_busy_port_exit_2_with_one_line(server, smollm2_path):
    from tests.test_startup import run_cli

    proc = run_cli("serve", "-m", "no-such-model", "--device", "cpu", timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no-such-model" in proc.stderr
    proc = run_cli("serve", "-m", smollm2_path, "--device", "cpu", "--port", server.port, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("impnb: error: cannot serve")


def test_sigterm_finishes_or_aborts_and_exits_0(server, smollm2_path):
    """A server of its own stops (the module's keeps serving the tests that a worker may run after
    this one): a stream running past the grace period is cut, the process exits 0."""
    own = start_server(smollm2_path, server.device)
    try:
        body = {"model": MODEL, "prompt": "Tell me a long story", "max_tokens": own.n_ctx - 16,
                "ignore_eos": True, "stream": True}
        conn, r = open_stream(own.url, "/v1/completions", body, {"Authorization": f"Bearer {API_KEY}"})
        next(line for line in r if line.startswith(b"data: "))
        own.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rest = list(r)  # ends when the grace period has passed
        cut_after = time.monotonic() - t0
        conn.close()
        assert own.proc.wait(60) == 0, own.proc.stdout.read()
        # cut: far fewer chunks (a data line and a blank line each) than the tokens asked for, and
        # within the grace period (2 s) and a margin
        assert len(rest) < body["max_tokens"] and cut_after < 2 + 10
    finally:
        own.stop()
