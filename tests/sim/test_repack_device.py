"""kernels/common/repack_device.py in numba's CUDA simulator: the device's split equals
repack.repack byte for byte (padding included) for every packed type, and split_blocks writes
exactly its part."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.common.repack import PACKED_TYPES, repack
from impnb.kernels.common.repack_device import repack_on_device, split_blocks
from tests.test_repack import make_weight

K_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K)


@pytest.mark.parametrize("ggml_type", PACKED_TYPES, ids=lambda t: t.name)
def test_repack_on_device_equals_host_repack(ggml_type):
    cols = 256 if ggml_type in K_TYPES else 64
    for rows in (1, 3):
        raw = make_weight(ggml_type, rows, cols, np.random.default_rng([int(ggml_type), rows]))
        want = repack(raw, ggml_type)
        got = repack_on_device(raw, ggml_type, cuda.stream())
        assert (got.rows, got.cols, got.ggml_type) == (rows, cols, ggml_type)
        assert np.array_equal(got.buffer.copy_to_host(), want.buffer)
        for g, w in zip(got.parts, want.parts):
            assert g.dtype == w.dtype and np.array_equal(g.copy_to_host(), w)


def test_split_blocks_writes_its_part_only():
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, 7 * 34, dtype=np.uint8)
    dst = np.full(300, 0xAB, np.uint8)  # poison: every byte outside the part must stay
    d_dst = cuda.to_device(dst)
    split_blocks(cuda.to_device(src), d_dst, 7, 34, 2, 32, 19, cuda.stream())
    want = dst.copy()
    want[19:19 + 7 * 32] = src.reshape(7, 34)[:, 2:].reshape(-1)
    assert np.array_equal(d_dst.copy_to_host(), want)
