"""Which prefill GEMM runs a weight: cuBLAS on a dequantized fp16 copy (the fallback) or the
tensor-core tiles that decode the weight in shared memory (kernels/gemm_tc_quant.py).

A measured choice per (weight type, N, K, M bucket), kept as data in gemm_table.json, which
scripts/tune_gemm.py writes on the H100 (it lists only shapes where a tile beat cuBLAS there).
Shapes not in the table take cuBLAS. Each distinct choice is logged once ("impnb.gemm", debug).
"""

import json
import logging
from functools import lru_cache
from pathlib import Path

from gguf import GGMLQuantizationType as T

TABLE_PATH = Path(__file__).with_name("gemm_table.json")
M_BUCKETS = (16, 32, 64, 128, 256, 512)
PATHS = {"cublas": None, "tiles_bm64": 64, "tiles_bm128": 128}  # path -> the tile's bm
log = logging.getLogger("impnb.gemm")
_logged: set = set()


def m_bucket(M: int) -> int:
    """The smallest bucket holding M rows (the largest for longer chunks)."""
    return next((b for b in M_BUCKETS if b >= M), M_BUCKETS[-1])


def shape_key(ggml_type: T, N: int, K: int) -> str:
    return f"{T(ggml_type).name} {N}x{K}"


@lru_cache(maxsize=1)
def load_table(path: Path = TABLE_PATH) -> dict:
    """{shape_key: {str(M bucket): path}}; validated."""
    table = json.loads(path.read_text())["choices"]
    for key, by_m in table.items():
        for m, choice in by_m.items():
            if int(m) not in M_BUCKETS or choice not in PATHS:
                raise ValueError(f"{path}: bad entry {key} M={m}: {choice}")
    return table


def choose(ggml_type: T, N: int, K: int, M: int, table: dict | None = None) -> str:
    """The path for C (M, N) = A (M, K) · W(N, K)ᵀ with W of ggml_type."""
    table = load_table() if table is None else table
    key, mb = shape_key(ggml_type, N, K), m_bucket(M)
    choice = table.get(key, {}).get(str(mb))
    if (key, mb) not in _logged:
        _logged.add((key, mb))
        log.debug("gemm %s M<=%d: %s (%s)", key, mb, choice or "cublas", "table" if choice else "default")
    return choice or "cublas"
