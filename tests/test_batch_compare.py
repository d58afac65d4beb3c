"""scripts/batch_compare.py on logs in each tool's format: the rows read, the ratios, the missing B."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

import batch_compare  # noqa: E402

IMPNB = """\
impnb: bench: B=1 S_PP 3000.0 S_TG 500.0 tok/s
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s |  S_TG t/s |
|-------|--------|------|--------|----------|----------|----------|-----------|
|   128 |    128 |    1 |    256 |    0.040 |   3200.0 |    0.245 |     523.4 |
|   128 |    128 |    8 |   2048 |    0.117 |   8737.9 |    0.624 |    1641.7 |
|   128 |    128 |   64 |  16384 |    0.900 |   9100.2 |    1.970 |    4153.5 |
"""

LLAMA = """\
main: n_kv_max = 33024, n_batch = 2048, n_ubatch = 512, flash_attn = 1
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |    128 |    1 |    256 |    0.021 |  6095.24 |    0.438 |   292.30 |    0.459 |   557.73 |
|   128 |    128 |    8 |   2048 |    0.150 |  6826.67 |    1.128 |   907.40 |    1.278 |  1602.50 |
|   128 |    128 |   16 |   4096 |    0.300 |  6826.67 |    2.300 |   890.60 |    2.600 |  1575.38 |
"""


def test_rows_of_both_formats():
    ours, theirs = batch_compare.rows(IMPNB), batch_compare.rows(LLAMA)
    assert sorted(ours) == [1, 8, 64] and ours[8] == {"pp": 128, "tg": 128, "s_pp": 8737.9, "s_tg": 1641.7}
    assert sorted(theirs) == [1, 8, 16] and theirs[16]["s_tg"] == 890.6


def test_table_ratios_and_missing(tmp_path, capsys):
    a, b = tmp_path / "impnb.log", tmp_path / "llama.log"
    a.write_text(IMPNB)
    b.write_text(LLAMA)
    assert batch_compare.main(["--impnb", str(a), "--llama", str(b), "--label", "30B", "--json", str(tmp_path / "r.json")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 30B |")]
    cells = {int(c[1]): c for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in lines)}
    assert sorted(cells) == [1, 8, 16, 64]
    assert cells[8][2:] == ["1641.7", "907.4", "1.81x", "1815"]
    assert cells[16][2] == "-" and cells[16][4] == "-" and cells[64][3] == "-"
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [r["B"] for r in rows] == [1, 8, 16, 64] and abs(rows[0]["ratio"] - 523.4 / 292.3) < 1e-12


def test_no_rows_exits_1(tmp_path):
    empty = tmp_path / "none.log"
    empty.write_text("impnb: error: no GPU\n")
    assert batch_compare.main(["--impnb", str(empty)]) == 1
