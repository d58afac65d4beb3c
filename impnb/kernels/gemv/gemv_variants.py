"""Which GEMV kernel variant runs: row-group span, unroll and rows per group, by type, T and shape.

A `Variant` is the build-time shape of one gemv.py kernel; `choose` is the rule `launch_rows` and
`gemv_experts` follow (measured: see WIDE_K), and `sweep` the T = 1 variants
scripts/bench_gemv.py --sweep times against it.
"""

from typing import NamedTuple

from gguf import GGMLQuantizationType as T

from impnb import tuning

WARPS = 4
BLOCK = 32 * WARPS

# T = 1 types whose 4-row kernel stays under ~96 registers (5/6-bit types would need ~128)
FOUR_ROW_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.F16, T.F32)


class Variant(NamedTuple):
    span: int  # threads per row group: 32, 64 or 128 (one, two or four warps); 8, 16 (part of one)
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


# T = 1, K >= WIDE_K, a WIDE_TYPES type: two warps a group over twice the rows; under
# WIDE_MIN_ROWS rows four warps a group (measured: impnb/tuning).
WIDE_K, WIDE_TYPES, WIDE_MIN_ROWS = tuning.WIDE_K, tuning.WIDE_TYPES, tuning.WIDE_MIN_ROWS


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
