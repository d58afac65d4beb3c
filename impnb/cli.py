"""Command line: `python -m impnb generate | info | bench`."""

import argparse
import sys

from impnb.errors import ImpnbError

DEFAULT_CTX = 4096


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one line and exit status 2."""

    def error(self, message):
        self.exit(2, f"impnb: error: {message} (see --help)\n")


def _add_generate(sub):
    p = sub.add_parser("generate", help="generate text from a prompt")
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin when omitted)")
    p.add_argument("--model", "-m", default=None, help="a .gguf path or a model name (default gemma3-270m)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message for --chat")
    p.add_argument("--max-tokens", "-n", type=int, default=128)
    p.add_argument("--temperature", "-t", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40, help="0 = off")
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context length (capped at the model's)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--no-graphs", action="store_true", help="decode eagerly, without CUDA graphs")


def _add_info(sub):
    p = sub.add_parser("info", help="describe a GGUF model")
    p.add_argument("model", nargs="?", default=None, help="a .gguf path or a model name")


def _add_bench(sub):
    p = sub.add_parser("bench", help="prompt and generation throughput (llama-bench style)")
    p.add_argument("--model", "-m", default=None, help="a .gguf path or a model name")
    p.add_argument("-p", default="512", help="prompt lengths, comma-separated")
    p.add_argument("-n", default="128", help="generation lengths, comma-separated")
    p.add_argument("-r", type=int, default=5, help="repetitions (median reported)")
    p.add_argument("-d", default="0", help="context depths the tests start from, comma-separated "
                   "(tg at depth d: d prompt tokens first, then n generated; llama-bench's -d)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m impnb", description="GGUF language models on numba.cuda kernels")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_generate(sub)
    _add_info(sub)
    _add_bench(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            from impnb.commands.generate import run
        elif args.command == "bench":
            from impnb.commands.bench import run
        else:
            from impnb.commands.info import run
        return run(args)
    except ImpnbError as e:
        print(f"impnb: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nimpnb: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
