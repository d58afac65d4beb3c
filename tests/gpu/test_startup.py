"""Start-up on the GPU: a cuda generate makes numba dispatchers only for the kernels it builds
(none for the variants and tables it never launches), and its greedy text equals the
single-token-per-step engine's with graphs off (the lazily captured graphs change nothing)."""

import os
import subprocess
import sys

import pytest

from tests.test_startup import COUNT_DISPATCHERS

pytestmark = pytest.mark.gpu

PROMPT = "The Eiffel Tower is located in the city of"
_PROBE = COUNT_DISPATCHERS + """
from impnb.cli import main
code = main(sys.argv[1:])
kernels = sorted(m for m in sys.modules if m.startswith("impnb.kernels."))
print(json.dumps([code, len(made), kernels]), file=sys.stderr)
"""


def _generate(model, *extra):
    argv = ["generate", PROMPT, "-m", str(model), "-n", "16", "--temperature", "0", "--device", "cuda", *extra]
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    import json

    code, made, kernels = json.loads(proc.stderr.strip().splitlines()[-1])
    assert code == 0, proc.stderr[-2000:]
    return proc.stdout, made, kernels


@pytest.mark.parametrize("name", ["gemma3", "smollm2"])
def test_cuda_generate_makes_only_the_dispatchers_it_uses(name, request):
    path = request.getfixturevalue(f"{name}_path")
    _generate(path)  # fills the kernel cache where it is cold
    text, made, kernels = _generate(path)
    eager, _, _ = _generate(path, "--no-graphs")
    print(f"{name}: {made} dispatchers, {len(kernels)} kernel modules; {text!r}")
    assert text.strip() and text == eager
    assert made < 1500  # the kernels one model launches, with their device functions
    assert not any(m.startswith("impnb.kernels.deltanet") for m in kernels)
