"""The weights' split into the kernels' layout on the GPU (repack_device.py) equals the numpy
repack byte for byte, padding included: every packed type at odd sizes, and real model tensors."""

import numpy as np
import pytest
from numba import cuda

from impnb.gguf_file import open_model_file
from impnb.kernels.common.repack import PACKED_TYPES, repack
from impnb.kernels.common.repack_device import repack_on_device, split_blocks
from tests.conftest import real_model_path
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu


def check_equal(raw, ggml_type):
    want = repack(raw, ggml_type)
    stream = cuda.stream()
    got = repack_on_device(raw, ggml_type, stream)
    assert (got.rows, got.cols) == (want.rows, want.cols)
    assert np.array_equal(got.buffer.copy_to_host(), want.buffer)
    for g, w in zip(got.parts, want.parts):
        assert g.dtype == w.dtype and g.shape == w.shape


@pytest.mark.parametrize("ggml_type", PACKED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,cols", [(1, 256), (19, 512), (111, 768), (4099, 2048)])
def test_repack_on_device_equals_host(ggml_type, rows, cols):
    for std in (0.1, 1.0, 10.0):
        check_equal(make_weight(ggml_type, rows, cols, np.random.default_rng([int(ggml_type), rows, int(std * 10)]), std),
                    ggml_type)


@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_real_tensors(model):
    mf = open_model_file(real_model_path(model))
    seen = set()
    for name, t in mf.tensors.items():
        if len(t.shape) == 2 and t.ggml_type in PACKED_TYPES and (t.ggml_type not in seen or "token_embd" in name):
            seen.add(t.ggml_type)
            check_equal(t.data, t.ggml_type)
    assert seen


def test_split_blocks_poisoned_destination():
    rng = np.random.default_rng(5)
    n_blocks, size = 100003, 210  # past one grid row of blocks; Q6_K's block size
    src = rng.integers(0, 256, n_blocks * size, dtype=np.uint8)
    dst = np.full(n_blocks * 16 + 999, 0xAB, np.uint8)
    d_dst = cuda.to_device(dst)
    split_blocks(cuda.to_device(src), d_dst, n_blocks, size, 192, 16, 999, 0)
    cuda.synchronize()
    want = dst.copy()
    want[999:] = src.reshape(n_blocks, size)[:, 192:208].reshape(-1)
    assert np.array_equal(d_dst.copy_to_host(), want)
