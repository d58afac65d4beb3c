"""Which GEMV kernel variant runs: row-group span, unroll and rows per group, by type, T and shape.

A `Variant` is the build-time shape of one gemv.py kernel; `choose` is the rule `_launch` and
`gemv_experts` follow (measured: see WIDE_K), and `sweep` the T = 1 variants
scripts/bench_gemv.py --sweep times against it.
"""

from typing import NamedTuple

from gguf import GGMLQuantizationType as T

WARPS = 4
BLOCK = 32 * WARPS

# T = 1 types whose 4-row kernel stays under ~96 registers (5/6-bit types would need ~128)
FOUR_ROW_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.F16, T.F32)


class Variant(NamedTuple):
    span: int  # threads per row group: 32, 64 or 128 (one, two or four warps)
    unroll: int  # chunks of each row a thread loads before decoding any: 1, 2 or 4 (gemv_dp4a: 1-4 in flight)
    rows: int  # weight rows per group: 1, 2, 4 or 8 (8, 4 only at T = 1)

    @property
    def name(self) -> str:
        return f"s{self.span}u{self.unroll}r{self.rows}"


def rows_per_block(ggml_type: T, n_tok: int) -> int:
    """Rows a thread works on at once, sharing each x load: 4 for T = 1 (x held in registers;
    2 for the 5/6-bit types), 2 for T = 2, 1 for larger T (keeps registers down)."""
    if n_tok == 1:
        return 4 if ggml_type in FOUR_ROW_TYPES else 2
    return 2 if n_tok == 2 else 1


def span_for(cols: int) -> int:
    """Threads per row group: enough for one chunk each (cols/32), from one warp up to 128."""
    chunks = cols // 32
    return 32 if chunks <= 32 else 64 if chunks <= 64 else BLOCK


# At T = 1 with K >= 4096, two warps a group over twice the rows beat the one-chunk default by
# 1.0-1.3x on 4096x14336 and 14336x4096 (scripts/bench_gemv.py --sweep); unrolled loads (u2, u4)
# lose nearly everywhere, and at K = 640 (Gemma3's 262144x640 logits) the default stays best.
# Below WIDE_MIN_ROWS rows the wide variant leaves under two blocks an SM; four warps a group over
# the same rows beat it there (Qwen3-30B-A3B's 2048x4096 Q4_K attn_output: 5.10 µs against 6.20
# back to back). Other variants of the decode graph's Q|K|V GEMVs lost or tied in the graph
# (docs/EXPERIMENTS.md, 'GEMV').
WIDE_K = 4096
WIDE_TYPES = (T.Q8_0, T.Q4_1, T.Q4_K, T.Q6_K)
WIDE_MIN_ROWS = 4096


def choose(ggml_type: T, n_tok: int, cols: int, rows: int) -> Variant:
    """The variant for a (rows, cols) weight of this type times T tokens."""
    if n_tok == 1 and cols >= WIDE_K and ggml_type in WIDE_TYPES:
        return Variant(64 if rows >= WIDE_MIN_ROWS else 128, 1, 2 * rows_per_block(ggml_type, 1))
    return Variant(span_for(cols), 1, rows_per_block(ggml_type, n_tok))


SWEEP_TYPES = (T.Q8_0, T.Q4_K, T.Q4_1, T.Q6_K)


def sweep(ggml_type: T) -> list:
    """T = 1 variants to time for a type: today's three spans, 2-4 chunks per thread per step,
    and twice the default rows (8 rows, or 4 for the 5/6-bit types) at span 64."""
    r = rows_per_block(ggml_type, 1)
    return [Variant(s, u, r) for s, u in ((128, 1), (64, 1), (32, 1), (64, 2), (32, 2), (32, 4))] + \
           [Variant(64, 1, 2 * r)]
