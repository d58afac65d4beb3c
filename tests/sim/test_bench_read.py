"""bench_gemv.py's plain-read kernel reads every 16-byte chunk exactly once: the xor of its
per-thread results equals the xor of all words (a chunk skipped or read twice changes it), for
sizes with and without a tail past the whole rounds."""

import sys
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))

from bench_gemv import read_kernel  # noqa: E402


@pytest.mark.parametrize("U,grid,threads,n16", [(2, 2, 32, 1000), (4, 1, 32, 130), (2, 3, 32, 64),
                                                (4, 2, 32, 256)])
def test_read_kernel_reads_every_chunk_once(U, grid, threads, n16):
    a = np.random.default_rng(n16).integers(0, 2 ** 32, 4 * n16, dtype=np.uint64).astype(np.uint32)
    out = cuda.to_device(np.zeros(grid * threads, np.uint32))
    read_kernel(U)[grid, threads](cuda.to_device(a), n16, out)
    assert np.bitwise_xor.reduce(out.copy_to_host()) == np.bitwise_xor.reduce(a)
