"""A start's timeline in wall-clock seconds since the process began: `impnb ARGS...` run in this
process with each start-up step wrapped (no profiler), printed as a table of when each step first
began and ended, how often it ran and its total seconds, plus the imports, the cubin module loads
and the graph captures counted.

    python scripts/startup_timeline.py [--json out.json] [--profile 30] \
        -- generate "prompt" -m gemma3-270m -n 32

--profile N also runs it under cProfile and prints the N functions that took the most (cumulative
and own time); the timeline's seconds then include the profiler's overhead. Run it once first to
fill the kernel and tokenizer caches for a warm start. Steps are wrapped as their modules are
first imported, so the imports keep their order. The "first token" mark is the first non-blank
text on stdout (generate flushes each token).
"""

import argparse
import importlib._bootstrap as bootstrap
import io
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # this checkout's impnb


def _process_start() -> float:
    """time.time() at which this process began (from /proc; 10 ms resolution), else now."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


T0 = _process_start()

# module -> [(step name, attribute path)]: a function or method whose calls are a step
STEPS = {
    "impnb.cuda_support": [("CUDA driver + context (thread)", "_retain_primary_context")],
    "impnb.gguf_file": [("GGUF open", "open_model_file")],
    "impnb.models.validate": [("validate", "validate_model")],
    "impnb.tokenizer": [("tokenizer", "Tokenizer.from_metadata")],
    "impnb.serve.runners": [("make_runner", "make_runner")],
    "impnb.warmup": [("warm-up check (manifest)", "prepare"), ("  dry run", "dry_run")],
    "impnb.launch.precompile": [("  compile missing kernels", "compile_all")],
    "impnb.engine_cuda": [("CUDA engine init", "CudaEngine.__init__"), ("prefill", "CudaEngine.prefill"),
                          ("graph capture", "CudaEngine._capture_graph"), ("decode step", "CudaEngine.step")],
    "impnb.gpu.context": [("  GpuContext", "GpuContext.__init__")],
    "impnb.gpu.model": [("  DeviceModel", "DeviceModel.__init__")],
    "impnb.gpu.weights": [("    weight upload + repack", "upload"), ("    router folds", "router_folds")],
    "impnb.gpu.kv": [("    KV alloc", "PagedKV.__init__")],
    "impnb.gpu.cublas_gemm": [("cuBLAS handle (first GEMM)", "Cublas.ready")],
    "impnb.launch.launcher": [("module load (Plan)", "Plan.__init__")],
    "impnb.launch.cache": [("  get_cubin", "get_cubin")],
    "impnb.graphs.capture": [("  Graph (cuStreamBeginCapture..Instantiate)", "Graph.__init__")],
    "impnb.serve.engine": [("LLMEngine init", "LLMEngine.__init__"), ("LLMEngine.step", "LLMEngine.step")],
}
WATCHED_IMPORTS = ("numpy", "gguf", "numba", "numba.cuda", "cuda.bindings.driver", "jinja2", "torch",
                   "impnb.commands.generate", "impnb.engine_cuda", "impnb.kernels", "impnb.serve.engine")

records: dict[str, dict] = {}
imports = dict(top_level_s=0.0, count=0, depth=0, watched={})
marks: dict[str, float] = {}
_lock = threading.Lock()


def _now() -> float:
    return time.time() - T0


def _note(name: str, start: float, end: float) -> None:
    with _lock:
        r = records.setdefault(name, dict(first_start=start, first_end=end, calls=0, total_s=0.0))
        r["calls"] += 1
        r["total_s"] += end - start


def _wrap(name: str, fn):
    def wrapped(*args, **kwargs):
        start = _now()
        try:
            return fn(*args, **kwargs)
        finally:
            _note(name, start, _now())

    wrapped.__wrapped__ = fn
    return wrapped


def _patch(module) -> None:
    for name, path in STEPS.get(module.__name__, ()):
        owner, attr = module, path
        if "." in path:
            cls_name, attr = path.split(".")
            owner = getattr(module, cls_name, None)
        raw = owner.__dict__.get(attr) if owner is not None else None
        if raw is None:
            print(f"startup_timeline: {module.__name__}.{path} not found", file=sys.stderr)
            continue
        if isinstance(raw, classmethod):
            setattr(owner, attr, classmethod(_wrap(name, raw.__func__)))
        elif isinstance(raw, staticmethod):
            setattr(owner, attr, staticmethod(_wrap(name, raw.__func__)))
        else:
            setattr(owner, attr, _wrap(name, raw))


_find_and_load = bootstrap._find_and_load


def _timed_find_and_load(name, import_):
    """importlib's loader, timed: top-level import seconds, watched modules' load times, and
    the steps' modules patched as soon as they are loaded."""
    depth = imports["depth"]
    imports["depth"] = depth + 1
    start = time.perf_counter()
    try:
        module = _find_and_load(name, import_)
    finally:
        imports["depth"] = depth
    elapsed = time.perf_counter() - start
    imports["count"] += 1
    if depth == 0 and threading.current_thread() is threading.main_thread():
        imports["top_level_s"] += elapsed
    if name in WATCHED_IMPORTS:
        imports["watched"][name] = dict(at=_now() - elapsed, seconds=elapsed)
    if name in STEPS:
        _patch(module)
    return module


class _FirstWrite(io.TextIOBase):
    """stdout that marks the first non-blank text."""

    def __init__(self, inner):
        self.inner = inner

    def write(self, s: str) -> int:
        if "first token" not in marks and s.strip():
            marks["first token"] = _now()
        return self.inner.write(s)

    def flush(self) -> None:
        self.inner.flush()


def table() -> str:
    lines = [f"{'step':<46} {'start':>7} {'end':>7} {'calls':>6} {'total s':>8}"]
    rows = sorted(records.items(), key=lambda kv: kv[1]["first_start"])
    for name, r in rows:
        lines.append(f"{name:<46} {r['first_start']:7.3f} {r['first_end']:7.3f} {r['calls']:6d} {r['total_s']:8.3f}")
    lines.append(f"{'imports (top level, main thread)':<46} {'':>7} {'':>7} {imports['count']:6d} "
                 f"{imports['top_level_s']:8.3f}")
    for name, w in sorted(imports["watched"].items(), key=lambda kv: kv[1]["at"]):
        end = w["at"] + w["seconds"]
        lines.append(f"{'  import ' + name:<46} {w['at']:7.3f} {end:7.3f} {'':>6} {w['seconds']:8.3f}")
    for name, t in sorted(marks.items(), key=lambda kv: kv[1]):
        lines.append(f"{'** ' + name:<46} {t:7.3f}")
    return "\n".join(lines)


def _print_profile(prof, top: int) -> None:
    import pstats

    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    for line in text.getvalue().splitlines():
        if line.strip() and not line.startswith(("   Ordered by", "   List reduced")):
            print(line[:160], file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="also profile; print the top N functions")
    ap.add_argument("argv", nargs=argparse.REMAINDER, help="impnb's arguments (after --)")
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    marks["script start"] = _now()
    bootstrap._find_and_load = _timed_find_and_load
    out = sys.stdout = _FirstWrite(sys.stdout)
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    try:
        from impnb.cli import main as cli_main

        rc = cli_main(argv)
    finally:
        if prof is not None:
            prof.disable()
        sys.stdout = out.inner
        bootstrap._find_and_load = _find_and_load
    marks["exit"] = _now()
    cache = sys.modules.get("impnb.launch.cache")
    cubins = dict(getattr(cache, "stats", {})) if cache else {}
    print(f"\ntimeline of impnb {' '.join(argv)[:80]}: exit {rc}; seconds since process start; "
          f"cubins by source {cubins}", file=sys.stderr)
    print(table(), file=sys.stderr)
    if prof is not None:
        _print_profile(prof, args.profile)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(argv=argv, rc=rc, steps=records, imports=imports, marks=marks, cubins=cubins), f, indent=1)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
