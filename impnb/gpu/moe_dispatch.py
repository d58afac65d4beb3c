"""Which path runs a prefill expert GEMM of a qwen3moe layer: the grouped tensor-core tiles
(kernels/gemm_grouped.py) or the cuBLAS fallback, one batched GEMM over the tiles on the experts
dequantized to fp16 (gpu/moe_prefill.py).

A measured choice per (weight type, N, K of one expert, T bucket of the prefill chunk), kept as
data in moe_table.json, which scripts/tune_moe.py writes on the H100. Shapes or buckets not in
the table take the tiles. Each distinct choice is logged once ("impnb.gemm", debug).
"""

import json
import logging
from functools import lru_cache
from pathlib import Path

from gguf import GGMLQuantizationType as T

from impnb.gpu.gemm_dispatch import M_BUCKETS, m_bucket

TABLE_PATH = Path(__file__).with_name("moe_table.json")
PATHS = ("tiles", "cublas")
DEFAULT = "tiles"
log = logging.getLogger("impnb.gemm")
_logged: set = set()


def shape_key(ggml_type: T, N: int, K: int) -> str:
    """The table key of one expert's (N, K) weight of ggml_type."""
    return f"moe {T(ggml_type).name} {N}x{K}"


@lru_cache(maxsize=1)
def load_table(path: Path = TABLE_PATH) -> dict:
    """{shape_key: {str(T bucket): path}}; validated."""
    table = json.loads(path.read_text())["choices"]
    for key, by_t in table.items():
        words = key.split()
        dims = words[2].split("x") if len(words) == 3 else []
        if words[:1] != ["moe"] or len(dims) != 2 or words[1] not in T.__members__ \
                or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"{path}: bad key {key!r}")
        for t, choice in by_t.items():
            if not t.isdigit() or int(t) not in M_BUCKETS or choice not in PATHS:
                raise ValueError(f"{path}: bad entry {key} T={t}: {choice}")
    return table


def choose(ggml_type: T, N: int, K: int, n_tokens: int, table: dict | None = None) -> str:
    """The path for the expert GEMMs of a chunk of n_tokens with one expert's weight (N, K)."""
    table = load_table() if table is None else table
    key, tb = shape_key(ggml_type, N, K), m_bucket(n_tokens)
    choice = table.get(key, {}).get(str(tb))
    if (key, tb) not in _logged:
        _logged.add((key, tb))
        log.debug("%s T<=%d: %s (%s)", key, tb, choice or DEFAULT, "table" if choice else "default")
    return choice or DEFAULT
