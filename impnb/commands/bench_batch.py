"""`python -m impnb bench --batch 1,8,32`: llama-batched-bench's table on the batched engine.

For each B: B sequences of npp random prompt tokens are prefilled one after another (T_PP), then
all B decode ntg tokens together, one step a token (T_TG); S_PP and S_TG are the tokens of all
B over those times. Each B runs once as a warm-up (kernel builds, graph capture) and then -r
times; the median of each column's rate is reported, as llama-batched-bench's rows compare.
"""

import json
import statistics
import sys
import time

import numpy as np

from impnb.devices import engine_class
from impnb.errors import ParameterError
from impnb.gguf_file import open_model_file
from impnb.model_registry import resolve_model
from impnb.models.validate import validate_model
from impnb.sampling import SamplingParams
from impnb.tuning import PAGE_SIZE

GREEDY = SamplingParams(temperature=0)


def _round(engine, B: int, npp: int, ntg: int, rng) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of one round of B sequences."""
    from impnb.engine_batch import DecodeRow

    pages_each = -(-(npp + ntg) // PAGE_SIZE)
    pages = [np.arange(b * pages_each, (b + 1) * pages_each, dtype=np.int32) for b in range(B)]
    prompts = [rng.integers(10, engine.cfg.n_vocab, npp).astype(np.int32) for _ in range(B)]
    engine.m.ctx.sync()
    t0 = time.perf_counter()
    last = [engine.prefill_seq(p, 0, pages[b], GREEDY) for b, p in enumerate(prompts)]
    t1 = time.perf_counter()
    for i in range(ntg):
        rows = [DecodeRow(int(last[b]), npp + i, pages[b], GREEDY, i + 1) for b in range(B)]
        last = engine.decode(rows)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def run_batched(args, batches: list[int], npp: int, ntg: int) -> int:
    if args.r <= 0:
        raise ParameterError(f"-r must be > 0, got {args.r}")
    mf = open_model_file(resolve_model(args.model))
    cfg = validate_model(mf)
    if engine_class(args.device, cfg.arch, cfg).device != "cuda":
        raise ParameterError("bench --batch runs the batched GPU engine: it needs --device cuda and a GPU")
    n_ctx = npp + ntg + 1
    if n_ctx > cfg.n_ctx:
        raise ParameterError(f"-p {npp} + -n {ntg} pass the model's context of {cfg.n_ctx}")
    from impnb.engine_batch import BATCH_BUCKETS, CudaBatchEngine
    from impnb.warmup import prepare

    if max(batches) > BATCH_BUCKETS[-1]:
        raise ParameterError(f"--batch sizes must be at most {BATCH_BUCKETS[-1]}, got {max(batches)}")
    tp = getattr(args, "rank", None)  # tensor parallelism: every rank runs these same calls
    if tp is None or tp.leader:
        prepare(mf, n_ctx, tp_world=tp.world if tp else 1, max_batch=max(batches))
    pages_each = -(-(npp + ntg) // PAGE_SIZE)
    engine = CudaBatchEngine(mf, n_ctx, kv_tokens=max(batches) * pages_each * PAGE_SIZE,
                             max_batch=max(batches), graphs=not args.no_graphs, tp=tp)
    rng = np.random.default_rng(0)
    rows = []
    if not args.json:
        print(f"| {'PP':>5} | {'TG':>5} | {'B':>4} | {'N_KV':>7} | {'T_PP s':>8} | {'S_PP t/s':>9} "
              f"| {'T_TG s':>8} | {'S_TG t/s':>9} |")
        print("|" + "|".join("-" * w for w in (7, 7, 6, 9, 10, 11, 10, 11)) + "|", flush=True)
    for B in batches:
        _round(engine, B, npp, ntg, rng)  # warm-up
        times = [_round(engine, B, npp, ntg, rng) for _ in range(args.r)]
        t_pp = statistics.median(t[0] for t in times)
        t_tg = statistics.median(t[1] for t in times)
        r = dict(pp=npp, tg=ntg, batch=B, n_kv=B * (npp + ntg), t_pp=t_pp, s_pp=B * npp / t_pp,
                 t_tg=t_tg, s_tg=B * ntg / t_tg)
        rows.append(r)
        if args.json:
            print(f"impnb: bench: B={B} S_PP {r['s_pp']:.1f} S_TG {r['s_tg']:.1f} tok/s", file=sys.stderr, flush=True)
        else:
            print(f"| {npp:>5} | {ntg:>5} | {B:>4} | {r['n_kv']:>7} | {t_pp:>8.3f} | {r['s_pp']:>9.1f} "
                  f"| {t_tg:>8.3f} | {r['s_tg']:>9.1f} |", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0
