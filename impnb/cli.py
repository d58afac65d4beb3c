"""Command line: `impnb generate | info | bench | warmup | serve | bench-serve` (or `python -m impnb ...`)."""

import argparse
import os
import sys

from impnb import __version__
from impnb.errors import ImpnbError, ParameterError

DEFAULT_CTX = 4096


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one line and exit status 2."""

    def error(self, message):
        self.exit(2, f"impnb: error: {message} (see --help)\n")


class _Help(argparse.HelpFormatter):
    """Help that shows each option's default, unless it has none (None, False) or says it already."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default is argparse.SUPPRESS or "default" in text
                or action.option_strings == [] and action.nargs in ("?", "*")):
            return text
        return f"{text} (default {default})".lstrip()


def _add_generate(sub):
    p = sub.add_parser("generate", help="generate text from a prompt", formatter_class=_Help)
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin when omitted)")
    p.add_argument("--model", "-m", default=None, help="a .gguf path or a model name (default gemma3-270m)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message for --chat")
    p.add_argument("--max-tokens", "-n", type=int, default=128, help="tokens to generate at most")
    p.add_argument("--temperature", "-t", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40, help="0 = off")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass")
    p.add_argument("--min-p", type=float, default=0.05, help="drop tokens below min-p times the top one")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="1 = off")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtracted from the logits of the last 64 tokens, in [-2, 2] (0 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtracted as many times as a token occurs in the last 64, in [-2, 2] (0 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context length (capped at the model's)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: the GPU when one is usable, else the CPU reference")
    p.add_argument("--no-graphs", action="store_true", help="decode eagerly, without CUDA graphs")
    _add_tp(p)


def _add_tp(p):
    p.add_argument("--tp", type=int, default=1,
                   help="tensor parallelism over this many GPUs: one process a GPU, the others started "
                        "here (or by a launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)")


def _add_info(sub):
    p = sub.add_parser("info", help="describe a GGUF model", formatter_class=_Help)
    p.add_argument("model", nargs="?", default=None, help="a .gguf path or a model name (default gemma3-270m)")


def _add_bench(sub):
    p = sub.add_parser("bench", help="prompt and generation throughput (llama-bench style)",
                       formatter_class=_Help)
    p.add_argument("--model", "-m", default=None, help="a .gguf path or a model name (default gemma3-270m)")
    p.add_argument("-p", default="512", help="prompt lengths, comma-separated")
    p.add_argument("-n", default="128", help="generation lengths, comma-separated")
    p.add_argument("-r", type=int, default=5, help="repetitions (median reported)")
    p.add_argument("-d", default="0", help="context depths the tests start from, comma-separated "
                   "(tg at depth d: d prompt tokens first, then n generated; llama-bench's -d)")
    p.add_argument("--batch", default=None, help="batch sizes, comma-separated: llama-batched-bench's "
                   "table instead (B sequences of -p prompt tokens prefilled, then -n tokens decoded "
                   "by all B at once; the first -p and -n values)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON at the end")
    p.add_argument("--no-graphs", action="store_true", help="run eagerly, without CUDA graphs")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: the GPU when one is usable, else the CPU reference")
    _add_tp(p)


def _add_warmup(sub):
    p = sub.add_parser("warmup", help="build the model's GPU kernels into the disk cache ahead of its first start",
                       formatter_class=_Help)
    p.add_argument("--model", "-m", default=None, help="a .gguf path or a model name (default gemma3-270m)")
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context length (capped at the model's)")
    p.add_argument("--jobs", "-j", type=int, default=None, help="compile processes (default: one a core)")
    p.add_argument("--max-seqs", type=int, default=None,
                   help="also build the batched decode steps of up to this many sequences, as `serve --max-seqs` "
                        "runs them (default 64; 1: one sequence only)")


def _add_serve(sub):
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server on the batched engine",
                       formatter_class=_Help)
    p.add_argument("--model", "-m", default=None, help="a .gguf path or a model name (default gemma3-270m)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: the GPU when one is usable, else the CPU reference")
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context length of a request (capped at the model's)")
    p.add_argument("--max-seqs", type=int, default=None, help="sequences a step runs at most (default 64)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens a step runs at most, decode rows first, then prompt chunks (default 256)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory the weights and the KV pool may take")
    p.add_argument("--kv-cache-tokens", type=int, default=None,
                   help="the KV pool's size in tokens (default: from --gpu-memory-utilization; two contexts on the CPU)")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="requests that may queue beyond --max-seqs; more are answered 503 (default: all queue)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: --model)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds running requests get to finish after SIGTERM before they are aborted")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                   help="uvicorn's log level (debug adds the access log)")
    p.add_argument("--no-graphs", action="store_true", help="run eagerly, without CUDA graphs")
    _add_tp(p)


def _add_bench_serve(sub):
    p = sub.add_parser("bench-serve", help="load-test an OpenAI-compatible server at several concurrencies",
                       formatter_class=_Help)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    p.add_argument("--model", "-m", default=None, help="the model name to send (default: the server's first)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions")
    p.add_argument("--concurrency", default="1,8,32,64,128", help="concurrent clients, comma-separated")
    p.add_argument("--requests", type=int, default=None,
                   help="requests per concurrency (default --rounds x concurrency, at least 16)")
    p.add_argument("--rounds", type=int, default=4, help="requests per client when --requests is not given")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (random token ids)")
    p.add_argument("--output-len", type=int, default=128, help="tokens to generate (ignore_eos)")
    p.add_argument("--random-range", type=float, default=0.0,
                   help="lengths drawn uniformly in [len x (1 - r), len x (1 + r)] (0: fixed lengths)")
    p.add_argument("--seed", type=int, default=0, help="prompt and length seed")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--json", action="store_true", help="print the rows as JSON at the end")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="impnb", description="GGUF language models on numba.cuda kernels")
    parser.add_argument("--version", action="version", version=f"impnb {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_generate(sub)
    _add_info(sub)
    _add_bench(sub)
    _add_warmup(sub)
    _add_serve(sub)
    _add_bench_serve(sub)
    return parser


def _tp_rank(args, argv: list):
    """This process's tensor-parallel rank for --tp (starting the other ranks as
    `python -m impnb ARGV` where this one is rank 0), or None; a rank other than 0 writes
    nothing on stdout."""
    tp = getattr(args, "tp", None)
    if tp is None:
        return None
    if getattr(args, "device", "cuda") == "cpu" and tp > 1:  # before any rank starts
        raise ParameterError(f"--tp {tp} needs the GPU (device cpu)")
    from impnb.parallel.ranks import start

    rank = start(tp, [sys.executable, "-m", "impnb", *argv])
    if rank is not None and not rank.leader:
        sys.stdout = open(os.devnull, "w")
    return rank


QUICK_EXIT = ("generate", "info")  # commands that leave nothing behind once their output is out


def entry() -> None:
    """`python -m impnb` and the `impnb` console script: main(), then exit. After generate or info
    (not a tensor-parallel rank) the process ends at once, its output flushed: Python's teardown
    would unload every module and destroy the CUDA context allocation by allocation, which the
    OS does for a fraction of the time."""
    argv = sys.argv[1:]
    args = build_parser().parse_args(argv)
    code = _main(args, argv)
    if args.command in QUICK_EXIT and getattr(args, "rank", None) is None:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:  # a closed pipe: what was written is all the reader takes
            pass
        os._exit(code)
    raise SystemExit(code)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    return _main(build_parser().parse_args(argv), argv)


def _main(args, argv: list) -> int:
    if args.command in ("generate", "bench", "serve", "warmup") and getattr(args, "device", "cuda") != "cpu":
        from impnb.cuda_support import open_driver_early

        # the driver's start overlaps the imports, the GGUF parse and the tokenizer; a
        # tensor-parallel rank's own GPU (LOCAL_RANK), not GPU 0
        local = os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))
        open_driver_early(int(local) if local.isdigit() else 0)
    code = _run(args, argv)
    if getattr(args, "rank", None) is not None:  # a tensor-parallel rank: rank 0 waits for the others
        from impnb.parallel.ranks import exit_rank

        exit_rank(code)
    return code


def _run(args, argv: list) -> int:
    try:
        args.rank = _tp_rank(args, argv)
        if args.command == "generate":
            from impnb.commands.generate import run
        elif args.command == "bench":
            from impnb.commands.bench import run
        elif args.command == "warmup":
            from impnb.commands.warmup import run
        elif args.command == "serve":
            from impnb.commands.serve import run
        elif args.command == "bench-serve":
            from impnb.commands.bench_serve import run
        else:
            from impnb.commands.info import run
        return run(args)
    except ImpnbError as e:
        print(f"impnb: error: {e}", file=sys.stderr)
        if getattr(args, "tp", 1) > 1:
            from impnb.parallel.ranks import abort_workers

            abort_workers()  # the ranks it started would wait for it in a collective
        return 2
    except KeyboardInterrupt:
        print("\nimpnb: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
