"""scripts/ncu_table.py on a small CSV in ncu's --csv layout: per-kernel metrics gathered by ID,
durations in µs whatever ncu's unit, rows per (kernel, grid), heaviest first."""

import csv
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

import ncu_table  # noqa: E402

HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]


def _csv(metrics) -> list[str]:
    out = io.StringIO()
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(HEADER)
    for kid, name, grid, metric, unit, value in metrics:
        w.writerow([kid, "1", "python3", "host", name, "1", "13", "(128, 1, 1)", grid, "0", "9.0", "s", metric, unit,
                    value])
    return ["==PROF== Connected to process 1\n"] + out.getvalue().splitlines(keepends=True)


def test_rows_by_kernel_and_grid():
    down = "gemv_moe::_down_sum_kernel[v443,cw51](UniTuple<Array<int, 1>>, float)"
    route = "gemv::_gemv_route_kernel[v352,cw51](Array<float, 2>)"
    lines = _csv([
        ("0", down, "(512, 1, 1)", "Duration", "ns", "11,000"),
        ("0", down, "(512, 1, 1)", "dram__bytes_read.sum", "Mbyte", "7.14"),
        ("0", down, "(512, 1, 1)", "Registers Per Thread", "register/thread", "127"),
        ("1", route, "(128, 1, 1)", "Duration", "us", "14.5"),
        ("1", route, "(128, 1, 1)", "dram__bytes_read.sum", "byte", "1,120,000"),
        ("2", down, "(512, 1, 1)", "Duration", "ns", "13,000"),
        ("3", down, "(1024, 1, 1)", "Duration", "ns", "15,000"),
    ])
    ks = ncu_table.kernels(lines)
    assert [k["name"] for k in ks] == ["gemv_moe::_down_sum_kernel", "gemv::_gemv_route_kernel",
                                       "gemv_moe::_down_sum_kernel", "gemv_moe::_down_sum_kernel"]
    rows = ncu_table.table(ks)
    assert [(r["kernel"], r["grid"], r["count"]) for r in rows] == [
        ("gemv_moe::_down_sum_kernel", "(512, 1, 1)", 2), ("gemv_moe::_down_sum_kernel", "(1024, 1, 1)", 1),
        ("gemv::_gemv_route_kernel", "(128, 1, 1)", 1)]
    assert rows[0]["us"] == 12.0 and rows[0]["total_us"] == 24.0 and rows[0]["bytes"] == 7.14e6
    assert rows[0]["regs"] == 127
    assert rows[2]["us"] == 14.5 and rows[2]["bytes"] == 1.12e6
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-12 and abs(rows[0]["share"] - 24 / 53.5) < 1e-12


def test_steps_from_each_embedding_kernel():
    """gpu__time_duration.sum in base units (ns) read as µs; a step graph from each embedding kernel;
    --steps --layers prints a table a graph with µs a layer."""
    emb = "embedding::_embedding_kernel[abi:v1,cw51](Array<int, 1>)"
    gemm = "gemm_mmq::_gemm_mmq_kernel[abi:v3,cw51](Array<unsigned int, 2>)"
    cublas = "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>(T1::Params)"
    t = "gpu__time_duration.sum"
    lines = _csv([
        ("0", emb, "(1, 8, 1)", t, "nsecond", "4,544"),
        ("1", gemm, "(192, 2, 1)", t, "nsecond", "40,000"),
        ("2", gemm, "(192, 2, 1)", t, "nsecond", "42,000"),
        ("3", emb, "(1, 32, 1)", t, "nsecond", "4,000"),
        ("4", cublas, "(2, 1, 32)", t, "nsecond", "6,500"),
    ])
    ks = ncu_table.kernels(lines)
    assert ks[1]["us"] == 40.0 and ks[4]["name"] == "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>"
    graphs = ncu_table.steps(ks)
    assert [len(g) for g in graphs] == [3, 2]
    rows = ncu_table.table(graphs[0])
    assert (rows[0]["kernel"], rows[0]["count"], rows[0]["total_us"]) == ("gemm_mmq::_gemm_mmq_kernel", 2, 82.0)
    assert ncu_table.steps([]) == [] and [len(g) for g in ncu_table.steps(ks[1:])] == [2, 2]


def test_steps_table_printed(tmp_path, capsys, monkeypatch):
    t = "gpu__time_duration.sum"
    path = tmp_path / "ncu.csv"
    path.write_text("".join(_csv([
        ("0", "embedding::_embedding_kernel[v1](A)", "(1, 8, 1)", t, "nsecond", "4,000"),
        ("1", "moe::_group_kernel[v1](A)", "(1, 1, 1)", t, "nsecond", "19,000"),
        ("2", "moe::_group_kernel[v1](A)", "(1, 1, 1)", t, "nsecond", "17,000")])))
    monkeypatch.setattr(sys, "argv", ["ncu_table.py", str(path), "--steps", "--layers", "2"])
    assert ncu_table.main() == 0
    out = capsys.readouterr().out
    assert "step graph 0:" in out and "step graph 1:" not in out
    group = next(line for line in out.splitlines() if line.startswith("moe::_group_kernel"))
    assert group.split()[4:7] == ["2", "18.00", "18.00"]  # count, µs each, µs a layer (36 / 2)
