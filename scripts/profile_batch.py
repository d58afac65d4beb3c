"""Where a batched decode step's time goes (CudaBatchEngine.decode at B sequences): every kernel
node of the step's captured graph with the op that launched it, timed alone (profile_step's
node_cost: REPS copies chained in a graph of their own), the whole graph's replay, and decode()'s
host time: staging the rows, launching the replay, and the wait for the device.

    python scripts/profile_batch.py MODEL [--batch 1,8,32,64] [--prompt 128] [--json PATH]

With --ncu each B's graph is replayed once between cuProfilerStart and cuProfilerStop and nothing
is timed; --merge JSON NCU_CSV then adds each kernel's DRAM bytes and cold-L2 duration from ncu's
CSV (`ncu --profile-from-start off --csv --print-units base --metrics gpu__time_duration.sum,
dram__bytes_read.sum,dram__bytes_write.sum`), matched to the nodes in graph order.
"""

import argparse
import csv
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from cuda.bindings import driver

sys.path.insert(0, str(Path(__file__).parents[1]))

from profile_step import kernel_name, node_cost, ok, time_graph  # noqa: E402

STEPS = 24  # timed decode() calls per B
REPLAYS = 30  # timed replays of a B's graph
# positions a B's profile advances its sequences past the prompt: the eager and captured steps, one
# more, the host's two rounds of STEPS, and the graph's replays with their warm-up (each replay
# advances the positions on the device, past any check of the host's)
OWN_STEPS = 3 + 2 * STEPS + 3 + REPLAYS
UNITS = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}  # -> ns, bytes


def launch_labels(callers=("forward", "moe", "engine_batch", "engine_cuda")):
    """(labels, restore): every impnb module's bound `launch` wrapped to note, per launch, the
    kernel's module (impnb.kernels.<family>.<file>) and the op: the innermost impnb function of
    `callers` (file stem, function, line) that asked for it, the MatMul method (gpu/linear.py)
    between, and the launcher."""
    import impnb.launch

    original = impnb.launch.launch
    labels = []

    def noted(kernel, *args, **kwargs):
        frame, found = sys._getframe(1), {}
        while frame is not None and "op" not in found:
            path = frame.f_code.co_filename
            stem = Path(path).stem
            if "/kernels/" in path:
                found.setdefault("launcher", frame.f_code.co_name)
            elif "/impnb/" in path and stem == "linear":
                found.setdefault("mm", frame.f_code.co_name)
            elif "/impnb/" in path and stem in callers:
                found["op"] = f"{stem}.{frame.f_code.co_name}:{frame.f_lineno}"
            frame = frame.f_back
        op = " ".join(found[k] for k in ("op", "mm", "launcher") if k in found)
        module = (kernel.py_func.__module__ or "?").removeprefix("impnb.kernels.")
        labels.append((module, op or "?"))
        return original(kernel, *args, **kwargs)

    patched = [m for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("impnb") and getattr(m, "launch", None) is original]
    for m in patched:
        m.launch = noted

    def restore():
        for m in patched:
            m.launch = original

    return labels, restore


def make_engine(model: str, batches: list[int], npp: int, ntg: int):
    from impnb.engine_batch import CudaBatchEngine
    from impnb.gguf_file import open_model_file
    from impnb.model_registry import resolve_model
    from impnb.tuning import PAGE_SIZE
    from impnb.warmup import prepare

    mf = open_model_file(resolve_model(model))
    n_ctx = npp + ntg + OWN_STEPS + 1
    prepare(mf, n_ctx)
    pages_each = -(-(n_ctx - 1) // PAGE_SIZE)
    engine = CudaBatchEngine(mf, n_ctx, kv_tokens=max(batches) * pages_each * PAGE_SIZE, max_batch=max(batches))
    return engine, pages_each


class Sequences:
    """B sequences with prompts prefilled, decoded a step at a time (greedy)."""

    def __init__(self, engine, B: int, npp: int, pages_each: int, rng):
        from impnb.sampling import SamplingParams

        self.engine, self.greedy = engine, SamplingParams(temperature=0)
        self.pages = [np.arange(b * pages_each, (b + 1) * pages_each, dtype=np.int32) for b in range(B)]
        prompts = [rng.integers(10, engine.cfg.n_vocab, npp).astype(np.int32) for _ in range(B)]
        self.last = [engine.prefill_seq(p, 0, self.pages[b], self.greedy) for b, p in enumerate(prompts)]
        self.pos, self.n_sampled = npp, 1

    def step(self):
        from impnb.engine_batch import DecodeRow

        rows = [DecodeRow(int(t), self.pos, self.pages[b], self.greedy, self.n_sampled)
                for b, t in enumerate(self.last)]
        self.last = self.engine.decode(rows)
        self.pos, self.n_sampled = self.pos + 1, self.n_sampled + 1


def host_times(engine, seqs: Sequences, steps: int) -> dict:
    """Median µs per decode(): wall, staging (_stage, its sync included), the replay call, the
    waits for the device (ctx.sync), and Python's own time (wall less the waits)."""
    spent = defaultdict(float)

    def timed(name, fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[name] += time.perf_counter() - t0
            return out
        return run

    ctx = engine.m.ctx
    saved = engine._stage, ctx.sync
    engine._stage = timed("stage", engine._stage)
    ctx.sync = timed("wait", ctx.sync)
    for g in engine.batch_graphs.values():
        g.replay = timed("replay", g.replay)
    rows = defaultdict(list)
    for _ in range(steps):
        spent.clear()
        t0 = time.perf_counter()
        seqs.step()
        wall = time.perf_counter() - t0
        for k, v in (("wall", wall), *spent.items(), ("python", wall - spent["wait"])):
            rows[k].append(v * 1e6)
    engine._stage, ctx.sync = saved
    for g in engine.batch_graphs.values():
        del g.replay
    return {k: statistics.median(v) for k, v in rows.items()}


def profile(args) -> dict:
    from impnb.engine_batch import batch_bucket

    engine, pages_each = make_engine(args.model, args.batch, args.prompt, args.gen)
    rng = np.random.default_rng(0)
    out = {"model": args.model, "batches": []}
    for B in args.batch:
        seqs = Sequences(engine, B, args.prompt, pages_each, rng)
        labels, restore = launch_labels()
        seqs.step()  # eager, then captured
        restore()
        key = next(k for k in engine.batch_graphs if k[0] == batch_bucket(B, engine.max_batch))
        graph = engine.batch_graphs[key]
        if args.ncu:
            ok(driver.cuCtxSynchronize())
            ok(driver.cuProfilerStart())
            graph.replay()
            ok(driver.cuCtxSynchronize())
            ok(driver.cuProfilerStop())
            continue
        seqs.step()
        engine.lookahead = False  # each step staged and waited for
        host = host_times(engine, seqs, STEPS)
        engine.lookahead = True  # the next step queued before the host reads this one's tokens
        ahead = host_times(engine, seqs, STEPS)["wall"]
        engine.lookahead = False
        replay = time_graph(graph.exec, graph.stream, REPLAYS)
        nodes, _ = ok(driver.cuGraphGetNodes(graph.graph, graph.n_nodes))
        kernels = []
        n_launch = len(labels) // 2  # the eager step's launches, then the capture's
        launched = labels[n_launch:]
        at = 0
        for node in nodes:
            if ok(driver.cuGraphNodeGetType(node)) != driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                continue
            params = ok(driver.cuGraphKernelNodeGetParams(node))
            name = kernel_name(params)
            op = "(no launch() of ours: cuBLAS?)"
            match = next((i for i in range(at, min(at + 4, len(launched))) if launched[i][0] == name), None)
            if match is not None:
                op, at = launched[match][1], match + 1
            us = node_cost(node, params, graph.stream, args.reps)
            kernels.append({"op": op, "kernel": name, "grid": f"{params.gridDimX}x{params.gridDimY}x{params.gridDimZ}",
                            "us": us})
        matched = sum(not k["op"].startswith("(") for k in kernels)
        out["batches"].append({"B": B, "bucket": key[0], "graph_nodes": graph.n_nodes, "replay_us": replay,
                               "graphs": len(engine.batch_graphs), "graph_disabled": engine.graph_disabled,
                               "host": host, "lookahead_wall_us": ahead, "unmatched_launches": len(launched) - matched,
                               "kernels": kernels})
        if args.json:  # after every B: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"B={B}: {len(kernels)} kernels, replay {replay:.1f} µs, decode() wall {host['wall']:.1f} µs "
              f"(python {host['python']:.1f}, stage {host.get('stage', 0):.1f}, waits {host.get('wait', 0):.1f})"
              + (f"; look-ahead route {ahead:.1f} µs" if ahead else ""), file=sys.stderr, flush=True)
    return out


def ncu_kernels(path: str) -> list[dict]:
    """ncu's CSV (--print-units base) -> one dict a kernel in profile order: name, ns, bytes."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), len(lines))
    rows = csv.DictReader(line for line in lines[header:] if line.startswith('"'))  # not the program's own
    by_id: dict[str, dict] = {}
    for r in rows:
        k = by_id.setdefault(r["ID"], {"name": r["Kernel Name"], "ns": float("nan"), "bytes": 0.0})
        value = float(r["Metric Value"].replace(",", "")) if r["Metric Value"] else float("nan")
        value *= UNITS.get(r["Metric Unit"], 1.0)
        if r["Metric Name"] == "gpu__time_duration.sum":
            k["ns"] = value
        elif r["Metric Name"].startswith("dram__bytes"):
            k["bytes"] += value
    return list(by_id.values())


def merge(data: dict, ncu: list[dict]) -> None:
    """Each kernel's ncu bytes and duration, matched in order (B by B) where the names agree."""
    at = 0
    for b in data["batches"]:
        for k in b["kernels"]:
            if at < len(ncu) and k["kernel"].split(".")[-1] in ncu[at]["name"]:
                k["bytes"], k["ncu_us"] = ncu[at]["bytes"], ncu[at]["ns"] / 1e3
            at += 1


def report(data: dict) -> None:
    """A row per (op, kernel) per B, heaviest first, then a line per B of the host's figures."""
    print(f"{'B':>3} {'op':<44} {'kernel':<34} {'n':>3} {'µs':>8} {'%step':>6} {'MB':>8} {'GB/s':>6} {'ncu µs':>7}")
    for b in data["batches"]:
        groups = defaultdict(list)
        for k in b["kernels"]:
            groups[(k["op"], k["kernel"])].append(k)
        total = sum(k["us"] for k in b["kernels"])
        rows = sorted(groups.items(), key=lambda kv: -sum(k["us"] for k in kv[1]))
        print(f"{b['B']:>3} {'(all: sum of kernels alone)':<44} {'':<34} {len(b['kernels']):>3} {total:>8.1f}")
        for (op, name), ks in rows:
            us = sum(k["us"] for k in ks)
            mb = sum(k.get("bytes", float("nan")) for k in ks) / 1e6
            ncu_us = sum(k.get("ncu_us", float("nan")) for k in ks)
            print(f"{b['B']:>3} {op[:44]:<44} {name[:34]:<34} {len(ks):>3} {us:>8.1f} {us / b['replay_us']:>6.1%} "
                  f"{mb:>8.2f} {mb * 1e6 / (ncu_us * 1e3) if ncu_us else float('nan'):>6.0f} {ncu_us:>7.1f}")
    print(f"\n{'B':>3} {'bucket':>6} {'nodes':>5} {'replay µs':>9} {'wall µs':>8} {'python':>7} {'stage':>7} "
          f"{'replay()':>8} {'waits':>7} {'tok/s':>7} {'B=1 ahead µs':>12} {'unmatched':>9}")
    for b in data["batches"]:
        h = b["host"]
        ahead = f"{b['lookahead_wall_us']:.1f}" if b["lookahead_wall_us"] else "-"
        print(f"{b['B']:>3} {b['bucket']:>6} {b['graph_nodes']:>5} {b['replay_us']:>9.1f} {h['wall']:>8.1f} "
              f"{h['python']:>7.1f} {h.get('stage', 0):>7.1f} {h.get('replay', 0):>8.1f} {h.get('wait', 0):>7.1f} "
              f"{b['B'] / h['wall'] * 1e6:>7.0f} {ahead:>12} {b['unmatched_launches']:>9}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--batch", default="1,8,32,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64, help="decode positions the KV pool holds past the prompt and the profile's own steps")
    ap.add_argument("--reps", type=int, default=5, help="copies of a node in its timing graph")
    ap.add_argument("--json")
    ap.add_argument("--ncu", action="store_true", help="each B's graph replayed once in the profiler's range")
    ap.add_argument("--merge", nargs=2, metavar=("JSON", "NCU_CSV"))
    args = ap.parse_args()
    if args.merge:
        data = json.loads(Path(args.merge[0]).read_text())
        merge(data, ncu_kernels(args.merge[1]))
        report(data)
        return 0
    args.batch = [int(b) for b in args.batch.split(",")]
    data = profile(args)
    if args.ncu:
        return 0
    report(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
