"""The large GGUF fuzz run of issue 38: thousands of mutants, each command in its own process.

    python scripts/fuzz_gguf.py --cases 5000 --out fuzz-cpu.md          # CPU (forked children)
    python scripts/fuzz_gguf.py --device cuda --cases 300 --out fuzz-gpu.md

Mutants come from the tiny seeds of every architecture (impnb/fuzz/seeds.py) and, where
installed, the real gemma3-270m and smollm2-135m. Each case runs `impnb info` and `impnb
generate --max-tokens 1` (with --chat for template mutants); on the CPU a child forked from this
process (imports done once), on CUDA a fresh `python -m impnb` per command. The table counts
outcomes by mutation kind; any `other` outcome (traceback, crash, hang) or an outcome the case
does not allow is listed. With --device cuda the run ends by running a good model on the GPU in
a fresh process and recording whether it still works.
"""

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from impnb.errors import ImpnbError  # noqa: E402
from impnb.fuzz.catalogue import draw  # noqa: E402
from impnb.fuzz.mutate import parse  # noqa: E402
from impnb.fuzz.run import argv_for, run_forked, run_in_subprocess  # noqa: E402
from impnb.cuda_support import GPU_ARCHS  # noqa: E402
from impnb.fuzz.seeds import write_seeds  # noqa: E402
from impnb.model_registry import resolve_model  # noqa: E402
# what a command imports, imported once here: forked children then share it and read no code
# from disk, so the tree can change under a long run
import impnb.commands.generate, impnb.commands.info, impnb.engine_cpu  # noqa: E401, E402, F401

# share of the cases each source takes (real models where installed)
SHARES = {"tiny": 0.93, "smollm2-135m": 0.05, "gemma3-270m": 0.02}


def sources(tmp: Path, device: str = "cpu") -> dict[str, list[Path]]:
    """Seed files by source; on the GPU only the architectures it runs (the others' mutants would
    all end in its one-line refusal)."""
    seeds = write_seeds(tmp / "seeds")
    out = {"tiny": [p for arch, p in seeds.items() if device == "cpu" or arch in GPU_ARCHS]}
    for name in ("smollm2-135m", "gemma3-270m"):
        try:
            out[name] = [Path(resolve_model(name))]
        except ImpnbError as e:
            print(f"fuzz: {name} skipped ({e})", file=sys.stderr)
    return out


def plan(srcs: dict, n: int, rng) -> list[tuple[str, Path, object]]:
    """(source name, seed path, Case) for n cases."""
    cases = []
    shares = {k: v for k, v in SHARES.items() if k in srcs}
    total = sum(shares.values())
    for name, share in shares.items():
        k = round(n * share / total) if name != "tiny" else 0
        if name == "tiny":
            k = n - sum(round(n * s / total) for nm, s in shares.items() if nm != "tiny")
        paths = srcs[name]
        for i, path in enumerate(paths):
            m = parse(path)
            count = k // len(paths) + (i < k % len(paths))
            label = f"tiny {path.stem.removeprefix('seed-')}" if name == "tiny" else name
            cases += [(label, path, c) for c in draw(m, rng, count)]
    return cases


def gpu_still_works(timeout_s: int) -> str:
    """A good tiny model generated on the GPU by a fresh process after the run."""
    with tempfile.TemporaryDirectory() as d:
        path = write_seeds(d)["qwen3"]
        o = run_in_subprocess(argv_for("generate", path, device="cuda"), timeout_s)
    return "yes" if o.outcome == "exit0" else f"NO ({o.outcome} {o.status}: {o.stderr.strip()[-300:]})"


def table(counts, kinds) -> str:
    cols = ("exit0", "exit2", "other")
    lines = ["| mutation kind | cases | runs | exit 0 | exit 2, one line | other | not allowed |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for kind in sorted(kinds):
        c = counts[kind]
        lines.append(f"| {kind} | {kinds[kind]} | {sum(c[x] for x in cols)} | "
                     + " | ".join(str(c[x]) for x in cols) + f" | {c['bad']} |")
    tot = collections.Counter()
    for c in counts.values():
        tot.update(c)
    lines.append(f"| **all** | {sum(kinds.values())} | {sum(tot[x] for x in cols)} | "
                 + " | ".join(str(tot[x]) for x in cols) + f" | {tot['bad']} |")
    return "\n".join(lines)


def run_parallel(cases, tmp: Path, args, counts, kinds, findings, t0) -> int:
    """--device cuda with --workers > 1: each case's generate in its own process, `workers` at
    once on the one GPU; cases not started by --max-seconds are skipped. Returns how many ran."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i):
        if args.max_seconds and time.time() - t0 > args.max_seconds:
            return None
        source, _, case = cases[i]
        path = case.mutant.write(tmp / f"mutant{i}.gguf")
        o = run_in_subprocess(argv_for("generate", path, args.device, case.chat), args.timeout)
        bad = not o.allowed(case.generate)
        if bad and args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            os.replace(path, Path(args.keep) / f"case{i}-{case.kind}.gguf")
        else:
            path.unlink(missing_ok=True)
        return source, case, o, bad

    ran = 0
    with ThreadPoolExecutor(args.workers) as pool:
        for r in pool.map(one, range(len(cases))):
            if r is None:
                continue
            source, case, o, bad = r
            ran += 1
            kinds[case.kind] += 1
            counts[case.kind][o.outcome] += 1
            if bad:
                counts[case.kind]["bad"] += 1
                findings.append(f"{source} | {case.kind}: {case.detail} | generate | expected "
                                f"{case.generate}, got {o.outcome} ({o.status}): {o.stderr.strip()[-400:]!r}")
    return ran


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--timeout", type=int, default=120, help="seconds a command may run")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    ap.add_argument("--keep", default=None, help="copy mutants whose outcome is not allowed here")
    ap.add_argument("--workers", type=int, default=1,
                    help="cases run at once (--device cuda: processes sharing the GPU)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no case after this many seconds; the table says how many ran")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    counts = collections.defaultdict(collections.Counter)
    kinds = collections.Counter()
    findings = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="impnb-fuzz-") as tmp:
        tmp = Path(tmp)
        cases = plan(sources(tmp, args.device), args.cases, rng)
        cases = [cases[i] for i in rng.permutation(len(cases))]  # a partial run samples every source
        # info reads no weights and is the same on either device: the GPU subset runs generate only
        commands = ("info", "generate") if args.device == "cpu" else ("generate",)
        if args.device == "cuda":
            print(f"fuzz: warm-up (fills the kernel cache): GPU works: {gpu_still_works(600)}",
                  file=sys.stderr, flush=True)
        t0 = time.time()
        ran = 0
        if args.device == "cuda" and args.workers > 1:
            ran = run_parallel(cases, tmp, args, counts, kinds, findings, t0)
            cases_left = []
        else:
            cases_left = cases
        for i, (source, _, case) in enumerate(cases_left):
            if args.max_seconds and time.time() - t0 > args.max_seconds:
                break
            ran = i + 1
            path = case.mutant.write(tmp / "mutant.gguf")
            kinds[case.kind] += 1
            for command in commands:
                argv = argv_for(command, path, args.device, case.chat)
                o = (run_forked(argv, args.timeout) if args.device == "cpu"
                     else run_in_subprocess(argv, args.timeout))
                counts[case.kind][o.outcome] += 1
                if not o.allowed(getattr(case, command)):
                    counts[case.kind]["bad"] += 1
                    findings.append(f"{source} | {case.kind}: {case.detail} | {command} | expected "
                                    f"{getattr(case, command)}, got {o.outcome} ({o.status}): "
                                    f"{o.stderr.strip()[-400:]!r}")
                    if args.keep:
                        Path(args.keep).mkdir(parents=True, exist_ok=True)
                        os.replace(path, Path(args.keep) / f"case{i}-{case.kind}.gguf")
                        path = case.mutant.write(tmp / "mutant.gguf")
            if (i + 1) % 100 == 0:
                print(f"fuzz: {i + 1}/{len(cases)} cases, {len(findings)} findings, "
                      f"{time.time() - t0:.0f} s", file=sys.stderr, flush=True)
                if args.out:  # the table so far, should the run be stopped
                    Path(args.out).write_text(f"partial: {i + 1} of {len(cases)} mutants, "
                                              f"{len(findings)} findings\n\n{table(counts, kinds)}\n")
    report = [f"{ran} of {len(cases)} mutants, {args.device}, seed {args.seed}, {time.time() - t0:.0f} s, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
              table(counts, kinds)]
    if args.device == "cuda":
        report += ["", f"a fresh process generates on the GPU after the run: {gpu_still_works(args.timeout)}"]
    if findings:
        report += ["", "findings:"] + [f"- {f}" for f in findings]
    text = "\n".join(report)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
