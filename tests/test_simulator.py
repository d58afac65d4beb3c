"""Run tests/sim/ under numba's CUDA simulator, a subprocess per file (the simulator is chosen at
import). One item per file lets pytest-xdist spread them over the workers: conftest.py starts them
before everything else."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SIM_DIR = Path(__file__).parent / "sim"
SIM_FILES = sorted(p.name for p in SIM_DIR.glob("test_*.py"))


def test_there_are_simulator_files():
    assert SIM_FILES


@pytest.mark.parametrize("name", SIM_FILES)
def test_kernels_in_the_cuda_simulator(name):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    # every CUDA thread is a Python thread: the slowest file takes minutes
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(SIM_DIR / name)],
                          env=env, capture_output=True, text=True, timeout=3000, cwd=SIM_DIR.parents[1])
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stdout[-4000:]
