"""impnb's batched decode against llama.cpp's on the same GGUF: S_TG (decode tok/s summed over
the B sequences) of `impnb bench --batch` and of `llama-batched-bench` side by side, with the ratio
and twice llama.cpp's figure (#42's mark), read from each tool's log of its table (both print
| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...). scripts/gpu_check.sh's batch
mode runs both in one call and this after them.

    python scripts/batch_compare.py --impnb batch-m.log --llama batch-llama-m.log [--label M] [--json PATH]

Exits 1 when the impnb log has no rows; a B that one tool lacks is printed with a dash."""

import argparse
import json
import sys
from pathlib import Path


def rows(text: str) -> dict[int, dict]:
    """B -> {pp, tg, s_pp, s_tg} of every row of a llama-batched-bench-style table in text (the
    last row of a B where there are several)."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8:
            continue
        try:
            pp, tg, b = int(cells[0]), int(cells[1]), int(cells[2])
            s_pp, s_tg = float(cells[5]), float(cells[7])
        except ValueError:
            continue
        out[b] = {"pp": pp, "tg": tg, "s_pp": s_pp, "s_tg": s_tg}
    return out


def compare(ours: dict[int, dict], theirs: dict[int, dict]) -> list[dict]:
    """One row a B of either tool, in order: S_TG of each (None where missing), the ratio and 2x."""
    table = []
    for b in sorted(set(ours) | set(theirs)):
        a = ours.get(b, {}).get("s_tg")
        t = theirs.get(b, {}).get("s_tg")
        table.append({"B": b, "impnb": a, "llama.cpp": t, "ratio": a / t if a and t else None,
                      "twice_llama": 2 * t if t else None})
    return table


def render(label: str, table: list[dict]) -> str:
    cell = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    lines = ["| model | B | impnb S_TG | llama.cpp S_TG | impnb / llama.cpp | 2x llama.cpp |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {label} | {r['B']} | {cell(r['impnb'], '.1f')} | {cell(r['llama.cpp'], '.1f')} | "
                     f"{cell(r['ratio'], '.2f')}{'x' if r['ratio'] else ''} | {cell(r['twice_llama'], '.0f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impnb", required=True, help="impnb bench --batch's output")
    ap.add_argument("--llama", help="llama-batched-bench's output (absent: impnb's rows alone)")
    ap.add_argument("--label", default="model")
    ap.add_argument("--json", help="write the rows there too")
    args = ap.parse_args(argv)
    ours = rows(Path(args.impnb).read_text(errors="replace"))
    theirs = rows(Path(args.llama).read_text(errors="replace")) if args.llama and Path(args.llama).exists() else {}
    if not ours:
        print(f"batch_compare: no rows in {args.impnb}", file=sys.stderr)
        return 1
    table = compare(ours, theirs)
    print(render(args.label, table))
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.label, "rows": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
