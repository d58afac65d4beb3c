"""The prefill GEMM dispatch (impnb/gpu/gemm_dispatch.py) on the CPU: buckets, table lookup, the
cuBLAS default, one log line per distinct choice, and the committed table's validity."""

import json
import logging

import pytest
from gguf import GGMLQuantizationType as T

from impnb.errors import ParameterError

from impnb.gpu import gemm_dispatch as gd

TABLE = {"Q8_0 1536x576": {"64": "tiles_bm64", "512": "tiles_bm128"}}


@pytest.mark.parametrize("M,want", [(9, 16), (16, 16), (17, 32), (300, 512), (512, 512), (4096, 512)])
def test_m_buckets(M, want):
    assert gd.m_bucket(M) == want


def test_table_hit_and_default():
    assert gd.choose(T.Q8_0, 1536, 576, 40, TABLE) == "tiles_bm64"
    assert gd.choose(T.Q8_0, 1536, 576, 511, TABLE) == "tiles_bm128"
    assert gd.choose(T.Q8_0, 1536, 576, 20, TABLE) == "cublas"    # bucket not measured a win
    assert gd.choose(T.Q4_K, 1536, 576, 40, TABLE) == "cublas"    # another type
    assert gd.choose(T.Q8_0, 576, 1536, 40, TABLE) == "cublas"    # another shape


def test_each_choice_logged_once(caplog):
    gd._logged.clear()
    with caplog.at_level(logging.DEBUG, logger="impnb.gemm"):
        for M in (40, 50, 64, 40):
            gd.choose(T.Q8_0, 1536, 576, M, TABLE)
        gd.choose(T.Q8_0, 1536, 576, 9, TABLE)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["gemm Q8_0 1536x576 M<=64: tiles_bm64 (table)",
                     "gemm Q8_0 1536x576 M<=16: cublas (default)"]


def test_committed_table_is_valid():
    table = gd.load_table()
    for key, by_m in table.items():
        name, shape = key.split()
        assert T[name] and all(int(v) > 0 for v in shape.split("x"))
        assert all(choice in gd.PATHS and choice != "cublas" for choice in by_m.values())


def test_bad_table_rejected(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"choices": {"Q8_0 8x32": {"48": "tiles_bm64"}}}))
    with pytest.raises(ParameterError, match="tuning table"):
        gd.load_table.__wrapped__(path)


def test_splits_for():
    from impnb.kernels.gemm.gemm_quant_splitk import splits_for

    assert splits_for(16, 4096, 4096) == 9  # 32 tiles: splits for two blocks an SM of 132
    assert splits_for(256, 24576, 4096) == 1  # 768 tiles fill the GPU
    assert splits_for(16, 128, 512) == 2  # at least 8 chunks a split


def test_few_only_where_its_k_granularity_holds():
    """A table's "few" for a width that is not a multiple of gemm_few's groups falls back to cuBLAS."""
    from impnb.kernels.gemm import gemm_few

    table = {"Q8_0 1536x576": {"16": "few"}, "Q8_0 1536x640": {"16": "few"}}
    assert gd.FEW_K == gemm_few.GROUP
    assert gd.choose(T.Q8_0, 1536, 576, 16, table) == "cublas"
    assert gd.choose(T.Q8_0, 1536, 640, 16, table) == "few"
    assert gemm_few.supports(T.Q8_0, 640) and not gemm_few.supports(T.Q8_0, 576)


def test_few_splits_for():
    from impnb.kernels.gemm.gemm_few import mt_for, splits_for

    assert [mt_for(M) for M in (9, 16, 17, 32, 33, 64, 65, 256)] == [1, 1, 2, 2, 4, 4, 4, 4]
    assert splits_for(16, 4096, 4096) == 9  # 32 blocks of 128 rows: about two an SM of 132
    assert splits_for(16, 151936, 4096) == 1  # 1187 blocks fill the GPU
    assert splits_for(16, 1024, 4096) == 16  # at least two groups of 128 columns a split


def test_mmq_splits_fill_one_wave(monkeypatch):
    """gemm_mmq's splits: one wave of the build's resident blocks (the 8B's shapes at 16 and 32
    rows, where it measured fastest), the W ring's fewer registers holding more; at least two K
    groups a split; without a type (the pair) the two-blocks-an-SM rule."""
    from gguf import GGMLQuantizationType as T

    from impnb.kernels.gemm import gemm_mmq as g

    assert [g.blocks_per_sm(T.Q4_K, ni, mt) for ni, mt in ((1, 1), (2, 1), (2, 2), (4, 1))] == [5, 4, 3, 3]
    assert [g.blocks_per_sm(T.Q4_K, ni, mt, True) for ni, mt in ((1, 1), (2, 1), (2, 2), (4, 1))] == [7, 5, 4, 4]
    assert g.blocks_per_sm(T.Q6_K, 2, 2) == 2
    q4 = dict(ggml_type=T.Q4_K, ring=False)
    assert g.splits_for(16, 24576, 4096, **q4) == 2    # 192 blocks of 128 rows, 396 slots
    assert g.splits_for(16, 4096, 12288, **q4) == 8    # 64 blocks of 64 rows, 528 slots
    assert g.splits_for(16, 6144, 4096, **q4) == 5
    assert g.splits_for(32, 4096, 12288, **q4) == 6    # four token tiles: 132 registers, 396 slots
    assert g.splits_for(32, 4096, 12288, ggml_type=T.Q4_K, ring=True) == 8  # 117 registers, 528 slots
    assert g.splits_for(32, 24576, 4096, **q4) == 1    # 384 blocks fill the wave
    assert g.splits_for(8, 1024, 1024, **q4) == 4      # at least two groups a split
    assert g.splits_for(16, 4096, 12288) == 5          # the pair's rule
    monkeypatch.setattr(g.tuning, "MMQ_WAVE_SPLITS", False)
    assert g.splits_for(16, 4096, 12288, **q4) == 5


INF = float("inf")


def _times(cublas, **own):
    return {p: own.get(p, INF) for p in gd.PATHS} | {"cublas": cublas}


@pytest.mark.parametrize("us,M,want", [
    (_times(10.0, few=9.0), 512, "few"),              # wins by more than the margin
    (_times(10.0, few=9.8), 512, "cublas"),           # within the margin: cuBLAS
    (_times(10.0, few=9.8, splitk=9.5), 512, "splitk"),  # the fastest of impnb's paths
    (_times(10.0, few=15.0), 32, "few"),              # a short chunk: within GEMM_SHORT_FACTOR
    (_times(10.0, few=15.0), 64, "cublas"),           # past GEMM_SHORT_ROWS
    (_times(10.0, few=17.0), 16, "cublas"),           # short, but too slow
    (_times(10.0), 16, "cublas"),                     # no path of impnb's runs the shape
])
def test_table_choice(us, M, want):
    """What tune_gemm writes for one (shape, bucket) from its times."""
    assert gd.table_choice(us, M) == want


def test_tune_gemm_from_json(tmp_path):
    """tune_gemm --from-json rebuilds an earlier run's choices with no GPU and merges them into the
    table: the measured shapes' buckets replaced, another shape's entries kept."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    out, rows = tmp_path / "table.json", tmp_path / "rows.json"
    out.write_text(json.dumps({"note": "", "gpu": "GPU X", "models": "a",
                               "choices": {"Q4_K 640x1024": {"16": "wgmma", "64": "few"},
                                           "Q8_0 8x32": {"16": "splitk"}}}))
    rows.write_text(json.dumps([
        dict(model="b", shape="Q4_K 640x1024", M=16, us=_times(6.9, few=8.7, wgmma=18.5), chosen="cublas"),
        dict(model="b", shape="Q4_1 960x576", M=16, us=_times(6.1, splitk=12.6), chosen="cublas"),
    ]))
    proc = subprocess.run([sys.executable, str(root / "scripts" / "tune_gemm.py"), "--from-json", str(rows),
                           "--gpu", "GPU X", "--out", str(out)], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stderr
    table = json.loads(out.read_text())
    assert table["models"] == "a,b"
    assert table["choices"] == {"Q4_K 640x1024": {"16": "few", "64": "few"}, "Q8_0 8x32": {"16": "splitk"}}
