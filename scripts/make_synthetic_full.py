"""Write a full-size random Qwen3-8B, Qwen3-30B-A3B, Qwen3.6-35B-A3B or Gemma-4-26B-A4B GGUF
(llama.cpp's layout) for speed work."""

import argparse
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb import synthetic, synthetic_full, synthetic_full_gemma4  # noqa: E402

# model name -> (shape, the module that writes it)
MODELS = {**{k: (v, synthetic_full) for k, v in synthetic_full.SHAPES.items()},
          **{k: (v, synthetic_full_gemma4) for k, v in synthetic_full_gemma4.SHAPES.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=list(MODELS), required=True)
    parser.add_argument("--quant", choices=list(synthetic_full.FILE_TYPES), required=True)
    parser.add_argument("--out", required=True, help="GGUF path to write")
    parser.add_argument("--tokenizer-from", metavar="GGUF",
                        help="copy this GGUF's tokenizer.* keys (padded with [PAD] tokens to the "
                             "model's vocab); default: a minimal gpt2 vocabulary, padded")
    parser.add_argument("--layers", type=int, help="fewer layers than the real model (quick runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="threads drawing tensors ahead")
    args = parser.parse_args(argv)

    shape, writer = MODELS[args.model]
    if writer is synthetic_full_gemma4 and args.quant not in synthetic_full_gemma4.QTYPES:
        parser.error(f"--quant: {args.model} is written as {', '.join(synthetic_full_gemma4.QTYPES)}")
    if args.layers:
        shape = replace(shape, num_hidden_layers=args.layers)
        if writer is synthetic_full_gemma4:
            shape = replace(shape, layer_types=shape.layer_types[:args.layers])
    start = time.perf_counter()
    tokenizer = synthetic.tokenizer_metadata_from(args.tokenizer_from) if args.tokenizer_from else None
    specs = writer.write_full_gguf(args.out, shape, args.quant, tokenizer, args.seed,
                                   f"impnb synthetic {args.model} {args.quant}", args.workers)
    seconds = time.perf_counter() - start
    size = os.path.getsize(args.out)
    n_params = sum(math.prod(s.shape) for s in specs)
    print(f"wrote {args.out}: {args.model} {args.quant}, {shape.num_hidden_layers} layers, "
          f"{n_params / 1e9:.2f} B parameters, {size / 1e9:.2f} GB in {seconds:.1f} s "
          f"({size / 1e9 / seconds:.2f} GB/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
