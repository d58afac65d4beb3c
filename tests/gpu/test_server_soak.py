"""The server soak on the GPU (scripts/soak_serve.py): 1000 requests at concurrency 64 of random
lengths, 5% of clients leaving mid-stream, 5% malformed; afterwards every KV block is free, the
server answers, RSS and GPU memory are back to their warmed-up level, SIGTERM exits 0."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
pytest.importorskip("fastapi")  # the serve extra (impnb[serve]); the server needs it
pytest.importorskip("uvicorn")

SCRIPT = Path(__file__).parents[2] / "scripts" / "soak_serve.py"


def test_server_soak(smollm2_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "-m", str(smollm2_path), "--device", "cuda"],
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "soak: passed" in proc.stdout
