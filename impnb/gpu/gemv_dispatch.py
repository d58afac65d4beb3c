"""Which decode GEMV runs a weight at T = 2..8 rows (a batched decode step): the multi-token dp4a
kernel (kernels/gemv/gemv_dp4a_multi.py) in a measured variant, the int8 tensor-core GEMM
(kernels/gemm/gemm_mmq.py: the entry "mmq", MMQ), or, where the table has no entry, the path
MatMul takes otherwise (gemv_dp4a's T-token kernel, gemv.py, gemv_stacked).

A measured choice per (weight type, N x K, use, T bucket), kept as data in
impnb/tuning/gemv_rows_table.json, which scripts/bench_gemv_rows.py writes on the GPU (it lists
a shape and bucket only where the kernel beat the default path there). A use is how the weight
is read: "plain" (y = W x, or y += W x), "split" (stacked Q|K|V into its outputs) or "glu"
(gate|up through the activation). A T between buckets takes the next bucket's variant.
"""

import json
import logging
from functools import lru_cache
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from impnb import tuning
from impnb.errors import ParameterError
from impnb.kernels.gemm import gemm_mmq
from impnb.kernels.gemv.gemv_dp4a_multi import MAX_T, MIN_T, VARIANT_ROWS
from impnb.kernels.gemv.gemv_dp4a_units import DOTS
from impnb.kernels.gemv.quant_x import GROUP
from impnb.kernels.gemv.gemv_variants import Variant

TABLE_PATH = tuning.GEMV_ROWS_TABLE
T_BUCKETS = (2, 4, 8)
USES = ("plain", "split", "glu")
log = logging.getLogger("impnb.gemv")


def t_bucket(n_tok: int) -> int:
    """The smallest bucket holding n_tok rows."""
    return next(b for b in T_BUCKETS if b >= n_tok)


def use_of(name: str) -> str:
    """How forward reads the Linear of this (GGUF or stacked) name."""
    if name.endswith(("attn_qkv", "attn_qk")):
        return "split"
    return "glu" if name.endswith("ffn_gate_up") else "plain"


def takes(ggml_type: T, K: int) -> bool:
    """Whether gemv_dp4a_multi takes a weight of this type and row length (any length of whole
    blocks and x̂ scale groups: narrow rows too, where T = 1 keeps the float-x GEMV)."""
    return ggml_type in DOTS and K % max(GROUP, GGML_QUANT_SIZES[T(ggml_type)][0]) == 0


def shape_key(ggml_type: T, N: int, K: int, use: str) -> str:
    return f"{T(ggml_type).name} {N}x{K} {use}"


MMQ = "mmq"  # a table entry (and Linear.multi value) naming gemm_mmq in place of a GEMV


def parse_variant(name: str) -> Variant | str:
    """'s32u1r4' -> Variant(32, 1, 4) (Variant.name's inverse), 'mmq' -> MMQ; ValueError where
    malformed."""
    if name == MMQ:
        return MMQ
    try:
        span, rest = name[1:].split("u")
        unroll, rows = rest.split("r")
        v = Variant(int(span), int(unroll), int(rows))
    except ValueError:
        raise ValueError(f"bad variant {name!r}") from None
    if not name.startswith("s") or v.span not in (32, 64, 128) or v.unroll not in (1, 2) or v.rows not in VARIANT_ROWS:
        raise ValueError(f"bad variant {name!r}")
    return v


@lru_cache(maxsize=1)
def load_table(path: Path = TABLE_PATH) -> dict:
    """{shape_key: {T bucket: Variant}}; validated (ParameterError naming the file on a bad entry:
    IMPNB_GEMV_ROWS_TABLE may name the user's); {} without a file."""
    if not path.is_file():
        return {}
    try:
        choices = json.loads(path.read_text())["choices"]
        out = {}
        for key, by_t in choices.items():
            parts = key.split(" ")
            if len(parts) != 3 or parts[0] not in T.__members__ or parts[2] not in USES:
                raise ValueError(f"bad key {key!r}")
            out[key] = {}
            for t, name in by_t.items():
                if not t.isdigit() or int(t) not in T_BUCKETS:
                    raise ValueError(f"bad bucket {key} T={t}")
                out[key][int(t)] = parse_variant(name)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ParameterError(f"tuning table {path}: {e}") from None
    return out


def choose(ggml_type: T, N: int, K: int, use: str, table: dict | None = None, force: str | None = None) -> dict:
    """{T: Variant} for every T in 2..8 whose bucket the table lists for this shape and use; with
    force (a variant's name: IMPNB_GEMV_ROWS_FORCE), that variant at every T where it fits N."""
    if force:
        v = parse_variant(force)
        if v == MMQ:
            return {n: MMQ for n in range(MIN_T, MAX_T + 1)} if gemm_mmq.supports(ggml_type, K) else {}
        fits = v.rows // (2 if use == "glu" else 1) <= N and (use != "glu" or v.rows % 2 == 0)
        return {n: v for n in range(MIN_T, MAX_T + 1)} if fits else {}
    by_t = (load_table() if table is None else table).get(shape_key(ggml_type, N, K, use), {})
    out = {n: by_t[t_bucket(n)] for n in range(MIN_T, MAX_T + 1) if t_bucket(n) in by_t
           and (by_t[t_bucket(n)] != MMQ or gemm_mmq.supports(ggml_type, K))}
    if out:
        log.debug("gemv %s: gemv_dp4a_multi at T %s", shape_key(ggml_type, N, K, use), sorted(out))
    return out
