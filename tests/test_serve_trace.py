"""scripts/serve_trace.py end to end on the CPU engine with SmolLM2: its groups of timed requests,
the server's first-token time around each, its JSON; a malformed --groups is a usage error."""

import argparse
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import serve_trace  # noqa: E402


def run(*args, timeout=600):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "serve_trace.py"), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_trace_on_the_cpu_engine(smollm2_path, tmp_path):
    out = tmp_path / "trace.json"
    proc = run("-m", str(smollm2_path), "--device", "cpu", "--groups", "0:2,0.2:1", "--input-len", "9",
               "--output-len", "3", "--logs", str(tmp_path), "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = json.loads(out.read_text())["groups"]
    assert [(g["gap_s"], g["requests"]) for g in groups] == [(0.0, 2), (0.2, 1)]
    for g in groups:
        assert len(g["ttft_ms"]) == g["requests"] and all(t > 0 for t in g["ttft_ms"])
        assert g["output_throughput"] > 0 and g["tpot_p50_ms"] > 0 and g["engine_ttft_ms"] > 0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("gap ")]
    assert len(lines) == 2 and "engine TTFT" in lines[0]


def test_bad_groups_is_a_usage_error():
    proc = run("-m", "smollm2-135m", "--groups", "1.5", timeout=60)
    assert proc.returncode == 2 and "--groups takes gap:requests pairs" in proc.stderr


def test_tg128_from_bench_json(monkeypatch):
    """--tg reads bench's JSON rows (its tg128 among pp128's); a bench that printed none gives None."""
    rows = [{"test": "pp128", "tok_s": 5e4}, {"test": "tg128", "tok_s": 2078.5}]
    calls = []

    def fake(cmd, **kwargs):
        calls.append(cmd)
        return SimpleNamespace(stdout=json.dumps(rows) if len(calls) == 1 else "Traceback ...")

    monkeypatch.setattr(serve_trace.subprocess, "run", fake)
    args = argparse.Namespace(model="m", device="cuda")
    assert serve_trace.tg128(args) == 2078.5
    assert "--json" in calls[0] and calls[0][calls[0].index("--device") + 1] == "cuda"
    assert serve_trace.tg128(args) is None
