"""Where a decode step's (or a prompt chunk's) time goes: every kernel node of its captured graph, timed.

Each kernel node is copied REPS times into a graph of its own (a chain, as in the step) and
replayed; its in-graph cost is the replay time / REPS. Rows are grouped by kernel name. Also
printed: the whole graph's replay time, engine.step()'s wall time and the Python time in it
(step() less the wait for the device's token).
    python scripts/profile_step.py MODEL [--tokens 64] [--reps 50] [--depth D] [--prefill N] [--json PATH]
--depth D decodes after a prompt of D tokens (attention's cost grows with it); --prefill N
profiles the graph of the last prompt chunk of an N-token prompt (its bucket's graph: a served
128-token prompt is one chunk in the 128-row graph; its attention reads the positions of the
chunks before it) instead of a decode step, and reports no host time.
--in-situ times each kernel where it runs instead: the graph's kernels re-made as a chain with an
event between each two, so each reads what its predecessors wrote and finds the caches they left
(alone, a kernel repeated finds its own data in L2, and one whose work follows data made by
others, as the MoE's, repeats with that data as it was).
With --ncu, one replay of the step's graph runs between cuProfilerStart and cuProfilerStop and
nothing is timed: `ncu --profile-from-start off ... python scripts/profile_step.py MODEL --ncu`
profiles each kernel of one decode step (L2 flushed before each, as the weights are cold in a step);
scripts/ncu_table.py tabulates its CSV (`scripts/gpu_check.sh ncu` runs both).
"""

import argparse
import json
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import numpy as np  # noqa: E402
from cuda.bindings import driver  # noqa: E402

from impnb.engine_cuda import CudaEngine  # noqa: E402
from impnb.gguf_file import open_model_file  # noqa: E402
from impnb.graphs import prefill as prefill_graphs  # noqa: E402
from impnb.model_registry import resolve_model  # noqa: E402
from impnb.sampling import SamplingParams  # noqa: E402
from impnb.warmup import prepare  # noqa: E402


def ok(result):
    err, *rest = result
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest


def kernel_name(params) -> str:
    """module.function of a numba kernel from its mangled symbol (_ZN5impnb7kernels...)."""
    raw = ok(driver.cuFuncGetName(params.func))
    return short_name(raw.decode() if isinstance(raw, bytes) else str(raw))


def short_name(s: str) -> str:
    """module.function of a numba kernel's mangled symbol; other names as they are."""
    s = s[s.find("cudapy") + 6:] if "cudapy" in s else s.removeprefix("_ZN")
    words = []
    while (m := re.match(r"(\d+)", s)):
        n, s = int(m.group(1)), s[len(m.group(1)):]
        words.append(s[:n])
        s = s[n:]
    if words[:2] == ["impnb", "kernels"]:
        words = words[2:4]
    return ".".join(words) or s


def time_graph(exec_, stream, reps: int) -> float:
    """Median µs of one replay of exec_ over `reps` replays, after a warm-up."""
    start, end = ok(driver.cuEventCreate(0)), ok(driver.cuEventCreate(0))
    for _ in range(3):
        ok(driver.cuGraphLaunch(exec_, stream))
    times = []
    for _ in range(reps):
        ok(driver.cuEventRecord(start, stream))
        ok(driver.cuGraphLaunch(exec_, stream))
        ok(driver.cuEventRecord(end, stream))
        ok(driver.cuEventSynchronize(end))
        times.append(ok(driver.cuEventElapsedTime(start, end)) * 1e3)
    return statistics.median(times)


_CLUSTER = driver.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


def node_cost(node, params, stream, copies: int) -> float:
    """µs per launch of one kernel node (its cluster dims kept), replayed `copies` times in a
    chain inside one graph."""
    cluster = ok(driver.cuGraphKernelNodeGetAttribute(node, _CLUSTER))
    g = ok(driver.cuGraphCreate(0))
    prev = []
    for _ in range(copies):
        prev = [ok(driver.cuGraphAddKernelNode(g, prev, len(prev), params))]
        ok(driver.cuGraphKernelNodeSetAttribute(prev[0], _CLUSTER, cluster))
    ex = ok(driver.cuGraphInstantiate(g, 0))
    us = time_graph(ex, stream, 20) / copies
    driver.cuGraphExecDestroy(ex)
    driver.cuGraphDestroy(g)
    return us


def in_situ(nodes, stream, replays: int) -> tuple[list, float]:
    """µs of each kernel node in place: the nodes re-made in their order as a chain with an event
    recorded before each (and after the last), so a kernel runs on the data and caches its
    predecessors left; the median of `replays` replays per node, and that graph's median total."""
    g = ok(driver.cuGraphCreate(0))
    prev, events = [], []
    for node in nodes + [None]:
        ev = ok(driver.cuEventCreate(0))
        events.append(ev)
        prev = [ok(driver.cuGraphAddEventRecordNode(g, prev, len(prev), ev))]
        if node is None:
            break
        params = ok(driver.cuGraphKernelNodeGetParams(node))
        k = ok(driver.cuGraphAddKernelNode(g, prev, 1, params))
        ok(driver.cuGraphKernelNodeSetAttribute(k, _CLUSTER, ok(driver.cuGraphKernelNodeGetAttribute(node, _CLUSTER))))
        prev = [k]
    ex = ok(driver.cuGraphInstantiate(g, 0))
    per = [[] for _ in nodes]
    totals = []
    for rep in range(replays + 1):
        ok(driver.cuGraphLaunch(ex, stream))
        ok(driver.cuStreamSynchronize(stream))
        if rep == 0:
            continue
        for i in range(len(nodes)):
            per[i].append(ok(driver.cuEventElapsedTime(events[i], events[i + 1])) * 1e3)
        totals.append(ok(driver.cuEventElapsedTime(events[0], events[-1])) * 1e3)
    driver.cuGraphExecDestroy(ex)
    driver.cuGraphDestroy(g)
    return [statistics.median(v) for v in per], statistics.median(totals)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=64, help="steps for the host wall time")
    ap.add_argument("--reps", type=int, default=50, help="copies of a node in its timing graph")
    ap.add_argument("--json")
    ap.add_argument("--by-grid", action="store_true", help="a row per kernel and grid, not per kernel")
    ap.add_argument("--ncu", action="store_true", help="one replay inside the profiler's range, for ncu")
    ap.add_argument("--depth", type=int, default=64, help="prompt tokens before the decode steps")
    ap.add_argument("--prefill", type=int, help="profile the last prompt chunk of this many tokens")
    ap.add_argument("--in-situ", action="store_true",
                    help="time each kernel in place between events (not alone in a chain of copies)")
    args = ap.parse_args()
    if args.prefill is not None and args.prefill <= 0:
        ap.error(f"--prefill takes a positive number of tokens, got {args.prefill}")

    mf = open_model_file(resolve_model(args.model))
    rng = np.random.default_rng(0)
    if args.depth < 0:
        ap.error(f"--depth takes a non-negative number of tokens, got {args.depth}")
    n_prompt = args.prefill or max(args.depth, 1)  # a decode step needs one token before it
    n_ctx = max(1024, n_prompt + args.tokens + 8)
    prepare(mf, n_ctx)  # a first start compiles the model's kernels across the cores
    eng = CudaEngine(mf, n_ctx)
    chunk = eng.m.chunk
    last = (args.prefill - 1) % chunk + 1 if args.prefill else 0  # the last chunk's tokens
    if args.prefill and prefill_graphs.bucket(last, args.prefill - last, n_ctx) is None:
        ap.error(f"--prefill {args.prefill}: its last chunk of {last} tokens has no graph bucket")
    eng.reset(SamplingParams(temperature=0))
    vocab = eng.cfg.n_vocab
    tok = eng.prefill(rng.integers(10, vocab, n_prompt).tolist())
    if args.prefill:  # again: the first run captured the chunk's graph after running it eagerly
        eng.reset(SamplingParams(temperature=0))
        eng.prefill(rng.integers(10, vocab, n_prompt).tolist())
        graph = eng.prefill_graphs[prefill_graphs.bucket(last, args.prefill - last, n_ctx)]
    else:
        for _ in range(3):  # eager step, capture, one replay
            tok = eng.step(tok)
        graph = list(eng.graphs.values())[-1]
    if args.ncu:
        ok(driver.cuCtxSynchronize())
        ok(driver.cuProfilerStart())
        ok(driver.cuGraphLaunch(graph.exec, graph.stream))
        ok(driver.cuCtxSynchronize())
        ok(driver.cuProfilerStop())
        return 0
    walls, hosts, waits = [], [], []
    collect = eng.replays.collect

    def timed_collect(ticket):  # the host's wait for the device, not Python's own time
        t0 = time.perf_counter()
        token = collect(ticket)
        waits.append((time.perf_counter() - t0) * 1e6)
        return token

    eng.replays.collect = timed_collect
    for _ in range(0 if args.prefill else args.tokens):
        n_waits = len(waits)
        t0 = time.perf_counter()
        tok = eng.step(tok)
        walls.append((time.perf_counter() - t0) * 1e6)
        hosts.append(walls[-1] - sum(waits[n_waits:]))
    host = statistics.median(hosts) if hosts else 0.0
    wall = statistics.median(walls) if walls else 0.0
    stream = graph.stream
    replay = time_graph(graph.exec, stream, 50)

    nodes, _ = ok(driver.cuGraphGetNodes(graph.graph, graph.n_nodes))
    by_name = defaultdict(list)
    kernels = [n for n in nodes
               if ok(driver.cuGraphNodeGetType(n)) == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL]
    others = len(nodes) - len(kernels)
    if args.in_situ:
        costs, chain = in_situ(kernels, stream, args.reps)
        print(f"in place between events: the chain's replay {chain:.1f} µs")
    for i, node in enumerate(kernels):
        params = ok(driver.cuGraphKernelNodeGetParams(node))
        name = kernel_name(params)
        if args.by_grid:
            name += f" {params.gridDimX}x{params.gridDimY}x{params.gridDimZ}/{params.blockDimX}"
        by_name[name].append(costs[i] if args.in_situ else node_cost(node, params, stream, args.reps))
    rows = sorted(((k, len(v), sum(v)) for k, v in by_name.items()), key=lambda r: -r[2])
    total = sum(r[2] for r in rows)
    what = f"prefill chunk at {args.prefill - chunk}" if args.prefill else f"decode at depth {args.depth}"
    print(f"{args.model} ({what}): {len(nodes)} nodes ({others} not kernels); graph replay {replay:.1f} µs; "
          f"step() wall {wall:.1f} µs, of it Python {host:.1f} µs; "
          f"sum of nodes {'in place' if args.in_situ else 'alone'} {total:.1f} µs")
    print(f"{'kernel':<56} {'count':>5} {'µs total':>9} {'µs each':>8} {'share':>6}")
    for name, count, us in rows:
        print(f"{name[:56]:<56} {count:>5} {us:>9.1f} {us / count:>8.2f} {us / total:>6.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "nodes": len(nodes), "replay_us": replay,
            "step_wall_us": wall, "host_us": host, "kernels": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
