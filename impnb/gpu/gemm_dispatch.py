"""Which prefill GEMM runs a weight: cuBLAS on a dequantized fp16 copy (the fallback), the
mma.sync tiles that decode the weight in shared memory (kernels/gemm/gemm_tc_quant.py, bm 64 or 128),
the same tiles split along K for few rows (kernels/gemm/gemm_quant_splitk.py, "splitk": a batched
decode step's 9..256), the few-row GEMM that decodes W into mma fragments with no tile in shared
memory (kernels/gemm/gemm_few.py, "few"), the int8 one on x quantized to int8 and W's stored
quants (kernels/gemm/gemm_mmq.py, "mmq"), the wgmma tiles (kernels/gemm/gemm_wgmma_quant.py) or
their few-row form split along K, each weight decoded once for up to 128 rows
(kernels/gemm/gemm_wgmma_few.py, "wgmma_few"), or that form with W in wgmma's register operand
and the rows from shared memory (kernels/gemm/gemm_wgmma_rs.py, "wrs": Q4_K and Q6_K; x cast in its
column order).

A measured choice per (weight type, N, K, M bucket), kept as data in
impnb/tuning/gemm_table.json, which scripts/tune_gemm.py writes on the GPU the table names by
table_choice's rule (a tile that beat cuBLAS there; at a short prompt's buckets, also one close
enough to it that the prompt needs no cuBLAS handle). Shapes not in the table take cuBLAS. Each distinct
choice is logged once ("impnb.gemm", debug).
"""

import json
import logging
from functools import lru_cache
from pathlib import Path

from gguf import GGMLQuantizationType as T

from impnb import tuning
from impnb.errors import ParameterError
from impnb.kernels.gemm import gemm_wgmma_rs

TABLE_PATH = tuning.GEMM_TABLE
M_BUCKETS = (16, 32, 64, 128, 256, 512)
PATHS = ("cublas", "tiles_bm64", "tiles_bm128", "wgmma", "splitk", "few", "mmq", "wgmma_few", "wrs")
TILE_BM = {"tiles_bm64": 64, "tiles_bm128": 128}  # gemm_tc_quant paths -> their bm
log = logging.getLogger("impnb.gemm")
_logged: set = set()


def m_bucket(M: int, buckets: tuple = M_BUCKETS) -> int:
    """The smallest of buckets holding M rows (the largest for longer chunks)."""
    return next((b for b in buckets if b >= M), buckets[-1])


def shape_key(ggml_type: T, N: int, K: int) -> str:
    return f"{T(ggml_type).name} {N}x{K}"


def read_choices(path: Path, paths, check_key=None, buckets: tuple = M_BUCKETS) -> dict:
    """{key: {str(row bucket): path}} of a tuning script's table; every bucket in buckets, every
    path in paths, every key passing check_key (ParameterError naming the file otherwise: a table
    IMPNB_GEMM_TABLE or IMPNB_MOE_TABLE names may be the user's)."""
    try:
        table = json.loads(path.read_text())["choices"]
        bad = [f"bad key {key!r}" for key in table if check_key and not check_key(key)]
        bad += [f"bad entry {key} rows={m}: {choice}" for key, by_m in table.items() for m, choice in by_m.items()
                if not m.isdigit() or int(m) not in buckets or choice not in paths]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        bad = [f"not a table of choices ({type(e).__name__}: {e})"]
    if bad:
        raise ParameterError(f"tuning table {path}: {bad[0]}")
    return table


def pick(table: dict, key: str, rows: int, default: str, logged: set, what: str, buckets: tuple = M_BUCKETS,
         fallback: dict | None = None) -> str:
    """table's choice for key at rows' bucket (of buckets; a bucket the table lacks for key takes
    fallback's bucket in its place, where given), else default; each (key, bucket) logged once as
    `what` with the bucket filled in."""
    b = m_bucket(rows, buckets)
    by_b = table.get(key, {})
    choice = by_b.get(str(b)) or by_b.get(str((fallback or {}).get(b)))
    if (key, b) not in logged:
        logged.add((key, b))
        log.debug("%s: %s (%s)", what % b, choice or default, "table" if choice else "default")
    return choice or default


def table_choice(us: dict, M: int) -> str:
    """The path tune_gemm writes for one (shape, M bucket) from its times in µs ({path: µs}, inf
    where a path cannot run it): the fastest path where it beats cuBLAS by more than
    tuning.GEMM_MARGIN; at M up to tuning.GEMM_SHORT_ROWS, also the fastest of impnb's own paths
    within tuning.GEMM_SHORT_FACTOR of cuBLAS's time, so a short prompt's prefill needs no cuBLAS
    handle; else cuBLAS."""
    own = min((p for p in PATHS if p != "cublas"), key=lambda p: us.get(p, float("inf")))
    t, ref = us.get(own, float("inf")), us["cublas"]
    if t * tuning.GEMM_MARGIN < ref or (M <= tuning.GEMM_SHORT_ROWS and t <= ref * tuning.GEMM_SHORT_FACTOR):
        return own
    return "cublas"


@lru_cache(maxsize=1)
def load_table(path: Path = TABLE_PATH) -> dict:
    """{shape_key: {str(M bucket): path}}; validated."""
    return read_choices(path, PATHS)


FEW_K = 128  # gemm_few's and gemm_mmq's K granularity (their 128-column groups)
WGMMA_K = 64  # the wgmma tiles' K step


def choose(ggml_type: T, N: int, K: int, M: int, table: dict | None = None) -> str:
    """The path for C (M, N) = A (M, K) · W(N, K)ᵀ with W of ggml_type ("few", "mmq" and "wgmma_few"
    only where their K granularity holds, else cuBLAS)."""
    key = shape_key(ggml_type, N, K)
    path = pick(load_table() if table is None else table, key, M, "cublas", _logged, f"gemm {key} M<=%d")
    if path in ("few", "mmq") and K % FEW_K or path == "wgmma_few" and K % WGMMA_K:
        return "cublas"
    if path == "wrs" and not gemm_wgmma_rs.supports(ggml_type, K):
        return "cublas"
    return path
