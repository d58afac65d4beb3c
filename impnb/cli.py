"""Command line: `impnb generate | info | bench | warmup` (or `python -m impnb ...`)."""

import argparse
import sys

from impnb import __version__
from impnb.errors import ImpnbError

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
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context length (capped at the model's)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: the GPU when one is usable, else the CPU reference")
    p.add_argument("--no-graphs", action="store_true", help="decode eagerly, without CUDA graphs")


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


def _add_warmup(sub):
    p = sub.add_parser("warmup", help="build the model's GPU kernels into the disk cache ahead of its first start",
                       formatter_class=_Help)
    p.add_argument("--model", "-m", default=None, help="a .gguf path or a model name (default gemma3-270m)")
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context length (capped at the model's)")
    p.add_argument("--jobs", "-j", type=int, default=None, help="compile processes (default: one a core)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="impnb", description="GGUF language models on numba.cuda kernels")
    parser.add_argument("--version", action="version", version=f"impnb {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_generate(sub)
    _add_info(sub)
    _add_bench(sub)
    _add_warmup(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            from impnb.commands.generate import run
        elif args.command == "bench":
            from impnb.commands.bench import run
        elif args.command == "warmup":
            from impnb.commands.warmup import run
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
