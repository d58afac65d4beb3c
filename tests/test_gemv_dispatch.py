"""gpu/gemv_dispatch: the T = 2..8 GEMV table's keys, buckets and variants, its validation, and
the choice a Linear gets at load (the table's, IMPNB_GEMV_ROWS's and the forced variant's)."""

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from impnb.errors import ParameterError
from impnb.gpu import gemv_dispatch as gd
from impnb.gpu.weights import linear_of
from impnb.kernels.common.repack import repack
from impnb.kernels.gemv.gemv_variants import Variant
from impnb.tuning import Overrides
from tests.test_repack import make_weight


def test_buckets_uses_and_names():
    assert [gd.t_bucket(n) for n in range(2, 9)] == [2, 4, 4, 8, 8, 8, 8]
    assert gd.use_of("blk.3.attn_qkv") == gd.use_of("blk.0.attn_qk") == "split"
    assert gd.use_of("blk.1.ffn_gate_up") == "glu"
    assert gd.use_of("blk.1.ffn_down") == gd.use_of("output") == "plain"
    assert gd.parse_variant("s32u2r8") == Variant(32, 2, 8)
    for bad in ("s48u1r4", "s32u3r4", "s32u1r3", "x32u1r4", "s32r4"):
        with pytest.raises(ValueError):
            gd.parse_variant(bad)


def test_choose_from_table_and_force():
    table = {"Q4_K 4096x4096 plain": {2: Variant(32, 1, 4), 8: Variant(64, 2, 8)}}
    got = gd.choose(T.Q4_K, 4096, 4096, "plain", table)
    assert got == {2: Variant(32, 1, 4), 5: Variant(64, 2, 8), 6: Variant(64, 2, 8), 7: Variant(64, 2, 8),
                   8: Variant(64, 2, 8)}  # T 3, 4: bucket 4, not in the table
    assert gd.choose(T.Q4_K, 4096, 4096, "glu", table) == {}
    assert gd.choose(T.Q6_K, 4096, 4096, "plain", table) == {}
    assert gd.choose(T.Q4_K, 8, 64, "glu", {}, force="s32u1r8") == {n: Variant(32, 1, 8) for n in range(2, 9)}
    assert gd.choose(T.Q4_K, 3, 64, "glu", {}, force="s32u1r8") == {}  # 4 outputs a group, 3 rows


def test_table_validation(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"choices": {"Q4_K 8x256 plain": {"4": "s32u1r4"}}}))
    assert gd.load_table.__wrapped__(path) == {"Q4_K 8x256 plain": {4: Variant(32, 1, 4)}}
    for bad in ({"Q4_K 8x256 fused": {"4": "s32u1r4"}}, {"Q4_K 8x256 plain": {"3": "s32u1r4"}},
                {"Q4_K 8x256 plain": {"4": "s32u1r5"}}, {"Q9_K 8x256 plain": {"4": "s32u1r4"}}):
        path.write_text(json.dumps({"choices": bad}))
        with pytest.raises(ParameterError, match="tuning table"):
            gd.load_table.__wrapped__(path)
    assert gd.load_table.__wrapped__(tmp_path / "none.json") == {}
    gd.load_table.cache_clear()
    gd.load_table()  # the committed table (if any) is valid


def test_linear_takes_the_choice(monkeypatch):
    raw = make_weight(T.Q8_0, 16, 2048, np.random.default_rng(0))
    w = repack(raw, T.Q8_0)
    assert linear_of("blk.0.ffn_down", w, Overrides()).multi == gd.choose(T.Q8_0, 16, 2048, "plain")
    forced = linear_of("blk.0.ffn_down", w, Overrides(gemv_rows_force="s64u1r2")).multi
    assert forced == {n: Variant(64, 1, 2) for n in range(2, 9)}
    assert linear_of("blk.0.ffn_down", w, Overrides(gemv_rows=False, gemv_rows_force="s64u1r2")).multi == {}
    narrow = repack(make_weight(T.Q4_1, 16, 576, np.random.default_rng(1)), T.Q4_1)
    lin = linear_of("blk.0.ffn_down", narrow, Overrides(gemv_rows_force="s32u1r2"))
    assert lin.multi == {n: Variant(32, 1, 2) for n in range(2, 9)} and not lin.int8_x  # T = 1 stays float x


def test_which_weights_the_multi_token_gemv_takes():
    """Any dp4a type in rows of whole blocks and x̂ groups, narrow ones too; not a float type,
    nor a row length that splits a block."""
    assert gd.takes(T.Q4_1, 576) and gd.takes(T.Q8_0, 576) and gd.takes(T.Q4_K, 2048) and gd.takes(T.Q6_K, 768)
    assert not gd.takes(T.Q4_K, 576) and not gd.takes(T.Q8_0, 48) and not gd.takes(T.F16, 4096)
    assert not gd.takes(T.F32, 576)


def test_dp4a_by_size_and_type():
    """A small weight's decode GEMV stays on gemv.py but for DP4A_ANY_SIZE's types (FP4: gemv.py's
    decoder costs more than quantize_x and dp4a together); K under DP4A_MIN_K never takes dp4a."""
    rng = np.random.default_rng(2)
    for t in (T.Q4_K, T.NVFP4, T.MXFP4):
        w = repack(make_weight(t, 64, 2048, rng), t)
        assert w.nbytes < Overrides().dp4a_min_mb * 1e6
        assert linear_of("blk.0.attn_qkv", w, Overrides()).dp4a == (t != T.Q4_K)
        assert not linear_of("blk.0.attn_qkv", w, Overrides(dp4a_any_size=())).dp4a
        assert linear_of("blk.0.attn_qkv", w, Overrides(dp4a_min_mb=0)).dp4a
        short = repack(make_weight(t, 64, 1024, rng), t)
        assert not linear_of("blk.0.attn_qkv", short, Overrides()).dp4a
