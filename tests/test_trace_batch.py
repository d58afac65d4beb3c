"""scripts/trace_batch.py's step analysis on made-up kernel records: launches grouped into steps,
each kernel's exposed time (the step's length in sum), its gap, the labels of the ops."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

trace_batch = pytest.importorskip("trace_batch")

NAME = "_ZN6cudapy5impnb7kernels4gemv11gemv_dp4a_m6kernelB2v1E"


def step(t0: int, corr: int) -> list:
    # (start, end, correlation, name, node): a, then b launched early (it starts 500 ns before
    # a ends) and ending after it, then c after a 300 ns gap, ending at t0 + 9000
    return [(t0, t0 + 4000, corr, "a_kernel", 1), (t0 + 3500, t0 + 6000, corr, NAME, 2),
            (t0 + 6300, t0 + 9000, corr, "c_kernel", 3)]


def test_steps_and_exposed_times():
    records = step(0, 7) + step(20_000, 9) + step(10_000, 8) + [(30_000, 31_000, 10, "eager", 0)]
    steps = trace_batch.steps_of(records + [(-5, -1, 3, "before", 0)], 0)
    assert [s[0][2] for s in steps] == [7, 8, 9]  # in time order; the lone eager launch left out
    out = trace_batch.analyse(steps, ["attn x", "ffn y", "norm z"])
    assert out["kernels_a_step"] == 3 and out["labelled"]
    assert out["step_us"] == pytest.approx(9.0) and out["between_steps_us"] == pytest.approx(1.0)
    rows = {r["op"]: r for r in out["ops"]}
    assert list(rows) == ["attn x | a_kernel", "ffn y | gemv.gemv_dp4a_m", "norm z | c_kernel"]
    assert [rows[k]["exposed_us"] for k in rows] == pytest.approx([4.0, 2.0, 3.0])
    assert sum(r["exposed_step_us"] for r in out["ops"]) == pytest.approx(out["step_us"])
    assert rows["ffn y | gemv.gemv_dp4a_m"]["gap_us"] == pytest.approx(-0.5)
    assert rows["norm z | c_kernel"]["gap_us"] == pytest.approx(0.3)


def test_labels_dropped_when_counts_differ():
    out = trace_batch.analyse(trace_batch.steps_of(step(0, 1), 0), ["only one"])
    assert not out["labelled"] and [r["op"] for r in out["ops"]] == ["a_kernel", "gemv.gemv_dp4a_m", "c_kernel"]


def test_steps_by_graph_node_where_launches_share_no_id():
    """Records each with an id of its own: steps split where the first kernel's node recurs."""
    records = [(t, e, i, n, node) for i, (t, e, _, n, node) in enumerate(step(0, 0) + step(10_000, 0))]
    steps = trace_batch.steps_of(records, 3000)  # from within the first step: its rest left out
    assert [len(s) for s in steps] == [3] and steps[0][0][0] == 10_000
