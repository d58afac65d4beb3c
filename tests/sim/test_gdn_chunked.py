"""The chunked Gated DeltaNet prefill in the CUDA simulator: the GPU test's checks at small sizes
(dk 32, dv 32; chunks of 16 tokens, one diagonal block of the solve, and of 64, four; tiled and
grouped V heads)."""

import numpy as np

from tests.gpu.test_deltanet_kernels import Layer
from tests.gpu.test_gdn_chunked import check_chunked, check_chunked_split

SMALL = dict(Hk=1, Hv=2, dk=32, dv=32)
GROUPED = dict(Hk=1, Hv=2, dk=32, dv=32, v_tiled=False)


def test_gdn_chunked_odd_lengths():
    for i, (T, std) in enumerate(((1, 1.0), (19, 0.1), (33, 10.0))):
        rng = np.random.default_rng([T, i])
        check_chunked(rng, Layer.random(rng, **(SMALL if i != 1 else GROUPED)), 1, T, std, chunk=16)


def test_gdn_chunked_blocks_of_the_solve():
    """Chunks of 64: the solve's off-diagonal block rows; 66 tokens end in a chunk of 2."""
    rng = np.random.default_rng(66)
    check_chunked(rng, Layer.random(rng, Hk=1, Hv=1, dk=32, dv=32), 1, 66, 1.0, chunk=64)


def test_gdn_chunked_lengths_pairs_and_splits():
    rng = np.random.default_rng(3)
    layer = Layer.random(rng, **SMALL)
    check_chunked(rng, layer, 2, 17, 1.0, chunk=16, lengths=np.array([17, 5], np.int32), with_pos=True)
    check_chunked(rng, layer, 2, 3, 1.0, chunk=16, padded=True)
    check_chunked_split(rng, layer, 18, (3,), 1.0, chunk=16)
