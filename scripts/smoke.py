"""Smoke gates over whole models.

    python scripts/smoke.py multi-model [--device cpu|cuda] [--models a,b,...] [--json PATH]
                                        [--max-tokens N] [--quick]

multi-model: for SmolLM2-135M and Gemma3-270M (found by impnb.model_registry) and tiny random
qwen3 / qwen3moe, Qwen3.5 hybrids (qwen35 / qwen35moe at the GPU kernels' sizes) and gemma4 (dense
and MoE) built into a temp dir with SmolLM2's tokenizer, on cuda once with CUDA graphs and
once without, greedy answers to fixed prompts:
coherence (real models: the expected word is in the answer), degeneration (impnb.degeneration;
random models only must not stop at once), teacher-forced parity of the engine's logits with the
numpy reference (cuda only: on cpu the engine is the reference) and decode tok/s. A table on
stdout, progress on stderr. Exit 0 when every model that ran passed and one at least ran, 1 when
not, 2 for a usage mistake or --device cuda without a GPU. A model not found is a SKIP.
"""

import argparse
import json
import re
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb import degeneration  # noqa: E402
from impnb.chat import render_chat  # noqa: E402
from impnb.devices import cuda_unavailable_reason, engine_class  # noqa: E402
from impnb.errors import DeviceError, ImpnbError  # noqa: E402
from impnb.generate import generate  # noqa: E402
from impnb.gguf_file import open_model_file  # noqa: E402
from impnb.model_registry import resolve_model  # noqa: E402
from impnb.models import load_reference, model_config  # noqa: E402
from impnb.sampling import SamplingParams  # noqa: E402
from impnb.tokenizer import Tokenizer  # noqa: E402

GREEDY = SamplingParams(temperature=0)
N_CTX = 1024
MAX_TOKENS = 48
QUICK_MAX_TOKENS = 16
MIN_TOP1 = 0.99    # teacher-forced top-1 agreement with the reference
MAX_REL = 5e-2     # max|dlogit| / max|logit| against the reference (tests/gpu/test_engine.py's bound)
PARITY_TOKENS = 64
PARITY_TEXT = ("The Eiffel Tower is located in the city of Paris. It was built for the 1889 World's "
               "Fair and at first many artists hated it. Today about seven million people visit it "
               "every year, and from the top you can see the Seine, the Louvre, Montmartre and the "
               "whole city spread out below. def fib(n):\n    return n if n < 2 else fib(n - 1)\n")


@dataclass(frozen=True)
class Prompt:
    text: str
    chat: bool = False
    expect: str | None = None  # a regex the answer must match (coherence)
    quick: bool = True         # part of the --quick set


@dataclass(frozen=True)
class ModelSpec:
    name: str
    prompts: tuple[Prompt, ...]
    synthetic_arch: str | None = None  # built by impnb.synthetic, else resolve_model(name)


STORY = Prompt("Once upon a time")
MODELS = {s.name: s for s in (
    ModelSpec("smollm2-135m", (Prompt("What is the capital of France?", chat=True, expect=r"\bParis\b"),
                               Prompt("What is 2 + 2?", chat=True, expect=r"\b4\b"),
                               Prompt("Write one sentence about the sea.", chat=True, quick=False))),
    ModelSpec("gemma3-270m", (Prompt("The Eiffel Tower is located in the city of", expect=r"\bParis\b"),
                              Prompt("Once upon a time, in a small village,", quick=False))),
    ModelSpec("tiny-qwen3", (STORY,), synthetic_arch="qwen3"),
    ModelSpec("tiny-qwen3moe", (STORY,), synthetic_arch="qwen3moe"),
    ModelSpec("tiny-qwen35", (STORY,), synthetic_arch="qwen35"),
    ModelSpec("tiny-qwen35moe", (STORY,), synthetic_arch="qwen35moe"),
    ModelSpec("tiny-gemma4", (STORY,), synthetic_arch="gemma4"),
    ModelSpec("tiny-gemma4moe", (STORY,), synthetic_arch="gemma4"),
)}
# the tiny gemma4 rows: impnb/synthetic_full_gemma4.TINY_SHAPES by model name
GEMMA4_TINY = {"tiny-gemma4": "dense", "tiny-gemma4moe": "moe"}


@dataclass
class Output:
    prompt: Prompt
    tokens: list[int]
    text: str
    eog_at_start: bool


@dataclass
class ModelResult:
    name: str
    device: str
    graphs: str = "-"      # cuda: "on" or "off" (CUDA graphs); cpu: "-"
    synthetic: bool = False
    status: str = "FAIL"  # PASS, FAIL or SKIP
    reasons: list[str] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    coherence: str = "-"
    degeneration: str = "-"
    top1: float | None = None
    max_rel: float | None = None
    parity_note: str = ""  # why parity was not measured
    tok_s: float | None = None
    seconds: float = 0.0


def check_model(r: ModelResult) -> ModelResult:
    """Judge r's outputs and parity: set coherence, degeneration, status (PASS/FAIL) and reasons."""
    reasons = []
    expected = [o for o in r.outputs if o.prompt.expect and not r.synthetic]
    wrong = [o for o in expected if not re.search(o.prompt.expect, o.text)]
    r.coherence = "n/a" if r.synthetic else f"{len(expected) - len(wrong)}/{len(expected)}"
    reasons += [f"coherence: {o.prompt.text!r} -> {o.text!r} does not match /{o.prompt.expect}/"
                for o in wrong]
    n_bad = 0
    for o in r.outputs:
        if r.synthetic:  # random weights babble: only an immediate stop is a fault
            found = [x for x in [degeneration.immediate_eos(o.tokens, o.eog_at_start)] if x]
        else:
            found = degeneration.degeneration_reasons(o.tokens, o.text, o.eog_at_start)
        n_bad += bool(found)
        reasons += [f"degeneration: {o.prompt.text!r} -> {o.text[:80]!r}: {x}" for x in found]
    r.degeneration = (f"{n_bad}/{len(r.outputs)} bad" if n_bad else "ok") + (" (eos only)" * r.synthetic)
    if not r.outputs:
        reasons.append("no outputs")
    if r.top1 is not None and not r.top1 >= MIN_TOP1:
        reasons.append(f"parity: top-1 agreement {r.top1:.4f} < {MIN_TOP1}")
    if r.max_rel is not None and not r.max_rel <= MAX_REL:
        reasons.append(f"parity: max|dlogit|/max|logit| {r.max_rel:.2e} > {MAX_REL:.0e}")
    r.status, r.reasons = ("FAIL" if reasons else "PASS"), reasons
    return r


def prompt_ids(p: Prompt, mf, tokenizer) -> list[int]:
    if p.chat:
        return tokenizer.encode(render_chat(mf.metadata, [{"role": "user", "content": p.text}]),
                                add_special=False)
    return tokenizer.encode(p.text)


def parity(mf, tokenizer, engine) -> tuple[float, float]:
    """Teacher-forced decode steps over PARITY_TEXT against the reference's logits:
    (top-1 agreement, max|dlogit| / max|logit|)."""
    ids = np.asarray(tokenizer.encode(PARITY_TEXT)[:PARITY_TOKENS], np.int32)
    ref_model = load_reference(mf)
    ref = ref_model.forward(ids, ref_model.new_cache(len(ids)))
    engine.reset(GREEDY)
    out = np.concatenate([engine.logits([t]) for t in ids])
    top1 = float(np.mean(out.argmax(-1) == ref.argmax(-1)))
    return top1, float(np.abs(out - ref).max() / np.abs(ref).max())


def run_model(spec: ModelSpec, path: Path, device: str, graphs: str, quick: bool, max_tokens: int) -> ModelResult:
    r = ModelResult(spec.name, device, graphs, synthetic=spec.synthetic_arch is not None)
    start = time.perf_counter()
    mf = open_model_file(path)
    try:
        cls = engine_class(device, mf.arch)
    except DeviceError as e:
        r.status, r.reasons = "SKIP", [str(e)]
        return r
    tokenizer = Tokenizer.from_metadata(mf.metadata)
    n_ctx = min(N_CTX, model_config(mf).n_ctx)
    engine = cls(mf, n_ctx) if device == "cpu" else cls(mf, n_ctx, graphs=graphs == "on")
    if device == "cpu":
        r.parity_note = "skipped: on cpu the engine is the numpy reference"
    else:
        r.top1, r.max_rel = parity(mf, tokenizer, engine)
        log(f"{spec.name} (graphs {graphs}): parity top-1 {r.top1:.4f}, max rel err {r.max_rel:.2e}")
    prompts = [p for p in spec.prompts if p.quick or not quick]
    if device != "cpu":  # first launches compile kernels and capture graphs: keep them off the clock
        generate(engine, tokenizer, prompt_ids(prompts[0], mf, tokenizer), 4, GREEDY, lambda _: None)
    steps, decode_s = 0, 0.0
    for p in prompts:
        pieces = []
        tokens, stats = generate(engine, tokenizer, prompt_ids(p, mf, tokenizer), max_tokens, GREEDY,
                                 pieces.append)
        out = Output(p, tokens, "".join(pieces), stats.stop == "eog" and not tokens)
        r.outputs.append(out)
        steps, decode_s = steps + max(stats.n_gen - 1, 0), decode_s + stats.decode_s
        log(f"{spec.name} (graphs {graphs}): {p.text!r} -> {out.text!r} ({stats.line()})")
    r.tok_s = steps / decode_s if decode_s else None
    r.seconds = time.perf_counter() - start
    return check_model(r)


class Models:
    """GGUF paths by name; tiny models are built on first use into a temp dir, with SmolLM2's tokenizer."""

    def __init__(self, directory: Path):
        self.directory = directory

    def path(self, spec: ModelSpec) -> Path:
        """The model's file; ImpnbError or ImportError (with the reason) when there is none."""
        if spec.synthetic_arch is None:
            return resolve_model(spec.name)
        try:
            smollm2 = resolve_model("smollm2-135m")
        except ImpnbError as e:
            raise ImpnbError(f"needs SmolLM2's tokenizer: {e}") from e
        from impnb import synthetic_qwen35
        from impnb.synthetic import tiny_gguf, tokenizer_metadata_from

        tokenizer = tokenizer_metadata_from(smollm2)
        if spec.name in GEMMA4_TINY:
            from dataclasses import replace

            from impnb.synthetic_full_gemma4 import TINY_SHAPES, write_full_gguf

            path = self.directory / f"{spec.name}.gguf"
            shape = replace(TINY_SHAPES[GEMMA4_TINY[spec.name]], vocab_size=len(tokenizer["tokenizer.ggml.tokens"]))
            write_full_gguf(path, shape, tokenizer_metadata=tokenizer, workers=1)
            return path
        if spec.synthetic_arch in synthetic_qwen35.ARCHS:  # F32: parity without dp4a's int8 inputs, which
            # move the tiny hybrids' logits by ~1% (tests/gpu/test_engine_qwen35.py)
            return synthetic_qwen35.tiny_gguf(spec.synthetic_arch, "F32", self.directory, gpu=True,
                                              tokenizer_metadata=tokenizer)[1]
        return tiny_gguf(spec.synthetic_arch, "Q8_0", self.directory, tokenizer_metadata=tokenizer)[1]


def multi_model(names: list[str], device: str, quick: bool, max_tokens: int) -> list[ModelResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="impnb-smoke-") as tmp:
        models = Models(Path(tmp))
        for name in names:
            spec = MODELS[name]
            try:
                path = models.path(spec)
            except (ImpnbError, ImportError) as e:
                results.append(ModelResult(name, device, "-", spec.synthetic_arch is not None, "SKIP", [str(e)]))
                log(f"{name}: SKIP: {e}")
                continue
            for graphs in (("on", "off") if device == "cuda" else ("-",)):
                try:
                    results.append(run_model(spec, path, device, graphs, quick, max_tokens))
                except Exception as e:  # a gate reports a crash as that model's failure and goes on
                    traceback.print_exc()
                    results.append(ModelResult(name, device, graphs, spec.synthetic_arch is not None, "FAIL",
                                               [f"error: {type(e).__name__}: {e}"]))
    return results


def exit_code(results: list[ModelResult]) -> int:
    ran = [r for r in results if r.status != "SKIP"]
    return 0 if ran and all(r.status == "PASS" for r in ran) else 1


def table(results: list[ModelResult]) -> str:
    head = ("model", "device", "graphs", "coherence", "degeneration", "top-1", "max rel err", "tok/s", "result")

    def cells(r):
        parity = (f"{r.top1:.4f}", f"{r.max_rel:.2e}") if r.top1 is not None else ("skip", "skip")
        tok_s = f"{r.tok_s:.1f}" if r.tok_s is not None else "-"
        return (r.name, r.device, r.graphs, r.coherence, r.degeneration, *parity, tok_s, r.status)

    rows = [head, *map(cells, results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = sorted({r.parity_note for r in results if r.parity_note})
    lines += [f"parity {note}" for note in notes]
    lines += [f"{r.name}{'' if r.graphs == '-' else f'[graphs {r.graphs}]'}: {r.status}: {reason}"
              for r in results if r.status != "PASS" for reason in r.reasons]
    return "\n".join(lines)


def log(message: str) -> None:
    print(f"smoke: {message}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="gate", required=True)
    p = sub.add_parser("multi-model", help="coherence, degeneration, parity and speed on every model")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if usable, else cpu")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--json", metavar="PATH", help="write the results here")
    p.add_argument("--max-tokens", type=int, default=None,
                   help=f"tokens per answer (default {MAX_TOKENS}, {QUICK_MAX_TOKENS} with --quick)")
    p.add_argument("--quick", action="store_true", help="the short prompt set and few tokens")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        parser.error(f"--models: unknown {unknown or 'empty list'}; known: {', '.join(MODELS)}")
    max_tokens = args.max_tokens
    if max_tokens is None:
        max_tokens = QUICK_MAX_TOKENS if args.quick else MAX_TOKENS
    if max_tokens <= 0:
        parser.error(f"--max-tokens must be > 0, got {max_tokens}")
    reason = cuda_unavailable_reason() if args.device != "cpu" else "not asked for"
    if args.device == "cuda" and reason:
        print(f"smoke: error: --device cuda: {reason}", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if reason is None else "cpu")

    start = time.perf_counter()
    results = multi_model(names, device, args.quick, max_tokens)
    seconds = time.perf_counter() - start
    code = exit_code(results)
    print(table(results))
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    print(f"{'PASS' if code == 0 else 'FAIL'}: " + ", ".join(f"{n} {s}" for s, n in counts.items())
          + f" in {seconds:.1f} s" + ("" if any(r.status != "SKIP" for r in results) else " (no model ran)"))
    if args.json:
        Path(args.json).write_text(json.dumps({"gate": "multi-model", "device": device, "quick": args.quick,
                                               "max_tokens": max_tokens, "seconds": seconds, "exit": code,
                                               "models": [asdict(r) for r in results]}, indent=2) + "\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
