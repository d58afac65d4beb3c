"""The prefill expert-GEMM dispatch (impnb/gpu/moe_dispatch.py) on the CPU: table lookup by T bucket,
the tiles default, one log line per distinct choice, table validation, and the committed table."""

import json
import logging

import pytest
from gguf import GGMLQuantizationType as T

from impnb.errors import ParameterError

from impnb.gpu import moe_dispatch as md

TABLE = {"moe Q4_K 1536x2048": {"16": "tiles", "256": "cublas", "512": "cublas"}}


def test_key():
    assert md.shape_key(T.Q6_K, 2048, 768) == "moe Q6_K 2048x768"


def test_table_hit_and_default():
    assert md.choose(T.Q4_K, 1536, 2048, 200, TABLE) == "cublas"   # bucket 256
    assert md.choose(T.Q4_K, 1536, 2048, 4096, TABLE) == "cublas"  # longer chunks: the largest bucket
    assert md.choose(T.Q4_K, 1536, 2048, 9, TABLE) == "tiles"
    assert md.choose(T.Q4_K, 1536, 2048, 100, TABLE) == "tiles"    # bucket 128 not measured
    assert md.choose(T.Q6_K, 1536, 2048, 512, TABLE) == "tiles"    # another type
    assert md.choose(T.Q4_K, 2048, 768, 512, TABLE) == "tiles"     # another shape


def test_decode_bucket_of_eight():
    """A chunk of up to 8 tokens (a decode batch grouped by expert) takes the key's 8 bucket, else
    its 16's; 9..16 tokens the 16's."""
    table = {"moe Q4_K 2048x768": {"8": "gemv1s8u1r8", "16": "gemv1s32u1r8"},
             "moe Q6_K 2048x768": {"16": "gemv1s32u1r8"}, **TABLE}
    assert md.choose(T.Q4_K, 2048, 768, 8, table) == "gemv1s8u1r8"
    assert md.choose(T.Q4_K, 2048, 768, 5, table) == "gemv1s8u1r8"
    assert md.choose(T.Q4_K, 2048, 768, 9, table) == "gemv1s32u1r8"
    assert md.choose(T.Q6_K, 2048, 768, 8, table) == "gemv1s32u1r8"  # no 8: the 16's
    assert md.choose(T.Q4_K, 1536, 2048, 200, table) == "cublas"
    assert md.choose(T.Q8_0, 2048, 768, 8, table) == "tiles"         # neither


def test_each_choice_logged_once(caplog):
    md._logged.clear()
    with caplog.at_level(logging.DEBUG, logger="impnb.gemm"):
        for n in (300, 512, 257, 300):
            md.choose(T.Q4_K, 1536, 2048, n, TABLE)
        md.choose(T.Q4_K, 1536, 2048, 100, TABLE)
    assert [r.getMessage() for r in caplog.records] == [
        "moe Q4_K 1536x2048 T<=512: cublas (table)",
        "moe Q4_K 1536x2048 T<=128: tiles (default)"]


def test_committed_table_is_valid():
    table = md.load_table()
    for key, by_t in table.items():
        _, name, shape = key.split()
        assert T[name] and all(int(v) > 0 for v in shape.split("x"))
        assert all(choice in md.PATHS for choice in by_t.values())


@pytest.mark.parametrize("choices", [
    {"moe Q4_K 1536x2048": {"48": "tiles"}},            # not a bucket
    {"moe Q4_K 1536x2048": {"64": "tiles_bm64"}},       # a dense path, not an expert one
    {"Q4_K 1536x2048": {"64": "cublas"}},               # not a moe key
    {"moe Q9_Z 1536x2048": {"64": "cublas"}},           # no such type
    {"moe Q4_K 1536by2048": {"64": "cublas"}},          # no shape
    {"moe Q4_K 1536x2048": {"4": "tiles"}},             # below the 8 bucket
    {"moe Q4_K 1536x2048": ["tiles"]},                  # not buckets
    "not json",
])
def test_bad_table_rejected(tmp_path, choices):
    path = tmp_path / "t.json"
    path.write_text(choices if isinstance(choices, str) else json.dumps({"choices": choices}))
    with pytest.raises(ParameterError, match="tuning table"):
        md.load_table.__wrapped__(path)


def test_table_with_the_eight_bucket_read(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"choices": {"moe Q4_K 2048x768": {"8": "gemv1s8u1r8", "16": "mmq"}}}))
    assert md.load_table.__wrapped__(path) == {"moe Q4_K 2048x768": {"8": "gemv1s8u1r8", "16": "mmq"}}


def test_table_read_from_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"choices": TABLE}))
    assert md.choose(T.Q4_K, 1536, 2048, 256, md.load_table.__wrapped__(path)) == "cublas"


def test_wgmma_only_where_it_takes_the_weight():
    """A table's "wgmma" runs where gemm_grouped_wgmma takes the type and K (a quantized type, K a
    multiple of 64 and of its block), else the tiles."""
    table = {"moe MXFP4 1536x2048": {"512": "wgmma"}, "moe Q4_K 2048x704": {"512": "wgmma"},
             "moe F16 1536x2048": {"512": "wgmma"}, "moe Q8_0 704x96": {"512": "wgmma"}}
    assert md.choose(T.MXFP4, 1536, 2048, 512, table) == "wgmma"
    assert md.choose(T.Q4_K, 2048, 704, 512, table) == "tiles"   # K not a multiple of 256
    assert md.choose(T.F16, 1536, 2048, 512, table) == "tiles"   # not a quantized type
    assert md.choose(T.Q8_0, 704, 96, 512, table) == "tiles"     # K not a multiple of 64


class W:
    """What ffn_paths reads of a PackedWeight."""

    def __init__(self, ggml_type, rows, cols):
        self.ggml_type, self.rows, self.cols = ggml_type, rows, cols


GEMV_TABLE = {"moe Q4_K 1536x2048": {"16": "gemv4s32u2r4", "32": "gemv8s32u1r2", "64": "wgmma"},
              "moe Q6_K 2048x768": {"16": "gemv2s32u1r8", "32": "tiles", "64": "gemv8s64u1r2"},
              "moe Q4_0 2048x96": {"16": "gemv2s32u1r4"}}


def test_ffn_paths_gemv_only_for_the_whole_layer():
    E = 4
    gate_up, down = W(T.Q4_K, E * 1536, 2048), W(T.Q6_K, E * 2048, 768)
    assert md.ffn_paths((gate_up, down), E, 9, GEMV_TABLE) == ["gemv4s32u2r4", "gemv2s32u1r8"]  # tiles differ
    assert md.ffn_paths((gate_up, down), E, 9, GEMV_TABLE, gemv=False) == ["wgmma", "wgmma"]
    assert md.ffn_paths((gate_up, down), E, 32, GEMV_TABLE) == ["wgmma", "tiles"]  # down not a GEMV there
    assert md.ffn_paths((gate_up, down), E, 64, GEMV_TABLE) == ["wgmma", "wgmma"]
    gate, up = W(T.Q4_K, E * 768, 2048), W(T.Q4_K, E * 768, 2048)  # not stacked: no GEMV
    table = {"moe Q4_K 768x2048": {"16": "gemv2s32u1r4"}, **GEMV_TABLE}
    assert md.ffn_paths((gate, up, down), E, 9, table) == ["wgmma", "wgmma", "wgmma"]
    # a row length the K-quant GEMV cannot take (96 % 256) falls back to the tiles' default
    assert md.choose(T.Q4_0, 2048, 96, 9, GEMV_TABLE) == "gemv2s32u1r4"
    assert md.choose(T.Q4_K, 2048, 96, 9, {"moe Q4_K 2048x96": {"16": "gemv2s32u1r4"}}) == "tiles"


def test_gemv_paths():
    n, v = md.GEMV_PATHS["gemv8s64u1r2"]
    assert n == 8 and (v.span, v.unroll, v.rows) == (64, 1, 2)
    assert all(p == f"gemv{n}{v.name}" and n in md.GEMV_TOKENS for p, (n, v) in md.GEMV_PATHS.items())
    assert all(v.rows % 2 == 0 for _, v in md.GEMV_PATHS.values())  # gate|up: gate and up rows in pairs
    assert set(md.INT8_PATHS) <= set(md.PATHS) and md.tile_tokens(md.MMQ) == 8
    assert md.tile_tokens("gemv4s32u1r4") == 4


def test_ffn_paths_mixes_int8_paths():
    E = 4
    gate_up, down = W(T.Q4_K, E * 1536, 2048), W(T.Q6_K, E * 2048, 768)
    table = {"moe Q4_K 1536x2048": {"16": "mmq", "32": "mmq"},
             "moe Q6_K 2048x768": {"16": "gemv2s32u1r8", "32": "wgmma"}}
    assert md.ffn_paths((gate_up, down), E, 9, table) == ["mmq", "gemv2s32u1r8"]
    assert md.ffn_paths((gate_up, down), E, 32, table) == ["wgmma", "wgmma"]
    # the int8 GEMM takes Q4_K / Q6_K at K % 256 and Q8_0 at K % 128 only
    assert md.choose(T.Q4_0, 2048, 256, 9, {"moe Q4_0 2048x256": {"16": "mmq"}}) == "tiles"
    assert md.choose(T.Q8_0, 2048, 384, 9, {"moe Q8_0 2048x384": {"16": "mmq"}}) == "mmq"


@pytest.mark.parametrize("buckets", ["x,16", "0,16", ""])
def test_tune_moe_rejects_bad_buckets(buckets):
    """scripts/tune_moe.py --buckets takes token counts of at least 1: anything else one usage
    line and exit 2, before any GPU work."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "tune_moe.py"
    out = subprocess.run([sys.executable, str(script), "--buckets", buckets], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "--buckets" in out.stderr.splitlines()[-1] and "Traceback" not in out.stderr
