"""Write a tiny random qwen3 / qwen3moe GGUF (llama.cpp's layout) for parity tests."""

import argparse
import time

from impnb import synthetic


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", choices=synthetic.ARCHS, required=True)
    parser.add_argument("--quant", choices=list(synthetic.QTYPES), default="F32")
    parser.add_argument("--out", required=True, help="GGUF path to write")
    parser.add_argument("--tokenizer-from", metavar="GGUF",
                        help="copy this GGUF's tokenizer.* keys (vocab_size follows); "
                             f"default: a minimal gpt2 vocabulary of {synthetic.MINIMAL_VOCAB} tokens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    tokenizer = synthetic.tokenizer_metadata_from(args.tokenizer_from) if args.tokenizer_from else None
    model = synthetic.make_tiny_gguf(args.arch, args.quant, args.out, tokenizer, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {args.arch} {args.quant}, {n_params:,} parameters, "
          f"vocab {model.config.vocab_size}, seed {args.seed} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
