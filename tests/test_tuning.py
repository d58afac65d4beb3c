"""impnb/tuning: the measured tables as the kernels read them (the values they had when they were
dict literals in the kernels), and the environment's A/B overrides read at load with one-line
errors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from impnb import tuning
from impnb.errors import ParameterError
from impnb.kernels.gemv import gemv_dp4a_units, gemv_dp4a_variants, gemv_variants
from impnb.kernels.gemv.gemv_variants import Variant
from impnb.kernels.moe import router_fold


def test_kernel_tables_read_tuning():
    assert gemv_dp4a_variants.LONG_K == 8192
    assert {t: tuple(v.name for v in vs) for t, vs in gemv_dp4a_variants.T1_VARIANTS.items()} == {
        T.Q8_0: ("s128u2r4", "s128u2r2"), T.Q4_K: ("s64u1r4", "s128u1r8"), T.Q5_K: ("s64u1r4", "s128u1r8"),
        T.Q4_1: ("s128u1r4", "s64u3r2"), T.Q4_0: ("s128u1r4", "s128u1r4"), T.Q5_0: ("s128u1r4", "s128u1r4"),
        T.Q6_K: ("s64u1r8", "s128u1r8"), T.MXFP4: ("s128u1r8", "s64u1r4"), T.NVFP4: ("s128u1r8", "s64u1r4")}
    assert set(gemv_dp4a_variants.T1_VARIANTS) == set(gemv_dp4a_units.DP4A_TYPES)
    assert gemv_dp4a_variants.T1_CAPPED == {
        (T.Q4_K, False, False): (Variant(128, 1, 4), 80, 8192), (T.Q4_K, True, False): (Variant(64, 1, 4), 80, 1),
        **{(t, False, long): v for t in (T.NVFP4, T.MXFP4)
           for long, v in ((False, (Variant(128, 1, 8), 80, 1)), (True, (Variant(128, 1, 4), 64, 1)))}}
    assert gemv_dp4a_variants.EXPERTS_T1 == {T.Q4_K: Variant(32, 2, 4), T.NVFP4: Variant(64, 1, 4),
                                             T.MXFP4: Variant(64, 1, 4)}
    assert router_fold.FOLD_T1 == {T.Q4_K: Variant(32, 2, 4)}
    assert gemv_dp4a_variants.T1_SHORT == {T.NVFP4: Variant(64, 1, 4), T.MXFP4: Variant(64, 1, 4)}
    assert (gemv_variants.WIDE_K, gemv_variants.WIDE_MIN_ROWS) == (4096, 4096)
    assert all(isinstance(v, Variant) for vs in gemv_dp4a_variants.T1_VARIANTS.values() for v in vs)


def test_overrides_default(monkeypatch):
    for name in ("GEMV_TAIL", "STACK_MIXED", "GEMV_PAIR", "ATTN_DP4A", "ROUTER_FOLD", "SHARED_GATE_FOLD", "GEMV_STREAM",
                 "MOE_DOWN_DP4A", "DP4A_MIN_MB", "DP4A_MIN_K", "SHORT_DECODE_MAX", "SHORT_DECODE_MAX_BATCH",
                 "SHORT_CLUSTER", "FUSED_POST_DIMS", "GEMV_ROWS", "GEMV_ROWS_FORCE", "MOE_GROUPED_ROWS",
                 "MOE_GROUPED_MIN_ROWS", "DP4A_ANY_SIZE", "DP4A_TAIL", "WINDOW_SHORT", "WIDE_TILED", "WINDOW_RING",
                 "BATCH_FUSED_NORMS", "BATCH_GLU_REDUCE", "GEMM_PAIR_RS_ROWS", "GEMM_PAIR_MMQ_ROWS",
                 "ROUTER_BATCH_ROWS", "MOE_ACT_INT8", "SHORT_DECODE_MAX_BATCH_NO_MMA"):
        monkeypatch.delenv(f"IMPNB_{name}", raising=False)
    assert tuning.Overrides.from_env() == tuning.Overrides()


def test_overrides_from_env(monkeypatch):
    monkeypatch.setenv("IMPNB_GEMV_TAIL", "0")
    monkeypatch.setenv("IMPNB_ROUTER_FOLD", "1")
    monkeypatch.setenv("IMPNB_SHARED_GATE_FOLD", "0")
    monkeypatch.setenv("IMPNB_DP4A_MIN_MB", "0")
    monkeypatch.setenv("IMPNB_DP4A_MIN_K", "0")
    monkeypatch.setenv("IMPNB_SHORT_DECODE_MAX", "0")
    monkeypatch.setenv("IMPNB_SHORT_DECODE_MAX_BATCH", "2")
    monkeypatch.setenv("IMPNB_FUSED_POST_DIMS", "")
    monkeypatch.setenv("IMPNB_GEMV_ROWS", "0")
    monkeypatch.setenv("IMPNB_GEMV_ROWS_FORCE", "s64u2r4")
    monkeypatch.setenv("IMPNB_MOE_GROUPED_ROWS", "16")
    monkeypatch.setenv("IMPNB_MOE_GROUPED_MIN_ROWS", "2")
    monkeypatch.setenv("IMPNB_DP4A_ANY_SIZE", "")
    monkeypatch.setenv("IMPNB_DP4A_TAIL", "1")
    monkeypatch.setenv("IMPNB_WINDOW_SHORT", "0")
    monkeypatch.setenv("IMPNB_WIDE_TILED", "0")
    monkeypatch.setenv("IMPNB_WINDOW_RING", "0")
    monkeypatch.setenv("IMPNB_BATCH_FUSED_NORMS", "0")
    monkeypatch.setenv("IMPNB_BATCH_GLU_REDUCE", "0")
    monkeypatch.setenv("IMPNB_GEMM_PAIR_RS_ROWS", "")
    monkeypatch.setenv("IMPNB_GEMM_PAIR_MMQ_ROWS", "8,16")
    monkeypatch.setenv("IMPNB_ROUTER_BATCH_ROWS", "0")
    monkeypatch.setenv("IMPNB_MOE_ACT_INT8", "0")
    monkeypatch.setenv("IMPNB_COMBINE_NEXT", "0")
    monkeypatch.setenv("IMPNB_COMBINE_NEXT_V", "0")
    monkeypatch.setenv("IMPNB_DOWN_EARLY", "0")
    monkeypatch.setenv("IMPNB_COMBINE_EARLY", "0")
    monkeypatch.setenv("IMPNB_MMQ_TRIGGER", "0")
    monkeypatch.setenv("IMPNB_SHORT_DECODE_MAX_BATCH_NO_MMA", "4")
    o = tuning.Overrides.from_env()
    assert o.short_decode_max_batch_no_mma == 4 and tuning.Overrides().short_decode_max_batch_no_mma == 16
    assert not o.mmq_trigger and tuning.Overrides().mmq_trigger
    assert not (o.down_early or o.combine_early) and tuning.Overrides().down_early and tuning.Overrides().combine_early
    assert not (o.combine_next or o.combine_next_v) and tuning.Overrides().combine_next and tuning.Overrides().combine_next_v
    assert o.router_batch_rows == 0 and tuning.Overrides().router_batch_rows == tuning.ROUTER_BATCH_ROWS == 16
    assert not o.moe_act_int8 and tuning.Overrides().moe_act_int8
    assert not (o.batch_fused_norms or o.batch_glu_reduce)
    assert o.gemm_pair_rs == () and tuning.Overrides().gemm_pair_rs == tuning.GEMM_PAIR_RS_ROWS == (16, 32)
    assert o.gemm_pair_mmq == (8, 16) and tuning.Overrides().gemm_pair_mmq == tuning.GEMM_PAIR_MMQ_ROWS == ()
    assert tuning.Overrides().batch_fused_norms and tuning.Overrides().batch_glu_reduce
    assert not o.window_ring and tuning.Overrides().window_ring
    assert not o.window_short and tuning.Overrides().window_short
    assert not o.wide_tiled and tuning.Overrides().wide_tiled
    assert o.dp4a_tail and not tuning.Overrides().dp4a_tail
    assert o.dp4a_any_size == () and tuning.Overrides().dp4a_any_size == (T.NVFP4, T.MXFP4)
    assert not o.gemv_rows and o.gemv_rows_force == "s64u2r4"
    assert (o.moe_grouped_min_rows, o.moe_grouped_rows) == (2, 16)
    assert not o.gemv_tail and o.router_fold and not o.shared_gate_fold and o.dp4a_min_mb == 0 and o.dp4a_min_k == 0
    assert o.short_decode_max == 0 and o.fused_post_dims == () and o.short_cluster is None
    assert o.short_decode_max_batch == 2
    assert tuning.Overrides().short_decode_max_batch == tuning.SHORT_DECODE_MAX_BATCH == 4


@pytest.mark.parametrize("name,value", [("IMPNB_SHORT_CLUSTER", "two"), ("IMPNB_DP4A_MIN_MB", "big"),
                                        ("IMPNB_FUSED_POST_DIMS", "64,x"), ("IMPNB_GEMV_ROWS_FORCE", "s48u1r4"),
                                        ("IMPNB_DP4A_ANY_SIZE", "Q4_K,FP4"),
                                        ("IMPNB_GEMM_PAIR_RS_ROWS", "16,thirty-two"),
                                        ("IMPNB_GEMM_PAIR_MMQ_ROWS", "eight"),
                                        ("IMPNB_ROUTER_BATCH_ROWS", "sixteen")])
def test_malformed_override_is_a_parameter_error(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ParameterError, match=name):
        tuning.Overrides.from_env()


def test_env_types(monkeypatch):
    monkeypatch.setenv("IMPNB_X_TYPES", "NVFP4, MXFP4")
    assert tuning.env_types("IMPNB_X_TYPES", "") == (T.NVFP4, T.MXFP4)
    monkeypatch.setenv("IMPNB_X_TYPES", "")
    assert tuning.env_types("IMPNB_X_TYPES", "NVFP4") == ()
    monkeypatch.delenv("IMPNB_X_TYPES")
    assert tuning.env_types("IMPNB_X_TYPES", "Q4_K") == (T.Q4_K,)
    monkeypatch.setenv("IMPNB_X_TYPES", "NVFP5")
    with pytest.raises(ParameterError, match="IMPNB_X_TYPES"):
        tuning.env_types("IMPNB_X_TYPES", "")


def test_fp4_signed_form_at_one_token(monkeypatch):
    units = gemv_dp4a_units
    for t in (T.MXFP4, T.NVFP4):
        monkeypatch.setattr(tuning, "FP4_SIGNED_T1", (t,))
        assert units.prepare_of(t, 1) is units.SIGNED_T1[t][0] and units.dot_of(t, 1) is units.SIGNED_T1[t][1]
        assert units.prepare_of(t, 2) is units.PREPARES[t] and units.dot_of(t, 2) is units.DOTS[t]
        monkeypatch.setattr(tuning, "FP4_SIGNED_T1", ())
        assert units.prepare_of(t, 1) is units.PREPARES[t] and units.dot_of(t, 1) is units.DOTS[t]
    assert units.prepare_of(T.Q4_K, 1) is units.as_loaded and units.dot_of(T.Q4_K, 2) is units.q4_k_dot


def test_q4_k_high_nibbles_in_place_at_one_token(monkeypatch):
    """Q4_K's one-token dot masks the high nibbles in place where NIBBLE_HI16 is on; its
    multi-token dot and the switch off keep the shifted nibbles."""
    units = gemv_dp4a_units
    monkeypatch.setattr(tuning, "NIBBLE_HI16", True)
    assert units.dot_of(T.Q4_K, 1) is units.q4_k_dot_t1 and units.dot_of(T.Q4_K, 2) is units.q4_k_dot
    monkeypatch.setattr(tuning, "NIBBLE_HI16", False)
    assert units.dot_of(T.Q4_K, 1) is units.q4_k_dot


def test_env_table(monkeypatch):
    """A kernel table's override: unset or 1 the measured one, 0 none, else its entries alone."""
    default = {T.Q4_K: (32, 2, 4)}
    monkeypatch.delenv("IMPNB_X_T1", raising=False)
    assert tuning.env_table("X_T1", default) is default
    monkeypatch.setenv("IMPNB_X_T1", "1")
    assert tuning.env_table("X_T1", default) is default
    monkeypatch.setenv("IMPNB_X_T1", "0")
    assert tuning.env_table("X_T1", default) == {}
    monkeypatch.setenv("IMPNB_X_T1", "NVFP4=s32u2r4, MXFP4=s64u1r2")
    assert tuning.env_table("X_T1", default) == {T.NVFP4: (32, 2, 4), T.MXFP4: (64, 1, 2)}
    for bad in ("s32u2r4", "NVFP5=s32u2r4", "NVFP4=s48u1r4", "NVFP4=s32u2r3", "Q4_K=s32u2r4,0"):
        monkeypatch.setenv("IMPNB_X_T1", bad)
        with pytest.raises(ParameterError, match="IMPNB_X_T1"):
            tuning.env_table("X_T1", default)



def test_switch_defaults(monkeypatch):
    monkeypatch.delenv("IMPNB_X_ON", raising=False)
    assert tuning.switch("X_ON") and not tuning.switch("X_ON", default=False)
    monkeypatch.setenv("IMPNB_X_ON", "0")
    assert not tuning.switch("X_ON") and not tuning.switch("X_ON", default=False)
    monkeypatch.setenv("IMPNB_X_ON", "1")
    assert tuning.switch("X_ON") and tuning.switch("X_ON", default=False)


def test_env_choice(monkeypatch):
    monkeypatch.delenv("IMPNB_X_MODE", raising=False)
    assert tuning.env_choice("X_MODE", (0, 1, 2), 1) == 1
    monkeypatch.setenv("IMPNB_X_MODE", "2")
    assert tuning.env_choice("X_MODE", (0, 1, 2), 1) == 2
    for bad in ("3", "1.0", "own", ""):
        monkeypatch.setenv("IMPNB_X_MODE", bad)
        with pytest.raises(ParameterError, match="IMPNB_X_MODE=.*expected one of 0, 1, 2"):
            tuning.env_choice("X_MODE", (0, 1, 2), 1)


@pytest.mark.parametrize("value,want", [("1024", "1024"), ("8", "ParameterError"), ("x", "ParameterError")])
def test_max_prefill_chunk_from_env(value, want):
    """IMPNB_MAX_PREFILL_CHUNK is read when impnb.tuning is imported: every model's prompt chunk,
    or one clear error."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("from impnb.errors import ParameterError\ntry:\n    from impnb import tuning\n"
            "    from types import SimpleNamespace as N\n"
            "    print(*{tuning.prefill_chunk(N(n_expert=n)) for n in (0, 128)})\n"
            "except ParameterError:\n    print('ParameterError')")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "IMPNB_MAX_PREFILL_CHUNK": value},
                         capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
    assert out.stdout.split() == [want]


def test_prefill_chunk_by_kind_of_model(monkeypatch):
    """Mixtures of experts take larger prompt chunks than dense models (their grouped expert
    GEMMs' tiles fill at more rows an expert); both chunks have prefill graphs."""
    from types import SimpleNamespace

    from impnb.graphs.prefill import BUCKETS

    monkeypatch.setattr(tuning, "_PREFILL_CHUNK_ENV", 0)
    dense, moe = (tuning.prefill_chunk(SimpleNamespace(n_expert=n)) for n in (0, 128))
    assert (dense, moe) == (tuning.PREFILL_CHUNK, tuning.PREFILL_CHUNK_MOE)
    assert dense < moe and {dense, moe} <= set(BUCKETS)


@pytest.mark.parametrize("value,want", [(None, "(32,)"), ("", "()"), ("16,64", "(16, 64)"), ("32,x", "ParameterError")])
def test_wrs_plain_tokens_from_env(value, want):
    """tuning.WRS_PLAIN_TOKENS (read at import): 32 unless IMPNB_WRS_PLAIN_TOKENS lists others (empty:
    none); not integers: the project's ParameterError naming it."""
    env = {k: v for k, v in os.environ.items() if k != "IMPNB_WRS_PLAIN_TOKENS"}
    if value is not None:
        env["IMPNB_WRS_PLAIN_TOKENS"] = value
    code = ("from impnb.errors import ParameterError\ntry:\n import impnb.tuning as t; print(t.WRS_PLAIN_TOKENS)\n"
            "except ParameterError as e:\n assert 'IMPNB_WRS_PLAIN_TOKENS' in str(e); print('ParameterError')")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])
    assert out.stdout.split("\n")[-2] == want


@pytest.mark.parametrize("value,want", [("", "default"), ("missing.json", "ParameterError"), ("other", "other")])
def test_table_paths_from_env(tmp_path, value, want):
    """IMPNB_MOE_TABLE (read when impnb.tuning is imported) names another moe table for an A/B run:
    its path, the committed one where empty, one clear error where no file is there."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    other = tmp_path / "other.json"
    other.write_text('{"choices": {}}')
    value = {"other": str(other), "missing.json": str(tmp_path / "missing.json")}.get(value, value)
    code = ("from impnb.errors import ParameterError\ntry:\n    from impnb import tuning\n"
            "    print(tuning.MOE_TABLE)\nexcept ParameterError as e:\n    print('ParameterError', e)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "IMPNB_MOE_TABLE": value},
                         capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
    got = out.stdout.strip()
    if want == "default":
        assert got == str(Path(tuning.__file__).parent / "moe_table.json")
    elif want == "other":
        assert got == str(other)
    else:
        assert got.startswith("ParameterError IMPNB_MOE_TABLE=") and "no such file" in got
