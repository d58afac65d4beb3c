"""Start-up in one call: `impnb info`, and `impnb generate` from process start to its first token
and to its last, with the kernel cache warm and cold (a fresh IMPNB_CACHE_DIR, so kernels and
tokenizer merges are built again; the first cold run fills the cache the warm runs then use), beside llama.cpp's process start to one token on the same GGUF
(llama-bench -p 0 -n 1 -r 1) when a llama-bench binary is given. Prints a markdown table.

    python scripts/bench_startup.py [-m gemma3-270m,smollm2-135m] [-n 32] [--warm-runs 3]
        [--cold-runs 1] [--device cuda] [--llama-bench PATH] [--root CHECKOUT] [--json out.json]

Each figure is the median of its runs, in seconds of wall time, measured from before the
subprocess starts; the first token is the first byte on generate's stdout (it flushes each token).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout whose impnb runs (--root)
PROMPT = "The Eiffel Tower is located in the city of"


def _env(cache: str | None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    if cache:
        env["IMPNB_CACHE_DIR"] = cache
    return env


def time_info(model: str, cache: str | None) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "impnb", "info", model], capture_output=True,
                          env=_env(cache), cwd=ROOT, timeout=600)
    elapsed = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"info {model} failed: {proc.stderr.decode()[-400:]}")
    return elapsed


def time_generate(model: str, n: int, device: str, cache: str | None) -> tuple[float, float, str]:
    """(seconds to the first byte on stdout, seconds to exit, generate's stats line)."""
    cmd = [sys.executable, "-m", "impnb", "generate", PROMPT, "-m", model, "-n", str(n),
           "--temperature", "0", "--device", device]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(cache), cwd=ROOT)
    first = None
    while True:
        chunk = proc.stdout.read1(1 << 16)
        if first is None and chunk.strip():
            first = time.perf_counter() - start
        if not chunk:
            break
    err = proc.stderr.read().decode()
    proc.wait(timeout=600)
    total = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"generate {model} failed: {err[-400:]}")
    stats = next((line for line in reversed(err.splitlines()) if "decode" in line), "")
    return first if first is not None else total, total, stats


def time_llama(binary: str, gguf: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run([binary, "-m", gguf, "-p", "0", "-n", "1", "-r", "1", "-ngl", "99"],
                          capture_output=True, timeout=600)
    elapsed = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"llama-bench failed: {proc.stderr.decode()[-400:]}")
    return elapsed


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def measure(model: str, args) -> dict:
    sys.path.insert(0, str(ROOT))
    from impnb.model_registry import resolve_model

    gguf = str(resolve_model(model))
    row = dict(model=model, gguf=gguf)
    # The first run in a fresh cache is the first cold run; the warm runs reuse that cache (with
    # no cold run, the first run only fills it), and each further cold run has a fresh one.
    home = tempfile.mkdtemp(prefix="impnb-startup-")
    caches = [str(Path(home) / "kernels")]
    try:
        cold = [time_generate(model, args.n, args.device, caches[0])]
        warm = [time_generate(model, args.n, args.device, caches[0]) for _ in range(args.warm_runs)]
        row["info_s"] = _median([time_info(model, caches[0]) for _ in range(args.info_runs)])
        for _ in range(args.cold_runs - 1):
            caches.append(str(Path(tempfile.mkdtemp(prefix="impnb-cold-")) / "kernels"))
            cold.append(time_generate(model, args.n, args.device, caches[-1]))
    finally:
        for c in caches:
            shutil.rmtree(Path(c).parent, ignore_errors=True)
    cold = cold if args.cold_runs else []
    row["warm_first_s"] = _median([w[0] for w in warm])
    row["warm_total_s"] = _median([w[1] for w in warm])
    row["warm_stats"] = warm[-1][2] if warm else ""
    row["cold_first_s"] = _median([c[0] for c in cold])
    row["cold_total_s"] = _median([c[1] for c in cold])
    if args.llama_bench:
        row["llama_one_token_s"] = _median([time_llama(args.llama_bench, gguf) for _ in range(args.warm_runs)])
    return row


def _fmt(v) -> str:
    return "" if v is None else f"{v:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--models", default="gemma3-270m,smollm2-135m")
    ap.add_argument("-n", type=int, default=32, help="tokens generated")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("--cold-runs", type=int, default=1)
    ap.add_argument("--info-runs", type=int, default=5)
    ap.add_argument("--llama-bench", default=None, help="a llama-bench binary: its start to one token")
    ap.add_argument("--root", default=None, help="run another checkout's impnb (e.g. the tree before a change)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    global ROOT
    if args.root:
        ROOT = Path(args.root).resolve()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines() if shutil.which("nvidia-smi") else []
    print(f"start-up of {ROOT} on {gpu[0] if gpu else 'no GPU'}, {os.cpu_count()} CPUs, device {args.device}, "
          f"generate -n {args.n}; seconds, median of {args.warm_runs} warm / {args.cold_runs} cold runs",
          flush=True)
    print("| model | info | warm first token | warm total | cold first token | cold total | llama.cpp start to one token |")
    print("|---|---:|---:|---:|---:|---:|---:|", flush=True)
    rows = []
    for model in args.models.split(","):
        r = measure(model, args)
        rows.append(r)
        print(f"| {model} | {_fmt(r['info_s'])} | {_fmt(r['warm_first_s'])} | {_fmt(r['warm_total_s'])} "
              f"| {_fmt(r['cold_first_s'])} | {_fmt(r['cold_total_s'])} | {_fmt(r.get('llama_one_token_s'))} |",
              flush=True)
    for r in rows:
        print(f"{r['model']} warm: {r['warm_stats']}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(gpu=gpu[0] if gpu else None, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
