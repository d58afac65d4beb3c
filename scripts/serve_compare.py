"""impnb's server against llama.cpp's llama-server on the same GGUF: each started in turn on a
free port, warmed up, loaded by `impnb bench-serve` (streaming /v1/completions, random token-id
prompts, ignore_eos) at each concurrency, stopped; then one table of output tok/s, TTFT and time
per output token (p50 / p99) with impnb / llama.cpp ratios.

    python scripts/serve_compare.py -m smollm2-135m,/tmp/qwen3-8b-q4_k_m.gguf \\
        --llama-server /tmp/llama/build/bin/llama-server [--json rows.json]

llama-server runs with -np (the largest concurrency) slots, continuous batching, -fa on, every
layer on the GPU, and a context of --ctx tokens a slot; without --llama-server only impnb's
rows are measured. Exits 1 when a server does not start or a request fails."""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from impnb.model_registry import resolve_model

START_TIMEOUT = 900  # s: a first start compiles impnb's kernels for the model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, log) -> subprocess.Popen | None:
    """Start a server; None when it exits or /health does not answer 200 in time."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + START_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    stop(proc)
    return None


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bench(port: int, args, output_len: int, rounds: int = 4, concurrency: str | None = None) -> list[dict] | None:
    """bench-serve's rows at every concurrency of `concurrency` (default: --concurrency's; failed
    requests counted in them), `rounds` requests a client; None when it gave none."""
    cmd = [sys.executable, "-m", "impnb", "bench-serve", "--url", f"http://127.0.0.1:{port}", "--concurrency",
           concurrency or args.concurrency, "--input-len", str(args.input_len), "--output-len", str(output_len),
           "--rounds", str(rounds), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(proc.stderr)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return None


def measure(name: str, cmd: list[str], port: int, args, log, keep) -> list[dict] | None:
    """The server's rows, one bench-serve a concurrency, each handed to keep(rows so far) as it
    comes (a run cut short keeps what it measured)."""
    t0 = time.perf_counter()
    proc = start(cmd, port, log)
    if proc is None:
        print(f"serve-compare: {name} did not start (see its log)", file=sys.stderr)
        return None
    try:
        print(f"serve-compare: {name} up in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        # every concurrency (every batch bucket) at the measured lengths (every context bucket a
        # measured request reaches), as vLLM's bench warms up with the first request's lengths
        if bench(port, args, args.warmup_len or args.output_len, rounds=1) is None:
            return None
        rows = []
        for c in args.concurrency.split(","):
            got = bench(port, args, args.output_len, rounds=args.rounds, concurrency=c)
            if got is None:
                return rows or None
            for r in got:
                print(f"serve-compare: {name} concurrency {r['concurrency']}: {r['output_throughput']:.0f} tok/s, "
                      f"TTFT p50 {r['ttft_p50_ms']:.1f} ms, TPOT p50 {r['tpot_p50_ms']:.2f} ms, "
                      f"{r['failed']} failed", file=sys.stderr, flush=True)
            rows += got
            keep(rows)
        return rows
    finally:
        stop(proc)


def server_cmd(server: str, path: str, args, port: int) -> list[str]:
    top = max(int(c) for c in args.concurrency.split(","))
    if server == "impnb":
        step = getattr(args, "batched_tokens", None)
        return [sys.executable, "-m", "impnb", "serve", "-m", path, "--device", args.device, "--port", str(port),
                "--max-seqs", str(top), "--ctx", str(args.ctx), "--log-level", "warning"] + (
                    ["--max-num-batched-tokens", str(step)] if step else [])
    return [args.llama_server, "-m", path, "--port", str(port), "-np", str(top), "-cb", "-fa", "on",
            "-ngl", "999", "-c", str(args.ctx * top), "--no-webui"]


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def table(results: dict) -> None:
    cols = ("model", "conc", "tok/s impnb", "llama.cpp", "x", "TTFT p50", "llama.cpp", "x", "TTFT p99", "llama.cpp",
            "TPOT p50", "llama.cpp", "x", "TPOT p99", "llama.cpp")
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    for model, by_server in results.items():
        mine, theirs = by_server.get("impnb") or [], {r["concurrency"]: r for r in by_server.get("llama.cpp") or []}
        for r in mine:
            o = theirs.get(r["concurrency"], {})
            cell = lambda row, k, f: format(row[k], f) if k in row else "-"  # noqa: E731
            print(f"| {model} | {r['concurrency']} | {r['output_throughput']:.0f} | {cell(o, 'output_throughput', '.0f')} "
                  f"| {ratio(r['output_throughput'], o.get('output_throughput', 0))} "
                  f"| {r['ttft_p50_ms']:.1f} | {cell(o, 'ttft_p50_ms', '.1f')} "
                  f"| {ratio(r['ttft_p50_ms'], o.get('ttft_p50_ms', 0))} | {r['ttft_p99_ms']:.1f} "
                  f"| {cell(o, 'ttft_p99_ms', '.1f')} | {r['tpot_p50_ms']:.2f} | {cell(o, 'tpot_p50_ms', '.2f')} "
                  f"| {ratio(r['tpot_p50_ms'], o.get('tpot_p50_ms', 0))} "
                  f"| {r['tpot_p99_ms']:.2f} | {cell(o, 'tpot_p99_ms', '.2f')} |")
    print("(TTFT and TPOT, the time per output token after the first, in ms; x: impnb / llama.cpp)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--models", default="smollm2-135m", help="comma-separated names or .gguf paths")
    p.add_argument("--llama-server", default=None, help="llama-server's binary (none: impnb alone)")
    p.add_argument("--concurrency", default="1,8,32,64,128")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=4, help="requests a client at each concurrency")
    p.add_argument("--warmup-len", type=int, default=None, help="tokens a warm-up request generates (default --output-len)")
    p.add_argument("--ctx", type=int, default=1024, help="context a sequence (a slot) holds, both servers")
    p.add_argument("--device", default="cuda", help="impnb's device")
    p.add_argument("--batched-tokens", type=int, default=None,
                   help="impnb serve's --max-num-batched-tokens (default: its own; llama-server's batch is 2048)")
    p.add_argument("--logs", default=".", help="directory for the servers' logs")
    p.add_argument("--json", default=None, help="write every row here")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's SIGTERM still stops the servers
    results, failed = {}, False
    for model in args.models.split(","):
        path = str(resolve_model(model))
        name = os.path.basename(path).removesuffix(".gguf")
        results[name] = {}
        for server in ("impnb", "llama.cpp") if args.llama_server else ("impnb",):
            port = free_port()
            def keep(rows, name=name, server=server):  # after each concurrency: a run cut short keeps what it had
                results[name][server] = rows
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(results, f, indent=1)
            with open(os.path.join(args.logs, f"serve-{server}-{name}.log"), "w") as log:
                rows = measure(f"{server} on {name}", server_cmd(server, path, args, port), port, args, log, keep)
            failed |= rows is None or any(r["failed"] for r in rows)
            keep(rows)
    table(results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
