"""Load-test an OpenAI-compatible server: `python scripts/bench_serve.py --url URL [...]`, the same
as `python -m impnb bench-serve` (see its --help)."""

import sys

from impnb.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench-serve", *sys.argv[1:]]))
