"""impnb.quants' own table of the supported GGML types agrees with the gguf package's, and
reading a header (`impnb info`) does not import gguf."""

import json
import subprocess
import sys

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from impnb.errors import UnsupportedError
from impnb.quants import FORMATS, SUPPORTED, TypeId, quant_format


def test_table_agrees_with_gguf():
    for type_id, (name, block, size) in SUPPORTED.items():
        assert T(type_id).name == name
        assert GGML_QUANT_SIZES[T(type_id)] == (block, size)
        assert getattr(TypeId, name) == T[name]
        fmt = FORMATS[type_id]
        assert fmt.ggml_type is T[name] and FORMATS[T[name]] is fmt and fmt.name == name


def test_unsupported_and_unknown_types_keep_their_messages():
    with pytest.raises(UnsupportedError, match="GGML type Q8_1 is not supported"):
        quant_format(int(T.Q8_1), "w")
    with pytest.raises(UnsupportedError, match="unknown GGML type id 9999"):
        quant_format(9999, "w")


def test_info_imports_no_gguf(smollm2_path):
    probe = ("import json, sys\nfrom impnb.cli import main\ncode = main(sys.argv[1:])\n"
             "print(json.dumps([code, 'gguf' in sys.modules]), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe, "info", str(smollm2_path)], capture_output=True,
                          text=True, timeout=300)
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == [0, False], proc.stderr
