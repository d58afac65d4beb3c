"""choose_dp4a, and choose_measured for the routed experts (choose_experts) and router_fold's GEMV
(FOLD_T1): the measured T = 1 table covers every dp4a type, and a variant never asks for more rows
a group than the weight's outputs, a wider span than a row's chunks, or an odd GLU row count (the
kernel's last group starts R rows before the end); choose_capped's register-capped FP4 entries."""

import pytest
from gguf import GGMLQuantizationType as T

from impnb.kernels.gemv.gemv_dp4a_units import DP4A_TYPES
from impnb.kernels.gemv.gemv_dp4a_variants import (EXPERTS_T1, LONG_K, T1_VARIANTS, choose_capped, choose_dp4a,
                                                   choose_experts, choose_measured)
from impnb.kernels.gemv.gemv_units import NO_GLU, SILU
from impnb.kernels.gemv.gemv_variants import Variant, span_for
from impnb.kernels.moe.router_fold import FOLD_T1


def test_table_covers_every_type():
    assert set(T1_VARIANTS) == set(DP4A_TYPES)


@pytest.mark.parametrize("ggml_type", DP4A_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("glu", [NO_GLU, SILU])
def test_variant_fits_the_weight(ggml_type, glu):
    for n_tok in (1, 2, 3, 8):
        for cols in (256, 1024, 2048, 4096, LONG_K, 14336):
            for n_out in (1, 2, 3, 5, 77, 4096):
                v = choose_dp4a(ggml_type, n_tok, cols, glu, n_out)
                out_rows = v.rows // 2 if glu else v.rows
                assert 1 <= out_rows <= n_out and v.span <= span_for(cols)
                assert not glu or v.rows % 2 == 0


def test_measured_choices():
    assert choose_dp4a(T.Q4_K, 1, 14336).name == "s128u1r8"
    assert choose_dp4a(T.Q4_K, 1, 4096).name == "s64u1r4"
    assert choose_dp4a(T.Q6_K, 1, 12288).name == "s128u1r8"
    assert choose_dp4a(T.Q8_0, 1, 4096, SILU, 1).rows == 2


@pytest.mark.parametrize("ggml_type", DP4A_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("glu", [NO_GLU, SILU])
def test_experts_variant_fits_the_expert(ggml_type, glu):
    for cols in (256, 2048, 4096, LONG_K):
        for n_out in (1, 2, 3, 77, 768):
            v = choose_experts(ggml_type, cols, glu, n_out)
            out_rows = v.rows // 2 if glu else v.rows
            assert 1 <= out_rows <= n_out and v.span <= span_for(cols)
            assert not glu or v.rows % 2 == 0


def test_experts_choices():
    """Qwen3-30B-A3B's Q4_K gate|up (768 x 2 x 2048) takes the measured entry; the rest and
    the down projection (no GLU) take choose_dp4a's."""
    assert choose_experts(T.Q4_K, 2048, SILU, 768) == EXPERTS_T1[T.Q4_K] and EXPERTS_T1[T.Q4_K].name == "s32u2r4"
    assert choose_experts(T.Q4_K, 2048, NO_GLU, 768) == choose_dp4a(T.Q4_K, 1, 2048, NO_GLU, 768)
    assert choose_experts(T.Q4_K, LONG_K, SILU, 768) == choose_dp4a(T.Q4_K, 1, LONG_K, SILU, 768)
    assert choose_experts(T.Q8_0, 2048, SILU, 768) == choose_dp4a(T.Q8_0, 1, 2048, SILU, 768)


@pytest.mark.parametrize("ggml_type", DP4A_TYPES, ids=lambda t: t.name)
def test_fold_variant_fits_the_weight(ggml_type):
    for n_tok in (1, 2, 8):
        for cols in (256, 4096, LONG_K):
            for n_out in (1, 2, 3, 48, 2048):
                v = choose_measured(FOLD_T1, ggml_type, n_tok, cols, NO_GLU, n_out)
                assert 1 <= v.rows <= n_out and v.span <= span_for(cols)


def test_fold_choices():
    """Qwen3-30B-A3B's Q4_K attn_output (2048 x 4096) at T = 1 takes the measured entry; other T,
    K from LONG_K, other types and too few outputs take choose_dp4a's."""
    def fold(ggml_type, n_tok, cols, n_out):
        return choose_measured(FOLD_T1, ggml_type, n_tok, cols, NO_GLU, n_out)

    assert fold(T.Q4_K, 1, 4096, 2048) == FOLD_T1[T.Q4_K] and FOLD_T1[T.Q4_K].name == "s32u2r4"
    assert fold(T.Q4_K, 2, 4096, 2048) == choose_dp4a(T.Q4_K, 2, 4096, n_out=2048)
    assert fold(T.Q4_K, 1, LONG_K, 2048) == choose_dp4a(T.Q4_K, 1, LONG_K, n_out=2048)
    assert fold(T.Q6_K, 1, 4096, 2048) == choose_dp4a(T.Q6_K, 1, 4096, n_out=2048)
    assert fold(T.Q4_K, 1, 4096, 3) == choose_dp4a(T.Q4_K, 1, 4096, n_out=3)


def test_fp4_register_capped():
    """FP4 at T = 1 without GLU from K = 4096: s128u1r8 at 80 registers, from LONG_K s128u1r4 at
    64; below 4096 T1_SHORT's s64u1r4 where its rows and span fit; with GLU or at more tokens
    choose_dp4a's, uncapped."""
    for t in (T.NVFP4, T.MXFP4):
        assert choose_capped(t, 1, 4096, NO_GLU, 4096) == (Variant(128, 1, 8), 80)
        assert choose_capped(t, 1, 14336, NO_GLU, 4096) == (Variant(128, 1, 4), 64)
        assert choose_capped(t, 1, 12288, NO_GLU, 3) == (choose_dp4a(t, 1, 12288, NO_GLU, 3), None)
        assert choose_capped(t, 1, 2048, NO_GLU, 4096) == (Variant(64, 1, 4), None)  # T1_SHORT
        assert choose_capped(t, 1, 2048, NO_GLU, 3) == (choose_dp4a(t, 1, 2048, NO_GLU, 3), None)
        assert choose_capped(t, 1, 1024, NO_GLU, 4096) == (choose_dp4a(t, 1, 1024, NO_GLU, 4096), None)
        assert choose_capped(t, 1, 2048, SILU, 4096) == (choose_dp4a(t, 1, 2048, SILU, 4096), None)
        assert choose_capped(t, 2, 2048, NO_GLU, 4096) == (choose_dp4a(t, 2, 2048, NO_GLU, 4096), None)
        assert choose_capped(t, 1, 4096, SILU, 4096) == (choose_dp4a(t, 1, 4096, SILU, 4096), None)
        assert choose_capped(t, 2, 14336, NO_GLU, 4096) == (choose_dp4a(t, 2, 14336, NO_GLU, 4096), None)


@pytest.mark.parametrize("ggml_type", DP4A_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("glu", [NO_GLU, SILU])
def test_capped_variant_fits_the_weight(ggml_type, glu):
    for n_tok in (1, 2, 8):
        for cols in (256, 1024, 2048, 3072, 4096, LONG_K, 14336):
            for n_out in (1, 2, 3, 5, 77, 4096):
                v, cap = choose_capped(ggml_type, n_tok, cols, glu, n_out)
                out_rows = v.rows // 2 if glu else v.rows
                assert 1 <= out_rows <= n_out and v.span <= span_for(cols) and cap in (None, 64, 80)
                assert not glu or v.rows % 2 == 0
