"""scripts/serve_compare.py's pieces that need no server: the commands it starts both servers with
and the table it prints from bench-serve's rows."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

import serve_compare  # noqa: E402


def row(c, tok_s, ttft):
    return dict(concurrency=c, requests=4 * c, failed=0, request_throughput=1.0, output_throughput=tok_s,
                ttft_p50_ms=ttft, ttft_p99_ms=2 * ttft, tpot_p50_ms=3.0, tpot_p99_ms=4.0, itl_p50_ms=3.0,
                itl_p99_ms=4.0)


def test_server_commands():
    args = argparse.Namespace(concurrency="1,8,128,64", ctx=1024, device="cuda", llama_server="/x/llama-server")
    llama = serve_compare.server_cmd("llama.cpp", "/m.gguf", args, 9000)
    assert llama[0] == "/x/llama-server"
    flag = lambda name: llama[llama.index(name) + 1]  # noqa: E731
    assert flag("-np") == "128" and flag("-fa") == "on" and flag("-c") == str(1024 * 128)
    assert flag("-m") == "/m.gguf" and flag("--port") == "9000" and "-cb" in llama
    impnb = serve_compare.server_cmd("impnb", "/m.gguf", args, 9001)
    i = impnb.index("--max-seqs")
    assert impnb[i + 1] == "128" and impnb[impnb.index("--device") + 1] == "cuda"
    assert "--max-num-batched-tokens" not in impnb
    args.batched_tokens = 2048
    impnb = serve_compare.server_cmd("impnb", "/m.gguf", args, 9001)
    assert impnb[impnb.index("--max-num-batched-tokens") + 1] == "2048"


def test_table_ratios_and_missing_rows(capsys):
    results = {"m": {"impnb": [row(1, 300.0, 10.0), row(8, 2000.0, 20.0)], "llama.cpp": [row(8, 800.0, 40.0)]},
               "n": {"impnb": [row(1, 100.0, 5.0)], "llama.cpp": None}}
    serve_compare.table(results)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| m |") or ln.startswith("| n |")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    assert [c[:5] for c in cells] == [["m", "1", "300", "-", "-"], ["m", "8", "2000", "800", "2.50x"],
                                      ["n", "1", "100", "-", "-"]]
    assert cells[1][5:8] == ["20.0", "40.0", "0.50x"] and cells[1][8:10] == ["40.0", "80.0"]
    assert cells[1][10:13] == ["3.00", "3.00", "1.00x"] and cells[0][7] == "-"


def test_rows_kept_after_each_concurrency(monkeypatch):
    """measure runs bench-serve once a concurrency and hands keep the rows so far after each: a
    bench that gives nothing (a run cut short) leaves the levels measured before it."""
    calls, kept = [], []

    def fake_bench(port, args, output_len, rounds=4, concurrency=None):
        calls.append((concurrency, rounds))
        if concurrency is None:  # the warm-up, every level at once
            return [row(int(c), 1.0, 1.0) for c in args.concurrency.split(",")]
        return None if concurrency == "64" else [row(int(concurrency), 100.0 * int(concurrency), 5.0)]

    monkeypatch.setattr(serve_compare, "start", lambda cmd, port, log: object())
    monkeypatch.setattr(serve_compare, "stop", lambda proc: None)
    monkeypatch.setattr(serve_compare, "bench", fake_bench)
    args = argparse.Namespace(concurrency="1,8,64,128", warmup_len=16, output_len=128, rounds=4)
    rows = serve_compare.measure("impnb", [], 9000, args, None, lambda r: kept.append([x["concurrency"] for x in r]))
    assert [r["concurrency"] for r in rows] == [1, 8]
    assert kept == [[1], [1, 8]]
    assert calls == [(None, 1), ("1", 4), ("8", 4), ("64", 4)]
