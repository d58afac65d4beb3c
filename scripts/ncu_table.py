"""A table of one decode step's kernels from ncu's CSV (`scripts/profile_step.py MODEL --ncu` under
`ncu --csv --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy
--metrics dram__bytes_read.sum`): a row per kernel and grid with its count, mean duration, DRAM
bytes read, registers, achieved occupancy and warp cycles per issued instruction, heaviest first.
ncu runs each kernel alone with clocks locked and L2 flushed, so durations are relative figures
(a one-thread kernel reads ~3.5 µs).
--steps: one table a step graph, a graph starting at each embedding kernel (`profile_batch.py MODEL
--batch 8,32 --ncu` replays one graph a B; its durations from `--metrics gpu__time_duration.sum`
serve as well), and with --layers N each row's µs a layer beside its total.
    python scripts/ncu_table.py NCU_CSV [--steps] [--layers N] [--json PATH]
"""

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

TIME_UNITS = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}
COLUMNS = {"Duration": "us", "gpu__time_duration.sum": "us", "dram__bytes_read.sum": "bytes",
           "Registers Per Thread": "regs", "Achieved Occupancy": "occupancy",
           "Warp Cycles Per Issued Instruction": "cpi"}
STEP_START = "_embedding_kernel"  # a step graph's first kernel (the token rows' embedding)


def number(text: str) -> float:
    return float(text.replace(",", ""))


def kernels(lines) -> list[dict]:
    """One dict a profiled kernel (ncu's ID order): name (up to numba's '[' suffix), grid and the
    COLUMNS metrics (Duration in µs)."""
    rows = csv.DictReader(line for line in lines if not line.startswith("=="))
    by_id: dict[str, dict] = {}
    for r in rows:
        k = by_id.setdefault(r["ID"], {"name": r["Kernel Name"].split("[")[0].split("(")[0], "grid": r["Grid Size"]})
        key = COLUMNS.get(r["Metric Name"])
        if key and r["Metric Value"]:
            value = number(r["Metric Value"])
            if key == "us":
                value *= TIME_UNITS[r["Metric Unit"]]
            elif key == "bytes" and r["Metric Unit"] in ("Kbyte", "Mbyte", "Gbyte"):
                value *= {"Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}[r["Metric Unit"]]
            k[key] = value
    return list(by_id.values())


def steps(ks: list[dict]) -> list[list[dict]]:
    """The kernels cut into step graphs, each from an embedding kernel to the next (those before
    the first embedding, if any, a step of their own)."""
    out: list[list[dict]] = []
    for k in ks:
        if not out or k["name"].endswith(STEP_START):
            out.append([])
        out[-1].append(k)
    return out


def table(ks: list[dict]) -> list[dict]:
    """Rows per (name, grid): count, the metrics' means, total µs and its share, heaviest first."""
    groups = defaultdict(list)
    for k in ks:
        groups[(k["name"], k["grid"])].append(k)
    total = sum(k.get("us", 0.0) for k in ks)
    rows = []
    for (name, grid), members in groups.items():
        row = {"kernel": name, "grid": grid, "count": len(members)}
        for key in COLUMNS.values():
            vals = [m[key] for m in members if key in m]
            row[key] = sum(vals) / len(vals) if vals else float("nan")
        row["total_us"] = row["us"] * len(members)
        row["share"] = row["total_us"] / total if total else 0.0
        rows.append(row)
    return sorted(rows, key=lambda r: -r["total_us"])


def print_table(rows: list[dict], layers: int | None) -> None:
    per = f" {'µs/layer':>8}" if layers else ""
    print(f"{'kernel':<44} {'grid':>13} {'n':>4} {'µs each':>8}{per} {'MB':>7} {'regs':>5} {'occ %':>6} {'cpi':>5} "
          f"{'share':>6}")
    for r in rows:
        per = f" {r['total_us'] / layers:>8.2f}" if layers else ""
        print(f"{r['kernel'][:44]:<44} {r['grid']:>13} {r['count']:>4} {r['us']:>8.2f}{per} {r['bytes'] / 1e6:>7.2f} "
              f"{r['regs']:>5.0f} {r['occupancy']:>6.1f} {r['cpi']:>5.1f} {r['share']:>6.1%}")
    print(f"{len(rows)} rows, {sum(r['count'] for r in rows)} kernels, {sum(r['total_us'] for r in rows):.1f} µs "
          "summed (each alone)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", action="store_true", help="a table a step graph (from each embedding kernel)")
    ap.add_argument("--layers", type=int, help="each row's µs divided by this many layers beside its total")
    ap.add_argument("--json")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        ks = kernels(f)
    groups = steps(ks) if args.steps else [ks]
    tables = [table(g) for g in groups]
    for i, rows in enumerate(tables):
        if args.steps:
            print(f"\nstep graph {i}:")
        print_table(rows, args.layers)
    if args.json:
        Path(args.json).write_text(json.dumps(tables if args.steps else tables[0], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
