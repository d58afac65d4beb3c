"""Where a start's time goes: `impnb generate` run in this process under cProfile, imports included,
then the seconds of each start-up step (imports, GGUF open and validation, tokenizer, kernel
warm-up check, engine load, kernel loads, graph captures, the first token) and the functions
that took the most.

    python scripts/profile_startup.py [-m gemma3-270m] [-n 32] [--device cuda] [--top 30]
        [--save out.prof]

Run it after one `generate` of the same model has filled the caches to see a warm start.
"""

import argparse
import cProfile
import io
import pstats
import sys
import time

PROMPT = "The Eiffel Tower is located in the city of"

# step -> (file suffix, function name) whose cumulative time is that step's
STEPS = [
    ("imports", ("<frozen importlib._bootstrap>", "_find_and_load")),
    ("GGUF open", ("impnb/gguf_file.py", "open_model_file")),
    ("validate", ("impnb/models/validate.py", "validate_model")),
    ("tokenizer", ("impnb/tokenizer.py", "from_metadata")),
    ("warm-up check", ("impnb/warmup.py", "prepare")),
    ("CUDA engine load", ("impnb/engine_cuda.py", "__init__")),
    ("  weights", ("impnb/gpu/model.py", "__init__")),
    ("kernel loads", ("impnb/launch/launcher.py", "__init__")),
    ("  cubin files", ("impnb/launch/cache.py", "get_cubin")),
    ("graph captures", ("impnb/graphs/capture.py", "__init__")),
    ("engine steps", ("impnb/serve/engine.py", "step")),
]


class _FirstWrite(io.TextIOBase):
    """stdout that notes when the first non-blank text arrives."""

    def __init__(self, inner, start: float):
        self.inner, self.start, self.first = inner, start, None

    def write(self, s: str) -> int:
        if self.first is None and s.strip():
            self.first = time.perf_counter() - self.start
        return self.inner.write(s)

    def flush(self) -> None:
        self.inner.flush()


def step_seconds(stats: pstats.Stats) -> dict[str, float]:
    """The largest cumulative time of each STEPS function (recursive calls are not summed)."""
    out = {}
    for name, (suffix, func) in STEPS:
        cum = [ct for (file, _, fn), (_, _, _, ct, _) in stats.stats.items()
               if fn == func and file.endswith(suffix)]
        out[name] = max(cum) if cum else 0.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="gemma3-270m")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--save", default=None, help="write the raw profile here (pstats format)")
    args = ap.parse_args()
    argv = ["generate", PROMPT, "-m", args.model, "-n", str(args.n), "--temperature", "0",
            "--device", args.device]
    start = time.perf_counter()
    out = sys.stdout = _FirstWrite(sys.stdout, start)
    prof = cProfile.Profile()
    prof.enable()
    from impnb.cli import main as cli_main

    rc = cli_main(argv)
    prof.disable()
    total = time.perf_counter() - start
    sys.stdout = out.inner
    if args.save:
        prof.dump_stats(args.save)
    stats = pstats.Stats(prof)
    first = f"{out.first:.2f}" if out.first is not None else "-"
    print(f"\n{args.model} on {args.device}: first token {first} s, total {total:.2f} s (under cProfile), "
          f"exit {rc}")
    for name, sec in step_seconds(stats).items():
        print(f"  {name:<18} {sec:7.3f} s")
    text = io.StringIO()
    stats.stream = text
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    for line in text.getvalue().splitlines():
        if line.strip() and not line.startswith(("   Ordered by", "   List reduced")):
            print(line[:160])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
