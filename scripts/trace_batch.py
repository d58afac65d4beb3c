"""A batched decode step as it runs in its graph, kernel by kernel: CUPTI's kernel records (start
and end on the GPU's clock) of look-ahead decode() steps at B sequences, each kernel matched to the
op that launched it. Where profile_batch.py times each kernel alone, this shows what each adds to
the step where it stands: its `exposed` time, how far its end passes every earlier kernel's end
(the sum over a step is the step), beside its own duration and the gap from the kernel before's
end to its start (negative where a programmatic launch overlaps them).

    python scripts/trace_batch.py MODEL [--batch 8] [--prompt 128] [--steps 16] [--json PATH]

Needs cupti-python and a CUPTI library: the CUDA toolkit's ($CUDA_HOME/extras/CUPTI/lib64,
CUDA_HOME /usr/local/cuda unless set) or the nvidia-cuda-cupti wheel's. For the GPU host, stage
the wheel with the others (`DEVICE_WHEELS="cupti-python==13.4.0" ../shared/tools/device-prep
--models none`; scripts/device_setup.sh installs .dev/whl). CUPTI adds its own cost a kernel: the
step's length with tracing is printed beside the same steps' without.
"""

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from profile_batch import Sequences, launch_labels, make_engine  # noqa: E402
from profile_step import short_name  # noqa: E402


class Tracer:
    """CUPTI's concurrent-kernel records, from before the engine's first graph on."""

    def __init__(self):
        import os

        os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")  # where the toolkit's CUPTI is found
        from cupti import cupti

        self.cupti, self.records = cupti, []

        def requested():
            return 16 * 1024 * 1024, 0

        def completed(activities):
            for a in activities:
                if a.kind == cupti.ActivityKind.CONCURRENT_KERNEL:
                    self.records.append((a.start, a.end, a.correlation_id, a.name, a.graph_node_id))

        cupti.activity_register_callbacks(requested, completed)
        cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)

    def now(self) -> int:
        return self.cupti.get_timestamp()

    def flush(self) -> None:
        self.cupti.activity_flush_all(1)

    def close(self) -> None:
        self.flush()
        self.cupti.activity_disable(self.cupti.ActivityKind.CONCURRENT_KERNEL)


def steps_of(records: list, t0: int) -> list[list]:
    """The records after t0 grouped by graph launch (a correlation id each), in time order; only
    launches of the step's full size (the most common count, the larger on a tie) are kept. Where
    the records carry no launch's id in common (each kernel its own), a step starts at each kernel
    of the graph's first node (the lowest node id)."""
    by_launch = defaultdict(list)
    for r in records:
        if r[0] >= t0:
            by_launch[r[2]].append(r)
    steps = sorted((sorted(v) for v in by_launch.values()), key=lambda s: s[0][0])
    if steps and max(len(s) for s in steps) == 1:
        flat = [s[0] for s in steps]
        first = min(r[4] for r in flat)
        steps = []
        for r in flat:
            if r[4] == first or not steps:
                steps.append([])
            steps[-1].append(r)
    sizes = [len(s) for s in steps]
    full = max(set(sizes), key=lambda n: (sizes.count(n), n))
    return [s for s in steps if len(s) == full]


def analyse(steps: list[list], ops: list[str]) -> dict:
    """Per op (in the step's order of first launch): launches a step, median µs a launch of
    duration, exposed time and start gap, and the median step's exposed sum; the steps' lengths
    and the gaps between one step's last end and the next one's first start."""
    n = len(steps[0])
    labels = ops if len(ops) == n else [""] * n
    per = defaultdict(lambda: {"dur": [], "exposed": [], "gap": [], "sum": []})
    order = []
    lengths, between = [], []
    for si, s in enumerate(steps):
        lengths.append((max(r[1] for r in s) - s[0][0]) / 1e3)
        if si:
            between.append((s[0][0] - max(r[1] for r in steps[si - 1])) / 1e3)
        last = s[0][0]
        prev_end = s[0][0]
        sums = defaultdict(float)
        for i, (start, end, _, name, _) in enumerate(s):
            key = f"{labels[i]} | {short_name(name)}" if labels[i] else short_name(name)
            if key not in per:
                order.append(key)
            exposed = max(end - last, 0) / 1e3
            per[key]["dur"].append((end - start) / 1e3)
            per[key]["exposed"].append(exposed)
            per[key]["gap"].append((start - prev_end) / 1e3)
            sums[key] += exposed
            last, prev_end = max(last, end), end
        for key, v in sums.items():
            per[key]["sum"].append(v)
    rows = [{"op": k, "a_step": len(per[k]["dur"]) // len(steps),
             "dur_us": statistics.median(per[k]["dur"]), "exposed_us": statistics.median(per[k]["exposed"]),
             "gap_us": statistics.median(per[k]["gap"]), "exposed_step_us": statistics.median(per[k]["sum"])}
            for k in order]
    return {"kernels_a_step": n, "labelled": bool(labels[0]), "step_us": statistics.median(lengths),
            "between_steps_us": statistics.median(between) if between else 0.0, "ops": rows}


def report(out: dict) -> None:
    for b in out["batches"]:
        print(f"\nB={b['B']}: {b['kernels_a_step']} kernels a step, step {b['step_us']:.1f} µs traced "
              f"({b['untraced_us']:.1f} µs a decode() untraced, {b['traced_us']:.1f} traced), "
              f"{b['between_steps_us']:.1f} µs between steps; {b['steps']} steps")
        print(f"{'op | kernel':<78} {'n':>3} {'dur':>7} {'exposed':>8} {'gap':>7} {'a step':>8} {'share':>6}")
        for r in sorted(b["ops"], key=lambda r: -r["exposed_step_us"]):
            print(f"{r['op'][:78]:<78} {r['a_step']:>3} {r['dur_us']:>7.2f} {r['exposed_us']:>8.2f} "
                  f"{r['gap_us']:>7.2f} {r['exposed_step_us']:>8.1f} {r['exposed_step_us'] / b['step_us']:>6.1%}")


def wall_per_step(seqs: Sequences, steps: int) -> float:
    seqs.engine.m.ctx.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        seqs.step()
    seqs.engine.m.ctx.sync()
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", default="8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16, help="traced decode() steps a B")
    ap.add_argument("--json")
    args = ap.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    tracer = Tracer()  # before any graph is captured
    engine, pages_each = make_engine(args.model, batches, args.prompt, 4 * args.steps + 8)
    rng = np.random.default_rng(0)
    out = {"model": args.model, "batches": []}
    for B in batches:
        seqs = Sequences(engine, B, args.prompt, pages_each, rng)
        labels, restore = launch_labels()
        seqs.step()  # eager, then captured
        restore()
        ops = [f"{module} {op}" for module, op in labels[len(labels) // 2:]]
        engine.lookahead = True
        untraced = wall_per_step(seqs, args.steps)  # CUPTI records these too; they are left out below
        tracer.flush()
        t0 = tracer.now()
        traced = wall_per_step(seqs, args.steps)
        tracer.flush()
        steps = steps_of(tracer.records, t0)
        tracer.records.clear()
        row = {"B": B, "steps": len(steps), "untraced_us": untraced, "traced_us": traced, **analyse(steps, ops)}
        out["batches"].append(row)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    tracer.close()
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
