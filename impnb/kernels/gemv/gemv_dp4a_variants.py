"""Which dp4a GEMV variant runs: the measured T = 1 tables from impnb/tuning and the rules
(choose_dp4a, choose_capped, choose_measured, choose_experts) gemv_dp4a.py's launchers follow."""

from gguf import GGMLQuantizationType as T

from impnb import tuning
from impnb.kernels.gemv.gemv_units import NO_GLU
from impnb.kernels.gemv.gemv_variants import Variant, span_for


# The measured T = 1 tables (impnb/tuning; the figures in docs/EXPERIMENTS.md): by type, the
# variant for K < LONG_K and for K >= LONG_K; by (type, GLU, K >= LONG_K), a variant with its
# register cap and the fewest output rows it takes; the routed experts' gate|up by type.
LONG_K = tuning.DP4A_LONG_K
T1_VARIANTS = {t: tuple(Variant(*v) for v in vs) for t, vs in tuning.DP4A_T1_VARIANTS.items()}
T1_CAPPED = {key: (Variant(*v), cap, fewest) for key, (v, cap, fewest) in tuning.DP4A_T1_CAPPED.items()}
EXPERTS_T1 = {t: Variant(*v) for t, v in tuning.EXPERTS_T1.items()}
T1_SHORT = {t: Variant(*v) for t, v in tuning.DP4A_T1_SHORT.items()}
SHORT_K = 4096  # T1_SHORT's rows are shorter, T1_CAPPED's this long or longer


def choose_dp4a(ggml_type: T, n_tok: int, cols: int, glu: int = NO_GLU, n_out: int = 8) -> Variant:
    """The variant for a weight of `cols` columns and n_out output rows times T tokens: T1_VARIANTS
    at T = 1, else two warps a group over 2 rows at T = 2 (or with GLU: a gate and an up row), 1
    past that; no more rows than n_out outputs need, no wider span than a row has chunks."""
    if n_tok == 1:
        span, unroll, rows = T1_VARIANTS[ggml_type][cols >= LONG_K]
    else:
        span, unroll, rows = 64, 1, 2 if n_tok == 2 or glu else 1
    while rows // (2 if glu else 1) > n_out:
        rows //= 2
    return Variant(min(span, span_for(cols)), unroll, rows)


def choose_capped(ggml_type: T, n_tok: int, cols: int, glu: int, n_out: int) -> tuple[Variant, int | None]:
    """gemv_dp4a's variant and register cap: T1_CAPPED's where it has the entry for the type, GLU
    and K (SHORT_K and more) and the weight the output rows; on plain rows under SHORT_K, T1_SHORT's
    where it fits them; else choose_dp4a's, uncapped."""
    v, cap, fewest = T1_CAPPED.get((ggml_type, glu != NO_GLU, cols >= LONG_K), (None, None, 0))
    if n_tok == 1 and cols >= SHORT_K and v and n_out >= max(fewest, v.rows // (2 if glu else 1)) \
            and span_for(cols) >= v.span:
        return v, cap
    short = T1_SHORT.get(ggml_type)
    if n_tok == 1 and cols < SHORT_K and glu == NO_GLU and short and n_out >= short.rows \
            and span_for(cols) >= short.span:
        return short, None
    return choose_dp4a(ggml_type, n_tok, cols, glu, n_out), None


def choose_measured(table: dict, ggml_type: T, n_tok: int, cols: int, glu: int, n_out: int) -> Variant:
    """One use's measured variant (EXPERTS_T1, router_fold.FOLD_T1): table's entry for the type at
    T = 1 and K < LONG_K where its group's outputs fit n_out and its span a row's chunks, else
    choose_dp4a's."""
    v = table.get(ggml_type)
    if v and n_tok == 1 and cols < LONG_K and v.rows // (2 if glu else 1) <= n_out and v.span <= span_for(cols):
        return v
    return choose_dp4a(ggml_type, n_tok, cols, glu, n_out)


def choose_experts(ggml_type: T, cols: int, glu: int, n_out: int) -> Variant:
    """gemv_dp4a_experts' variant: EXPERTS_T1's for a gate|up (GLU), else choose_dp4a's at T = 1."""
    return choose_measured(EXPERTS_T1 if glu != NO_GLU else {}, ggml_type, 1, cols, glu, n_out)
