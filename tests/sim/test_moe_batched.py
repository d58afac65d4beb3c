"""The cuBLAS fallback's gather and pointer kernels in numba's CUDA simulator on tiny shapes, through
tests/gpu/test_moe_batched.py's checks."""

import numpy as np

from tests.gpu import test_moe_batched as mb


def test_gather():
    rng = np.random.default_rng(0)
    mb.check_gather(rng, 5, 8, 2, 8)
    mb.check_gather(rng, 3, 8, 2, 12, kind="empty")
    mb.check_gather(rng, 70, 4, 1, 4, kind="same")  # one expert over two tiles


def test_pointers():
    rng = np.random.default_rng(1)
    mb.check_pointers(rng, 3, 7, 8)
    mb.check_pointers(rng, 0, 2, 8)
    mb.check_pointers(rng, 5, 5, 8)


def test_experts_prefill_grouped():
    """gpu/moe_prefill.py's grouped layout (every matrix on the tiles) against the references."""
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType as T

    from impnb.gpu.buffers import Arena
    from impnb.gpu.context import GpuContext

    ctx = GpuContext()
    dev = SimpleNamespace(ctx=ctx, arena=Arena(ctx), cublas=None)
    rng = np.random.default_rng(2)
    experts = mb.Experts(dev, rng, (T.Q8_0,), T.Q8_0, E=4, D=32, F=32)
    mb.check_case(dev, experts, rng, 3, 2, "empty", 1.0, mixes=[("tiles", "tiles")])
