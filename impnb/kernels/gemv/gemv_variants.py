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


# Measured on the H100 (scripts/bench_gemv.py --sweep, 2026-11-23): at T = 1 with K >= 4096,
# two warps a group over twice the rows beat the one-chunk default by 1.0-1.3x on 4096x14336 and
# 14336x4096 (Q8_0 66-68% of 2.97 TB/s, Q4_1 59-64%, Q4_K 56-60%, Q6_K 66-76%); unrolled loads
# (u2, u4) lost nearly everywhere, and at K = 640 (Gemma3's 262144x640) the default stays best.
# Below WIDE_MIN_ROWS rows the wide variant leaves under two blocks an SM; four warps a group over
# the same rows beat it there (H100, 2026-11-27, bench_gemv.py, cold weights, µs a launch / back to
# back, Qwen3-30B-A3B's attn_output 2048x4096 Q4_K): s64u1r8 9.44 / 6.20, s128u1r8 8.35 / 5.10,
# s128u1r4 7.98 / 5.63, s64u1r4 8.64 / 5.56; tg128 of Qwen3-30B-A3B Q4_K_M (same day, one call,
# its attn_output on this GEMV) 458.7, 460.1 -> 468.6, 467.7.
# In the decode graph (synthetic Qwen3-30B-A3B Q4_K_M tg128, H100, 2026-11-27 17:30 UTC, one call)
# its normed Q|K|V and Q|K GEMVs (5120 and 4608 x 2048 Q4_K) on this rule's s64u1r4 535.6, 534.5
# tok/s; s64u1r8 537.2, s128u1r4 518.8, s32u2r4 519.1, s32u1r4 513.7, s64u2r4 497.9: kept.
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
