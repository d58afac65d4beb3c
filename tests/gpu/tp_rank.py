"""One tensor-parallel rank of the GPU tests (tests/gpu/test_tensor_parallel.py, .dev/gpu/tp.sh):
`python -m tests.gpu.tp_rank --tp N MODE ...` is rank 0 and starts ranks 1..N-1 with the same
arguments (impnb/parallel/ranks.py); rank 0 writes what it saw to --out (npz) and a summary line.

  collectives: the binding alone: all-reduce (fp32, fp16), all-gather and broadcast of Gaussian
               arrays of odd sizes equal their host sums / copies, eagerly and replayed from a
               captured CUDA graph (every rank checks its own result; a mismatch exits 1)
  engine:      the CUDA engine on --model: teacher-forced decode and prefill logits, greedy
               continuations through graphs and eagerly, a sampled one
  batch:       the batched engine on --model: --seqs sequences (3) decoded together, greedy
"""

import argparse
import sys
import time

import numpy as np

from impnb.parallel.ranks import start
from tests.gpu.test_graphs import decode

SIZES = (1, 19, 989, (1 << 20) + 3)
STDS = (1e-3, 1.0, 300.0)


def rank_array(rank: int, n: int, std: float, dtype) -> np.ndarray:
    return (np.random.default_rng([rank, n, int(std * 1000)]).standard_normal(n) * std).astype(dtype)


def collectives(rank, args) -> dict:
    from impnb.gpu.context import GpuContext
    from impnb.graphs.capture import Graph
    from impnb.parallel.group import TensorParallel

    ctx = GpuContext(rank.local_rank)
    tp = TensorParallel.join(rank, ctx)
    cuda, s, world = ctx.cuda, ctx.nb_stream, rank.world
    lines, bad = [], []
    for dtype in (np.float32, np.float16):
        for n in SIZES:
            for std in STDS:
                mine = rank_array(rank.rank, n, std, dtype)
                want = sum(rank_array(r, n, std, dtype).astype(np.float64) for r in range(world))
                if world == 2:  # a sum of two is one rounding, whatever the order: exact
                    want = (rank_array(0, n, std, dtype).astype(np.float32)
                            + rank_array(1, n, std, dtype).astype(np.float32)).astype(dtype)
                buf = ctx.upload(mine)
                tp.all_reduce(buf)
                ctx.sync()
                got = buf.copy_to_host()
                graph_buf = ctx.upload(np.full(n, np.nan, dtype))
                graph = Graph(ctx.handle, lambda: tp.all_reduce(graph_buf))
                graph_got = []
                for _ in range(2):  # replayed twice on fresh inputs
                    graph_buf.copy_to_device(mine, stream=s)
                    graph.replay()
                    ctx.sync()
                    graph_got.append(graph_buf.copy_to_host())
                graph.close()
                for what, out in (("eager", got), ("graph", graph_got[0]), ("graph again", graph_got[1])):
                    err = _err(out, want, world)
                    if err is not None:
                        bad.append(f"all_reduce {np.dtype(dtype).name} n={n} std={std:g} {what}: {err}")
                lines.append(f"all_reduce {np.dtype(dtype).name} n={n} std={std:g}: ok")
    n = 989
    part = ctx.upload(rank_array(rank.rank, n, 1.0, np.float32))
    whole = ctx.upload(np.full(world * n, np.nan, np.float32))
    graph = Graph(ctx.handle, lambda: tp.all_gather(part, whole))
    graph.replay()
    ctx.sync()
    want = np.concatenate([rank_array(r, n, 1.0, np.float32) for r in range(world)])
    if not np.array_equal(whole.copy_to_host(), want):
        bad.append("all_gather in a graph: not every rank's part")
    ids = ctx.upload(np.array([1000 + rank.rank], np.int32))
    tp.broadcast(ids)
    ctx.sync()
    if ids.copy_to_host()[0] != 1000:
        bad.append(f"broadcast: rank {rank.rank} holds {ids.copy_to_host()[0]}, not rank 0's 1000")
    if bad:
        print(f"rank {rank.rank}: " + "; ".join(bad[:4]), file=sys.stderr)
        sys.exit(1)
    print(f"rank {rank.rank}: {len(lines)} all-reduces, all-gather and broadcast equal the host's", file=sys.stderr)
    return {"checked": np.array(len(lines))}


def _err(out, want, world) -> str | None:
    if np.isnan(out).any():
        return "NaN left (not written)"
    if world == 2:
        if not np.array_equal(out, want):
            i = int(np.argmax(out != want))
            return f"differs at {i}: {out[i]} != {want[i]}"
        return None
    tol = 1e-2 if out.dtype == np.float16 else 1e-5
    rel = np.abs(out - want).max() / max(np.abs(want).max(), 1e-30)
    return None if rel < tol else f"max rel error {rel:.2e}"


def engine_run(rank, args) -> dict:
    from impnb.engine_cuda import CudaEngine
    from impnb.gguf_file import open_model_file
    from impnb.sampling import SamplingParams

    mf = open_model_file(args.model)
    t0 = time.perf_counter()
    if rank is None or rank.leader:  # a rank's kernels built across the cores (the others wait to join)
        from impnb.warmup import prepare

        prepare(mf, 256, tp_world=rank.world if rank else 1)
    engine = CudaEngine(mf, 256, graphs=True, lookahead=False, tp=rank)
    print(f"rank {rank.rank if rank else 0}: loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    ids = np.random.default_rng(1).integers(0, engine.cfg.n_vocab, args.tokens).astype(np.int32)
    greedy = SamplingParams(temperature=0)
    engine.reset(greedy)
    out = {"ids": ids}
    out["decode"] = np.concatenate([engine.logits([t]) for t in ids])
    engine.reset(greedy)
    out["prefill"] = engine.logits(ids)
    out["greedy_graph"], out["greedy_graph_logits"] = decode(engine, ids[:10], greedy, args.steps)
    out["sampled_graph"], _ = decode(engine, ids[:10], SamplingParams(temperature=0.8, seed=3), args.steps)
    out["graph_ok"] = np.array(bool(engine.graphs) and engine.graph_disabled is None)
    eager = CudaEngine(mf, 256, graphs=False, lookahead=False, tp=rank)
    out["greedy_eager"], out["greedy_eager_logits"] = decode(eager, ids[:10], greedy, args.steps)
    lookahead = CudaEngine(mf, 256, graphs=True, lookahead=True, tp=rank)
    lookahead.reset(greedy)
    token = lookahead.prefill(ids[:10])
    toks = [token]
    for _ in range(args.steps):
        token = lookahead.step(token)
        toks.append(token)
    out["greedy_lookahead"] = np.array(toks)
    return out


def batch_run(rank, args) -> dict:
    """The batched engine: --seqs sequences' prompts of different lengths, then greedy decode steps
    of all of them together (their tokens), and one step's logits unsampled. Past 8 sequences the
    rows take the GEMM paths (and the batch's fused norms)."""
    from impnb.engine_batch import CudaBatchEngine, DecodeRow
    from impnb.gguf_file import open_model_file
    from impnb.sampling import SamplingParams
    from impnb.tuning import PAGE_SIZE

    mf = open_model_file(args.model)
    n = args.seqs
    if rank is None or rank.leader:
        from impnb.warmup import prepare

        prepare(mf, 256, tp_world=rank.world if rank else 1)
    engine = CudaBatchEngine(mf, 256, kv_tokens=n * 256, max_batch=max(4, n), tp=rank)
    greedy = SamplingParams(temperature=0)
    rng = np.random.default_rng(2)
    per = 256 // PAGE_SIZE
    pages = [np.arange(b * per, (b + 1) * per, dtype=np.int32) for b in range(n)]
    lengths = (5, 17, 40) if n == 3 else rng.integers(3, 60, n)
    prompts = [rng.integers(0, engine.cfg.n_vocab, k).astype(np.int32) for k in lengths]
    last = [engine.prefill_seq(p, 0, pages[b], greedy) for b, p in enumerate(prompts)]
    tokens = [last]
    for i in range(args.steps):
        rows = [DecodeRow(int(last[b]), len(prompts[b]) + i, pages[b], greedy, i + 1) for b in range(n)]
        last = [int(t) for t in engine.decode(rows)]
        tokens.append(last)
    rows = [DecodeRow(int(last[b]), len(prompts[b]) + args.steps, pages[b], greedy, args.steps + 1)
            for b in range(n)]
    return {"tokens": np.array(tokens), "logits": engine.decode_logits(rows)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("collectives", "engine", "batch"))
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--model")
    p.add_argument("--out")
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--seqs", type=int, default=3)
    args = p.parse_args()
    rank = start(args.tp, [sys.executable, "-m", "tests.gpu.tp_rank", *sys.argv[1:]])
    out = {"collectives": collectives, "engine": engine_run, "batch": batch_run}[args.mode](rank, args)
    if (rank is None or rank.leader) and args.out:
        np.savez(args.out, **out)
    if rank is None or rank.leader:
        print(f"tp_rank {args.mode} --tp {args.tp}: done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        code = main()
        from impnb.parallel.ranks import exit_rank

        exit_rank(code)
    except Exception as e:  # one line, exit 2 (rank 0's watcher quotes a failed rank's last line)
        import traceback

        traceback.print_exc()
        print(f"impnb: error: {type(e).__name__}: {e}", file=sys.stderr)
        from impnb.parallel.ranks import abort_workers

        abort_workers()
        sys.exit(2)
