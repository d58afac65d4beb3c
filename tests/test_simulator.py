"""Run tests/sim/ under numba's CUDA simulator, in a subprocess (the simulator is chosen at import)."""

import os
import subprocess
import sys
from pathlib import Path

SIM_DIR = Path(__file__).parent / "sim"


def test_kernels_in_the_cuda_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    # about 17 minutes on a 2-core machine (2026-11-23): every CUDA thread is a Python thread
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SIM_DIR)],
                          env=env, capture_output=True, text=True, timeout=3000,
                          cwd=SIM_DIR.parents[1])
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stdout[-4000:]
