"""A first start on the GPU (an empty kernel cache): `generate` builds the prompt's kernels, prints
its tokens while the decode step's compile behind them, waits for those before it exits and
writes the manifest; its tokens equal a start that compiles each kernel at its first launch and
a warm start's, which compiles nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from impnb.synthetic_full import Shape, write_full_gguf

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _generate(model: Path, cache: Path, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "impnb", "generate", "The capital of France is", "-m", str(model), "-n", "12",
           "--temperature", "0", "--device", "cuda"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, IMPNB_CACHE_DIR=str(cache), **env))


def test_first_start_prints_the_same_tokens_and_leaves_a_warm_cache(tmp_path):
    model = tmp_path / "qwen3.gguf"
    write_full_gguf(model, Shape("qwen3", 2, 256, 512, 4, 2, 64, 512), "Q8_0")
    each = _generate(model, tmp_path / "each", IMPNB_PRECOMPILE="0")
    cold = _generate(model, tmp_path / "cold")
    warm = _generate(model, tmp_path / "cold")
    for run in (each, cold, warm):
        assert run.returncode == 0, run.stderr[-2000:]
    assert "compiling kernels" in cold.stderr and "compiling kernels" not in each.stderr
    assert "compiling" not in warm.stderr and "finishing" not in warm.stderr
    assert list((tmp_path / "cold").glob("manifest-*.json"))
    assert cold.stdout == each.stdout == warm.stdout
    assert cold.stdout.strip()
