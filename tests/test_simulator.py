"""Run tests/sim/ under numba's CUDA simulator in subprocesses (the simulator is chosen at import).

The files that take minutes there run alone, so that pytest-xdist's workers can share them out
(conftest.py starts them before everything else); the others, seconds each, share one subprocess
(a start is ~3 s of CPU)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SIM_DIR = Path(__file__).parent / "sim"
SIM_FILES = sorted(p.name for p in SIM_DIR.glob("test_*.py"))
ALONE = ("test_attention.py", "test_attention_fa2.py")  # minutes of CPU each: alone, so two workers share them
GROUPS = {name: [name] for name in ALONE} | {"rest": [name for name in SIM_FILES if name not in ALONE]}


def test_the_groups_hold_every_file():
    assert set(ALONE) <= set(SIM_FILES)
    assert sorted(sum(GROUPS.values(), [])) == SIM_FILES


@pytest.mark.parametrize("group", GROUPS)
def test_kernels_in_the_cuda_simulator(group):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    # every CUDA thread is a Python thread: minutes a group on a 2-core machine
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *(str(SIM_DIR / name) for name in GROUPS[group])],
                          env=env, capture_output=True, text=True, timeout=3000, cwd=SIM_DIR.parents[1])
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stdout[-4000:]
