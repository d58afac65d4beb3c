"""`python -m impnb bench`: llama-bench-style prompt (pp) and generation (tg) throughput, warm-up excluded."""

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

GREEDY = SamplingParams(temperature=0)


def _ints(text: str, flag: str, zero: bool = False) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise ParameterError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise ParameterError(f"{flag} takes comma-separated integers, got {text!r}")
    if any(v < (0 if zero else 1) for v in values):
        raise ParameterError(f"{flag} values must be {'>= 0' if zero else '> 0'}, got {text!r}")
    return values


def _pp(engine, ids, depth: list) -> float:
    engine.reset(GREEDY)
    if depth:
        engine.prefill(depth)
    t0 = time.perf_counter()
    engine.prefill(ids)
    return len(ids) / (time.perf_counter() - t0)


def _tg(engine, n: int, depth: list) -> float:
    engine.reset(GREEDY)
    token = engine.prefill(depth or [1])
    t0 = time.perf_counter()
    for _ in range(n):
        token = engine.step(token)
    return n / (time.perf_counter() - t0)


def run(args) -> int:
    tp = getattr(args, "rank", None)
    if args.batch is not None:
        from impnb.commands.bench_batch import run_batched

        return run_batched(args, _ints(args.batch, "--batch"), _ints(args.p, "-p")[0], _ints(args.n, "-n")[0])
    pps, tgs = _ints(args.p, "-p"), _ints(args.n, "-n")
    depths = _ints(args.d, "-d", zero=True)
    if args.r <= 0:
        raise ParameterError(f"-r must be > 0, got {args.r}")
    mf = open_model_file(resolve_model(args.model))
    cfg = validate_model(mf)
    n_ctx = min(cfg.n_ctx, max(pps + [n + 1 for n in tgs]) + max(depths, default=0) + 1)
    cls = engine_class(args.device, cfg.arch, cfg)
    if tp is not None and cls.device != "cuda":
        raise ParameterError(f"--tp {tp.world} needs the GPU (device {cls.device})")
    if not args.json:  # the table's head before the load and warm-ups, each row as it is measured
        print(f"| {'model':<28} | {'size MiB':>8} | {'params M':>8} | {'quant':<8} | {'device':<6} "
              f"| {'graphs':<6} | {'test':>12} | {'tok/s':>16} | {'weights GB/s':>12} |")
        print("|" + "|".join("-" * w for w in (30, 10, 10, 10, 8, 8, 14, 18, 14)) + "|", flush=True)
    if cls.device == "cuda" and (tp is None or tp.leader):  # rank 0 builds a rank's kernels
        from impnb.warmup import prepare

        prepare(mf, n_ctx, tp_world=tp.world if tp else 1)  # a first start compiles them across the cores
    engine = cls(mf, n_ctx, graphs=not args.no_graphs, tp=tp) if cls.device == "cuda" else cls(mf, n_ctx)
    rng = np.random.default_rng(0)
    rows = []
    step_bytes = bytes_per_token(mf, cfg)
    tests = []
    for d in depths or [0]:
        ctx = rng.integers(10, cfg.n_vocab, d).tolist()
        at = f" @ d{d}" if d else ""
        tests += [(f"pp{p}{at}", lambda p=p, c=ctx: _pp(engine, rng.integers(10, cfg.n_vocab, p).tolist(), c))
                  for p in pps]
        tests += [(f"tg{n}{at}", lambda n=n, c=ctx: _tg(engine, n, c)) for n in tgs]
    for name, fn in tests:
        fn()  # warm-up: compilation, buffers, graph capture
        rates = [fn() for _ in range(args.r)]
        r = dict(model=mf.get("general.name", mf.arch), size_mib=round(sum(
            t.data.nbytes for t in mf.tensors.values()) / 2**20, 1), params_m=round(mf.n_params() / 1e6, 1),
            quant=_quant(mf), device=engine.device + (f" tp{tp.world}" if tp else ""),
            graphs=getattr(engine, "use_graphs", False),
            test=name, tok_s=statistics.median(rates), std=statistics.pstdev(rates),
            weight_gb_s=round(statistics.median(rates) * step_bytes / 1e9, 1) if name.startswith("tg") else None)
        rows.append(r)
        if args.json:
            print(f"impnb: bench: {name} {r['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
        else:
            print(f"| {r['model'][:28]:<28} | {r['size_mib']:>8} | {r['params_m']:>8} | {r['quant']:<8} "
                  f"| {r['device']:<6} | {str(r['graphs']):<6} | {r['test']:>12} "
                  f"| {r['tok_s']:>8.1f} ± {r['std']:<5.1f} | {r['weight_gb_s'] or '':>12} |", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    sys.stdout.flush()
    return 0


def bytes_per_token(mf, cfg) -> int:
    """Weight bytes one decode step reads: every tensor, the embedding table as one row (unless it
    is also the output matrix), routed expert tensors (`*_exps`) at k/E of their size."""
    total = 0
    for name, t in mf.tensors.items():
        n = t.data.nbytes
        if name == "token_embd.weight" and "output.weight" in mf.tensors:
            n //= t.data.shape[0]
        elif "_exps." in name:
            n = n * cfg.n_expert_used // cfg.n_expert
        total += n
    return total


def _quant(mf) -> str:
    from collections import Counter

    sizes = Counter()
    for t in mf.tensors.values():
        if len(t.shape) > 1:
            sizes[t.fmt.name] += t.data.nbytes
    return sizes.most_common(1)[0][0] if sizes else "?"
