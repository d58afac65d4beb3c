"""Streaming a token whose text is empty: the server sends a chunk for it (as vLLM does), and
bench-serve counts such chunks as tokens. A model whose generated ids render as nothing (the
synthetic full-size models' [PAD] tokens, a control token under ignore_eos) streamed no chunk
at all, and bench-serve reported every request as failed ("no tokens came back")."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from impnb.commands.bench_serve import _brings_tokens, _request  # noqa: E402
from impnb.errors import ImpnbError  # noqa: E402
from impnb.serve.outputs import Delta  # noqa: E402
from impnb.server.generation import Choice, Generation  # noqa: E402


def generation(chat: bool, deltas: list[Delta], at_once: int = 1) -> Generation:
    """A Generation of one choice whose engine events are `deltas` (no model, no HTTP), arriving
    `at_once` at a time (as a stream that has fallen behind finds them queued)."""
    g = Generation.__new__(Generation)
    g.chat, g.id, g.created = chat, "cmpl-test", 0
    g.server = SimpleNamespace(model_name="m")
    g.body = SimpleNamespace(include_usage=False, n=1, n_logprobs=None)
    g.choices = {"r": Choice(0, 3)}

    async def events():
        for i in range(0, len(deltas), at_once):
            yield deltas[i:i + at_once]

    g._events = events
    return g


def writes_of(g: Generation) -> list[str]:
    async def collect():
        return [c async for c in g._stream()]

    return asyncio.run(collect())


def chunks_of(g: Generation) -> list:
    """The SSE events of the stream's writes, parsed; [DONE] last."""
    events = [e for w in writes_of(g) for e in w.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


DELTAS = [Delta("r", [11], "a"), Delta("r", [12], ""), Delta("r", [13], "", False),
          Delta("r", [14], "b", True, "length")]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_every_token_gets_a_chunk_even_with_empty_text(chat):
    chunks = chunks_of(generation(chat, DELTAS + [Delta("r", [], "")]))  # the last: a step with no token
    if chat:
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        chunks = chunks[1:]
        texts = [c["choices"][0]["delta"]["content"] for c in chunks]
    else:
        texts = [c["choices"][0]["text"] for c in chunks]
    assert texts == ["a", "", "", "b"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_deltas_queued_together_leave_in_one_write_as_the_same_events(chat):
    one_by_one = chunks_of(generation(chat, DELTAS))
    together = generation(chat, DELTAS, at_once=3)
    assert chunks_of(together) == one_by_one
    writes = writes_of(generation(chat, DELTAS, at_once=3))
    assert len(writes) == (1 if chat else 0) + 2 + 1  # role chunk, two batches, [DONE]
    assert writes[-2].count("data: ") == 1 and writes[-3].count("data: ") == 3


def test_a_finish_without_a_token_is_one_chunk_with_no_content():
    chunks = chunks_of(generation(True, [Delta("r", [11], "a"), Delta("r", [], "", True, "eog")]))
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}


def queued_events(items: list) -> list:
    """What Generation._events yields for `items` already queued by the engine thread, the
    exception that ended it (or None), and the request ids it aborted."""
    g = Generation.__new__(Generation)
    g.choices = {"r": Choice(0, 3)}
    g.pending = {"r"}
    g.server = SimpleNamespace(loop=SimpleNamespace(abort=lambda ids: g.aborted.extend(ids)))
    g.aborted = []

    async def run():
        g.job = SimpleNamespace(out=asyncio.Queue())
        for item in items:
            g.job.out.put_nowait(item)
        got = []
        try:
            async for batch in g._events():
                got.append(batch)
        except ImpnbError as e:
            return got, e, g.aborted
        return got, None, g.aborted

    return asyncio.run(run())


def test_queued_deltas_come_out_together_and_the_done_ends_the_request():
    done = ("done", "r", SimpleNamespace(token_ids=[11, 12], n_cached_tokens=0))
    batches, error, aborted = queued_events(DELTAS[:2] + [done])
    assert error is None and batches == [DELTAS[:2] + [done]] and aborted == []


def test_an_engine_error_behind_queued_deltas_ends_the_stream_after_them():
    """The Deltas ahead of the error come out first, then the error; nothing is aborted twice
    (the engine thread dropped the requests)."""
    batches, error, aborted = queued_events(DELTAS[:3] + [ImpnbError("the step failed")])
    assert batches == [DELTAS[:3]] and str(error) == "the step failed" and aborted == []
    batches, error, aborted = queued_events([ImpnbError("at once")])
    assert batches == [] and str(error) == "at once" and aborted == []


@pytest.mark.parametrize("choice, tokens", [
    ({"text": "a", "finish_reason": None}, True),
    ({"text": "", "finish_reason": None}, True),
    ({"text": "", "finish_reason": "length"}, False),
    ({"text": "b", "finish_reason": "length"}, True),
    ({"delta": {"role": "assistant", "content": ""}, "finish_reason": None}, False),
    ({"delta": {"content": ""}, "finish_reason": None}, True),
    ({"delta": {}, "finish_reason": "stop"}, False),
    ({"delta": {"content": "x"}, "finish_reason": "stop"}, True),
])
def test_which_chunks_bring_tokens(choice, tokens):
    assert _brings_tokens(choice) is tokens


class _EmptyTextStream(BaseHTTPRequestHandler):
    """Streams five completion chunks of empty text, one that only finishes, and usage."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = [{"choices": [{"index": 0, "text": "", "finish_reason": None}]}] * 5
        chunks += [{"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
                   {"choices": [], "usage": {"completion_tokens": 5}}]
        for c in chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


def test_bench_serve_times_tokens_of_empty_text():
    server = _stub_server()
    try:
        r = _request(f"http://127.0.0.1:{server.server_port}", "/v1/completions", {"prompt": [1]}, {}, 30)
    finally:
        server.shutdown()
    assert r.ok, r.error
    assert r.n_out == 5 and len(r.itl) == 4 and r.e2e >= r.ttft > 0


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the listen backlog: 20 clients connect at once


def _stub_server():
    server = _Server(("127.0.0.1", 0), _EmptyTextStream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_bench_serve_rounds_set_the_requests_a_client(capsys):
    from impnb.cli import main

    server = _stub_server()
    try:
        argv = ["bench-serve", "--url", f"http://127.0.0.1:{server.server_port}", "--model", "m",
                "--concurrency", "1,20", "--rounds", "2", "--json"]
        assert main(argv) == 0
    finally:
        server.shutdown()
    rows = json.loads(capsys.readouterr().out)
    assert [(r["concurrency"], r["requests"], r["failed"]) for r in rows] == [(1, 16, 0), (20, 40, 0)]
    assert all(r["output_throughput"] > 0 for r in rows)


@pytest.mark.parametrize("flags", [["--rounds", "0"], ["--requests", "0"], ["--concurrency", "0,8"],
                                   ["--concurrency", "one"], ["--random-range", "1"]])
def test_bench_serve_bad_parameters_exit_2_with_one_line(flags, capsys):
    from impnb.cli import main

    assert main(["bench-serve", "--url", "http://127.0.0.1:9", "--model", "m", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("impnb: "), err
