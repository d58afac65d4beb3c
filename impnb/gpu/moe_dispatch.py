"""Which path runs a prefill expert GEMM of a MoE layer: the grouped tensor-core tiles
(kernels/moe/gemm_grouped.py, "tiles"), the same tiles on wgmma (gemm_grouped_wgmma.py, "wgmma"),
the cuBLAS fallback, one batched GEMM over the tiles on the experts dequantized to fp16
(gpu/moe_prefill.py), or, for a batch's few tokens an expert, the grouped dp4a GEMV on int8
activations ("gemv{n}s{span}u{depth}r{rows}": tiles of at most n tokens, the kernel's variant;
kernels/gemv/gemv_dp4a_multi.gemv_dp4a_grouped) or the grouped int8 tensor-core GEMM ("mmq",
kernels/moe/gemm_mmq_grouped.py), which a layer takes only for all of its expert matrices at
once (ffn_paths).

A measured choice per (weight type, N, K of one expert, T bucket of the chunk: BUCKETS, a decode
batch's few rows in the 8 bucket), kept as data in impnb/tuning/moe_table.json (IMPNB_MOE_TABLE
names another), which scripts/tune_moe.py writes. A key without an 8 bucket takes its 16's; shapes
or buckets not in the table take the tiles, and so does "wgmma" for a weight it does not take. Each distinct
choice is logged once ("impnb.gemm", debug).
"""

from functools import lru_cache
from pathlib import Path

from gguf import GGMLQuantizationType as T

from impnb import tuning

from impnb.gpu import gemv_dispatch
from impnb.gpu.gemm_dispatch import M_BUCKETS, pick, read_choices
from impnb.kernels.gemv.gemv_variants import Variant
from impnb.kernels.moe import gemm_grouped_wgmma, gemm_mmq_grouped

TABLE_PATH = tuning.MOE_TABLE
# T buckets: the GEMM's, and 8 below them for a decode batch grouped by expert (5..8 rows,
# tuning.MOE_GROUPED_ROWS), whose paths may differ from a 16-token chunk's
BUCKETS = (8, *M_BUCKETS)
FALLBACK = {8: 16}  # a key's bucket without an entry -> the bucket it takes instead
# the grouped GEMV's paths, "gemv{n}{variant}": tiles of at most n tokens, the kernel's row-group
# span, chunks in flight and rows a group (gemv_variants.Variant); n x rows x depth kept to what
# compiles without spills (Q4_K gate|up at 2048 columns); a token a tile also over groups of 8 or
# 16 lanes (a short row's chunks over fewer threads, every lane busy)
GEMV_PATHS = {f"gemv{n}{v.name}": (n, v) for n, v in
              [(n, Variant(s, u, r)) for n in (2, 4) for s, u, r in ((32, 1, 4), (32, 2, 4), (64, 1, 4))]
              + [(2, Variant(s, u, 8)) for s, u in ((32, 1), (32, 2), (64, 1))]
              + [(8, Variant(s, u, 2)) for s, u in ((32, 1), (32, 2), (64, 1))]
              + [(1, Variant(s, u, 8)) for s, u in ((32, 1), (64, 1), (8, 1), (8, 2), (16, 1), (16, 2))]}
MMQ = "mmq"  # the grouped int8 tensor-core GEMM (kernels/moe/gemm_mmq_grouped.py): tiles of 8 tokens
INT8_PATHS = (*GEMV_PATHS, MMQ)  # the paths on int8 activations, taken for a whole layer (ffn_paths)
GEMV_TOKENS = sorted({n for n, _ in GEMV_PATHS.values()} | {gemm_mmq_grouped.TOKENS})
PATHS = ("tiles", "cublas", "wgmma", *INT8_PATHS)
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
    return read_choices(path, PATHS, _key_ok, BUCKETS)


def choose(ggml_type: T, N: int, K: int, n_tokens: int, table: dict | None = None) -> str:
    """The path for the expert GEMMs of a chunk of n_tokens with one expert's weight (N, K)."""
    key = shape_key(ggml_type, N, K)
    path = pick(load_table() if table is None else table, key, n_tokens, DEFAULT, _logged, f"{key} T<=%d", BUCKETS,
                FALLBACK)
    if (path in GEMV_PATHS and not gemv_dispatch.takes(ggml_type, K)  # gemv_dp4a_multi's rows
            or path == MMQ and not gemm_mmq_grouped.supports(ggml_type, K)):
        return DEFAULT
    return DEFAULT if path == "wgmma" and not gemm_grouped_wgmma.supports(ggml_type, K) else path


def tile_tokens(path: str) -> int:
    """Tokens a tile of an int8 path."""
    return gemm_mmq_grouped.TOKENS if path == MMQ else GEMV_PATHS[path][0]


def ffn_paths(mats, n_expert: int, n_tokens: int, table: dict | None = None, gemv: bool = True) -> list:
    """The paths of one layer's expert matrices (gate|up stacked or gate, up; then down) for a
    chunk of n_tokens: the int8 paths (grouped GEMV, grouped int8 GEMM) only where every matrix
    takes one, gate|up is stacked (they write act(gate) * up themselves) and the caller runs them
    (gemv); else a matrix the table gave one takes a GEMM path (wgmma where it takes the weight,
    else the tiles)."""
    paths = [choose(w.ggml_type, w.rows // n_expert, w.cols, n_tokens, table) for w in mats]
    if gemv and len(mats) == 2 and all(p in INT8_PATHS for p in paths):
        return paths
    return [("wgmma" if gemm_grouped_wgmma.supports(w.ggml_type, w.cols) else DEFAULT) if p in INT8_PATHS else p
            for w, p in zip(mats, paths)]
