"""What int8 x costs the reference model: teacher-forced top-1 agreement and logit error of the numpy
reference with the GEMV inputs rounded as gemv_dp4a multiplies them (quant_x's int8 groups of 16
columns), against float x; with --group N, in int8 groups of N columns (32:
the int8 GEMM's quantize_x32; 256: one scale a K-quant superblock, as llama.cpp's CPU Q8_K); with
--fp16, rounded to fp16 instead (what a tensor-core GEMV on fp16 x would multiply). CPU only; no
GPU kernel runs.

Sets of GEMVs rounded:
  qkv  Q, K and V's input (the normed x)
  all  every GEMV but the router and the logits, the experts' gate|up and down included
       (llama.cpp's mmvq way)
Tiny random qwen3moe / qwen3 (the GPU tests' seed 3, and 11) on 128 random ids; each GGUF given
on the command line on a paragraph of English.
    python scripts/int8_sensitivity.py [--fp16 | --group N] [GGUF ...]
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb.gguf_file import open_model_file  # noqa: E402
from impnb.errors import ImpnbError  # noqa: E402
from impnb.kernels.gemv.quant_x import GROUP, dequantize_x_ref, quantize_groups_ref  # noqa: E402
from impnb.models import load_reference  # noqa: E402
from impnb.synthetic import tiny_gguf  # noqa: E402
from impnb.tokenizer import Tokenizer  # noqa: E402

TEXT = ("The Eiffel Tower is located in the city of Paris, France. It was built for the 1889 World's Fair and "
        "was at first criticized by some of France's leading artists and intellectuals for its design, but it "
        "has become a global cultural icon of France and one of the most recognizable structures in the world. "
        "The tower is 330 metres tall, about the same height as an 81-storey building.")
QKV = ("attn_q", "attn_k", "attn_v")
FLOAT = ("ffn_gate_inp", "output", "token_embd")  # "all" leaves these float


def fp16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def int8(x: np.ndarray, group: int = GROUP) -> np.ndarray:
    """x (..., K) as an int8 kernel multiplies it, one scale a `group` columns (gemv_dp4a's 16 by
    default); K not a multiple of the group: float."""
    if x.shape[-1] % group:
        return x
    rows = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    q, d, _ = quantize_groups_ref(rows, group)
    return dequantize_x_ref(q, d, group).astype(np.float32).reshape(x.shape)


def logits(ref, ids: np.ndarray, mode: str, rounding=int8) -> np.ndarray:
    """Teacher-forced logits (T, vocab) with mode's GEMV inputs rounded ("none": float)."""
    ops = ref.ops
    plain = type(ops).linear

    def linear(self, x, name):
        short = name.rsplit(".", 1)[-1]
        rounded = (mode == "qkv" and short in QKV) or (mode == "all" and short not in FLOAT)
        return plain(self, rounding(x) if rounded else x, name)

    def expert(self, w, x):  # the routed experts' gate|up and down
        return type(ops).expert(self, w, rounding(x[None])[0])

    ops.linear = linear.__get__(ops)
    if mode == "all":
        ops.expert = expert.__get__(ops)
    try:
        return ref.forward(ids, ref.new_cache(len(ids) + 8))
    finally:
        ops.__dict__.pop("linear", None)
        ops.__dict__.pop("expert", None)


def report(label: str, ref, ids: np.ndarray, rounding) -> None:
    base = logits(ref, ids, "none")
    for mode in ("qkv", "all"):
        out = logits(ref, ids, mode, rounding)
        top1 = np.mean(out.argmax(-1) == base.argmax(-1))
        rel = np.abs(out - base).max(-1) / np.abs(base).max(-1)
        print(f"{label:<44} {mode:<4} {top1:6.3f} {np.median(rel):9.2e} {np.quantile(rel, 0.99):9.2e} "
              f"{np.mean(rel <= 1e-2):6.3f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ggufs", nargs="*")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--fp16", action="store_true", help="x rounded to fp16, not to int8 groups")
    how.add_argument("--group", type=int, default=GROUP, help=f"columns an int8 scale (default {GROUP})")
    args = ap.parse_args()
    if args.group < 4 or args.group % 4:
        ap.error(f"--group {args.group}: a positive multiple of 4 columns expected")
    try:  # the GGUFs read first: a bad one is refused before the tiny models' minutes
        files = [(path, open_model_file(path)) for path in args.ggufs]
    except (ImpnbError, OSError) as e:
        ap.error(str(e))
    rounding = fp16 if args.fp16 else lambda x: int8(x, args.group)
    print(f"{'model':<44} {'GEMVs':<4} {'top-1':>6} {'rel med':>9} {'rel p99':>9} {'<=1e-2':>6}")
    with tempfile.TemporaryDirectory() as d:
        for arch, quant, seed in (("qwen3moe", "Q8_0", 3), ("qwen3moe", "F32", 3), ("qwen3moe", "Q8_0", 11),
                                  ("qwen3", "Q8_0", 3)):
            _, path = tiny_gguf(arch, quant, d, seed=seed)
            ref = load_reference(open_model_file(path))
            ids = np.random.default_rng(5).integers(0, ref.cfg.n_vocab, 128).astype(np.int32)
            report(f"tiny {arch} {quant} seed {seed} (128 ids)", ref, ids, rounding)
    for path, mf in files:
        ids = np.array(Tokenizer.from_metadata(mf.metadata).encode(TEXT), np.int32)[:128]
        report(f"{Path(path).name} ({len(ids)} tokens)", load_reference(mf), ids, rounding)
    return 0


if __name__ == "__main__":
    sys.exit(main())
