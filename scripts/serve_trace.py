"""One client's requests against impnb's server, each timed: groups of streaming /v1/completions
(random token-id prompts, ignore_eos) sent one after another, a group after an idle gap, with the
server's own first-token time (queued and prefill in the engine, from /metrics) around each group;
with --tg, `impnb bench`'s tg128 on the same model in the same run, so the single stream reads as
a share of it.

    python scripts/serve_trace.py -m smollm2-135m [--groups 0:24,1.5:8,1.5:8,0.05:8] [--tg] [--json out.json]

--groups takes gap-seconds:requests pairs. Prints a line a group: output tok/s, each request's
time to first token (ms), TPOT p50 / max, and the engine's mean first-token time. Exits 1 when the
server does not start or a request fails."""

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb.commands.bench_serve import TOKEN_ID_RANGE, _request  # noqa: E402
from impnb.model_registry import resolve_model  # noqa: E402
from scripts.serve_compare import free_port, start, stop  # noqa: E402

WARMUP = 6  # requests before the first group (graphs and caches of the measured lengths)


def engine_ttft(url: str) -> tuple[float, float]:
    """(sum of seconds, count) of the server's first-token histogram."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    got = {m[1]: float(m[2]) for m in re.finditer(r"^impnb_time_to_first_token_seconds_(sum|count) (\S+)$",
                                                   text, re.M)}
    return got.get("sum", 0.0), got.get("count", 0.0)


def groups_of(spec: str) -> list[tuple[float, int]]:
    """--groups' (gap seconds, requests) pairs; ValueError for a malformed one."""
    try:
        out = [(float(g), int(n)) for g, n in (p.split(":") for p in spec.split(","))]
    except ValueError:
        raise ValueError(f"--groups takes gap:requests pairs, got {spec!r}") from None
    if any(g < 0 or n <= 0 for g, n in out):
        raise ValueError("--groups: gaps must be >= 0 and requests > 0")
    return out


def trace(url: str, model: str, args, rng) -> list[dict] | None:
    def body():
        return {"model": model, "max_tokens": args.output_len, "ignore_eos": True, "temperature": 0.0,
                "stream": True, "prompt": [int(t) for t in rng.integers(*TOKEN_ID_RANGE, args.input_len)]}

    for _ in range(WARMUP):
        if not _request(url, "/v1/completions", body(), {}, 600).ok:
            return None
    rows = []
    for gap, n in groups_of(args.groups):
        time.sleep(gap)
        s0, c0 = engine_ttft(url)
        t0 = time.perf_counter()
        results = [_request(url, "/v1/completions", body(), {}, 600) for _ in range(n)]
        wall = time.perf_counter() - t0
        s1, c1 = engine_ttft(url)
        if not all(r.ok for r in results):
            print(f"serve_trace: a request failed: {next(r.error for r in results if not r.ok)}", file=sys.stderr)
            return None
        tpot = [(r.e2e - r.ttft) / (r.n_out - 1) * 1e3 for r in results if r.n_out > 1]
        rows.append(dict(gap_s=gap, requests=n, output_throughput=sum(r.n_out for r in results) / wall,
                         ttft_ms=[r.ttft * 1e3 for r in results], tpot_p50_ms=float(np.median(tpot)) if tpot else None,
                         tpot_max_ms=max(tpot) if tpot else None,
                         engine_ttft_ms=(s1 - s0) / (c1 - c0) * 1e3 if c1 > c0 else None))
        r = rows[-1]
        print(f"gap {gap:g} s, {n} requests: {r['output_throughput']:.0f} tok/s; TTFT ms "
              + " ".join(f"{x:.1f}" for x in r["ttft_ms"])
              + (f"; TPOT p50 {r['tpot_p50_ms']:.3f} max {r['tpot_max_ms']:.3f} ms" if tpot else "")
              + (f"; engine TTFT {r['engine_ttft_ms']:.2f} ms" if r["engine_ttft_ms"] is not None else ""), flush=True)
    return rows


def tg128(args) -> float | None:
    """`impnb bench -p 128 -n 128 -r 3`'s tg128 tok/s on the model (None when it gives none)."""
    proc = subprocess.run([sys.executable, "-m", "impnb", "bench", "-m", args.model, "-p", "128", "-n", "128", "-r",
                           "3", "--device", args.device, "--json"], capture_output=True, text=True)
    try:
        return next(r["tok_s"] for r in json.loads(proc.stdout) if r["test"] == "tg128")
    except (ValueError, StopIteration, KeyError, TypeError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--groups", default="0:24,1.5:8,1.5:8,0.05:8")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--tg", action="store_true", help="also impnb bench's tg128 on the model")
    ap.add_argument("--logs", default="/tmp", help="folder for the server's log")
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        groups_of(args.groups)
    except ValueError as e:
        ap.error(str(e))
    path = str(resolve_model(args.model))
    port = free_port()
    cmd = [sys.executable, "-m", "impnb", "serve", "-m", path, "--device", args.device, "--port", str(port),
           "--max-seqs", "8", "--log-level", "warning"]
    with open(Path(args.logs) / f"serve-trace-{Path(path).stem}.log", "w") as log:
        proc = start(cmd, port, log)
        if proc is None:
            print("serve_trace: the server did not start (see its log)", file=sys.stderr)
            return 1
        try:
            url = f"http://127.0.0.1:{port}"
            model = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=10).read())["data"][0]["id"]
            rows = trace(url, model, args, np.random.default_rng(0))
        finally:
            stop(proc)
    if rows is None:
        return 1
    out = {"model": args.model, "groups": rows}
    if args.tg:
        out["tg128"] = tg128(args)
        if out["tg128"]:
            served = [r["output_throughput"] for r in rows]
            print(f"tg128 {out['tg128']:.1f} tok/s; served {min(served):.0f}-{max(served):.0f} "
                  f"({min(served) / out['tg128']:.0%}-{max(served) / out['tg128']:.0%})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
