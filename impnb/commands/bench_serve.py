"""`python -m impnb bench-serve` (or scripts/bench_serve.py): load an OpenAI-compatible server
with streaming requests at several concurrencies and report request throughput, output tok/s,
time to first token (TTFT), time per output token (TPOT) and inter-token latency (ITL), p50 / p99.

Standard library only (threads and http.client), so it runs wherever the server's clients do.
Prompts are random token ids for /v1/completions, random words for chat; every request asks for
its output length with ignore_eos, so lengths are what was asked (as `vllm bench serve`)."""

import http.client
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from impnb.errors import ParameterError

WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government "
         "number night point home water room mother area money story fact month lot right study book "
         "eye job word business issue side kind head house service friend father power hour game line").split()
TOKEN_ID_RANGE = (100, 10000)  # random prompt ids: inside any common vocabulary, past its control tokens


@dataclass
class Result:
    ok: bool
    error: str = ""
    ttft: float = 0.0
    e2e: float = 0.0
    n_out: int = 0
    itl: list[float] = field(default_factory=list)


def _request(url, path: str, body: dict, headers: dict, timeout: float) -> Result:
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    start = time.perf_counter()
    try:
        conn.request("POST", parts.path.rstrip("/") + path, body=json.dumps(body),
                     headers={"Content-Type": "application/json", **headers})
        r = conn.getresponse()
        if r.status != 200:
            return Result(False, f"HTTP {r.status}: {r.read()[:200]!r}")
        times, n_usage = [], None
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n_usage = chunk["usage"].get("completion_tokens")
            for c in chunk.get("choices") or ():
                if _brings_tokens(c):
                    times.append(time.perf_counter())
        end = time.perf_counter()
    except (OSError, ValueError, http.client.HTTPException) as e:
        return Result(False, f"{type(e).__name__}: {e}")
    finally:
        conn.close()
    if not times:
        return Result(False, "no tokens came back")
    return Result(True, ttft=times[0] - start, e2e=end - start, n_out=n_usage or len(times),
                  itl=list(np.diff(times)))


def _brings_tokens(choice: dict) -> bool:
    """Whether a streamed choice carries generated tokens: text, or an empty text that is not the
    chat's opening role chunk nor a chunk that only says why it finished (a server may stream a
    token that renders as nothing, such as a control token under ignore_eos, as empty text)."""
    delta = choice.get("delta") or {}
    piece = choice["text"] if "text" in choice else delta.get("content")
    if piece:
        return True
    return piece is not None and "role" not in delta and choice.get("finish_reason") is None


def _bodies(args, model: str, n: int, rng) -> list[dict]:
    def length(mean):
        lo, hi = max(1, int(mean * (1 - args.random_range))), max(1, int(mean * (1 + args.random_range)))
        return int(rng.integers(lo, hi + 1))

    bodies = []
    for _ in range(n):
        n_in, n_out = length(args.input_len), length(args.output_len)
        body = {"model": model, "max_tokens": n_out, "ignore_eos": True, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
        if args.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": " ".join(rng.choice(WORDS, n_in))}]
        else:
            body["prompt"] = [int(t) for t in rng.integers(*TOKEN_ID_RANGE, n_in)]
        bodies.append(body)
    return bodies


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) * 1000 if len(values) else float("nan")


def _model(args, headers) -> str:
    if args.model:
        return args.model
    parts = urlsplit(args.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", parts.path.rstrip("/") + "/v1/models", headers=headers)
        r = conn.getresponse()
        return json.loads(r.read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise ParameterError(f"cannot read the model from {args.url}/v1/models ({e}): give --model") from None
    finally:
        conn.close()


def run(args) -> int:
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise ParameterError(f"--concurrency takes comma-separated integers, got {args.concurrency!r}") from None
    if min(levels) <= 0 or args.input_len <= 0 or args.output_len <= 0 or args.rounds <= 0 \
            or (args.requests is not None and args.requests <= 0) or not 0 <= args.random_range < 1:
        raise ParameterError("concurrency, --requests, --rounds, --input-len and --output-len must be > 0, "
                             "--random-range in [0, 1)")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = _model(args, headers)
    path = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    rng = np.random.default_rng(args.seed)
    rows = []
    if not args.json:
        print(f"| {'conc':>4} | {'reqs':>5} | {'fail':>4} | {'req/s':>7} | {'out tok/s':>9} | {'TTFT p50':>8} "
              f"| {'TTFT p99':>8} | {'TPOT p50':>8} | {'TPOT p99':>8} | {'ITL p50':>7} | {'ITL p99':>7} |")
        print("|" + "|".join("-" * w for w in (6, 7, 6, 9, 11, 10, 10, 10, 10, 9, 9)) + "|", flush=True)
    for c in levels:
        n = args.requests or max(16, args.rounds * c)
        bodies = _bodies(args, model, n, rng)
        start = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            results = list(pool.map(lambda b: _request(args.url, path, b, headers, 600), bodies))
        wall = time.perf_counter() - start
        ok = [r for r in results if r.ok]
        tpot = [(r.e2e - r.ttft) / (r.n_out - 1) for r in ok if r.n_out > 1]
        itl = [x for r in ok for x in r.itl]
        row = dict(concurrency=c, requests=n, failed=n - len(ok), request_throughput=len(ok) / wall,
                   output_throughput=sum(r.n_out for r in ok) / wall,
                   ttft_p50_ms=_pct([r.ttft for r in ok], 50), ttft_p99_ms=_pct([r.ttft for r in ok], 99),
                   tpot_p50_ms=_pct(tpot, 50), tpot_p99_ms=_pct(tpot, 99),
                   itl_p50_ms=_pct(itl, 50), itl_p99_ms=_pct(itl, 99))
        rows.append(row)
        errors = sorted({r.error for r in results if not r.ok})
        if errors:
            print(f"impnb: bench-serve: {n - len(ok)} failed at concurrency {c}: {errors[0]}", file=sys.stderr)
        if not args.json:
            print(f"| {c:>4} | {n:>5} | {row['failed']:>4} | {row['request_throughput']:>7.2f} "
                  f"| {row['output_throughput']:>9.1f} | {row['ttft_p50_ms']:>8.1f} | {row['ttft_p99_ms']:>8.1f} "
                  f"| {row['tpot_p50_ms']:>8.2f} | {row['tpot_p99_ms']:>8.2f} | {row['itl_p50_ms']:>7.2f} "
                  f"| {row['itl_p99_ms']:>7.2f} |", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0 if all(r["failed"] == 0 for r in rows) else 1
