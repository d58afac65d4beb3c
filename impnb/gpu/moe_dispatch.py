"""Which path runs a prefill expert GEMM of a MoE layer: the grouped tensor-core tiles
(kernels/moe/gemm_grouped.py, "tiles"), the same tiles on wgmma (gemm_grouped_wgmma.py, "wgmma"),
or the cuBLAS fallback, one batched GEMM over the tiles on the experts dequantized to fp16
(gpu/moe_prefill.py).

A measured choice per (weight type, N, K of one expert, T bucket of the prefill chunk), kept as
data in impnb/tuning/moe_table.json, which scripts/tune_moe.py writes. Shapes or buckets not in
the table take the tiles, and so does "wgmma" for a weight it does not take. Each distinct
choice is logged once ("impnb.gemm", debug).
"""

from functools import lru_cache
from pathlib import Path

from gguf import GGMLQuantizationType as T

from impnb import tuning

from impnb.gpu.gemm_dispatch import pick, read_choices
from impnb.kernels.moe import gemm_grouped_wgmma

TABLE_PATH = tuning.MOE_TABLE
PATHS = ("tiles", "cublas", "wgmma")
DEFAULT = "tiles"
_logged: set = set()


def shape_key(ggml_type: T, N: int, K: int) -> str:
    """The table key of one expert's (N, K) weight of ggml_type."""
    return f"moe {T(ggml_type).name} {N}x{K}"


def _key_ok(key: str) -> bool:
    words = key.split()
    dims = words[2].split("x") if len(words) == 3 else []
    return words[:1] == ["moe"] and len(dims) == 2 and words[1] in T.__members__ \
        and all(d.isdigit() and int(d) > 0 for d in dims)


@lru_cache(maxsize=1)
def load_table(path: Path = TABLE_PATH) -> dict:
    """{shape_key: {str(T bucket): path}}; validated."""
    return read_choices(path, PATHS, _key_ok)


def choose(ggml_type: T, N: int, K: int, n_tokens: int, table: dict | None = None) -> str:
    """The path for the expert GEMMs of a chunk of n_tokens with one expert's weight (N, K)."""
    key = shape_key(ggml_type, N, K)
    path = pick(load_table() if table is None else table, key, n_tokens, DEFAULT, _logged, f"{key} T<=%d")
    return DEFAULT if path == "wgmma" and not gemm_grouped_wgmma.supports(ggml_type, K) else path
