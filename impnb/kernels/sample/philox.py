"""Philox4x32-10 counter-based random numbers for the sampling kernels, with numpy twins
(Random123's philox4x32_R on 32-bit words held in int64s). The sampler's draw is one uniform at
key = seed, counter = (step, row, 0, 0).
"""

import numpy as np
from numba import cuda

MASK32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85


@cuda.jit(device=True, inline="always")
def _mulhilo(a, m):
    p = np.uint64(a) * np.uint64(m)
    return np.int64(p >> np.uint64(32)), np.int64(p & np.uint64(MASK32))


@cuda.jit(device=True, inline="always")
def _philox4x32(c0, c1, c2, c3, k0, k1, rounds):
    """Random123's philox4x32_R on 32-bit words held in int64s (values in [0, 2^32))."""
    for r in range(rounds):
        if r > 0:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


@cuda.jit(device=True, inline="always")
def philox_uniform(seed_lo, seed_hi, seq, step):
    """A float64 in [0, 1) from 53 bits of Philox4x32-10 at counter (step, seq, 0, 0)."""
    x0, x1, _, _ = _philox4x32(step, seq, 0, 0, seed_lo, seed_hi, 10)
    return ((x0 >> 5) * 67108864 + (x1 >> 6)) * (1.0 / 9007199254740992.0)


def philox4x32_ref(counter, key, rounds: int = 10) -> np.ndarray:
    """Philox4x32-R: counter (..., 4) and key (..., 2) uint32 words -> (..., 4) uint32."""
    c = [np.asarray(counter, np.uint64)[..., i] for i in range(4)]
    k0, k1 = (np.asarray(key, np.uint64)[..., i] for i in range(2))
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
        p0, p1 = c[0] * np.uint64(PHILOX_M0), c[2] * np.uint64(PHILOX_M1)
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & MASK32, (p0 >> 32) ^ c[3] ^ k1, p0 & MASK32]
    return np.stack(c, -1).astype(np.uint32)


def uniform_ref(seed: int, seq: int, step: int) -> float:
    """The kernel's uniform for sequence `seq` at `step`."""
    x = philox4x32_ref([step & MASK32, seq, 0, 0], [seed & MASK32, (seed >> 32) & MASK32])
    return ((int(x[0]) >> 5) * 2**26 + (int(x[1]) >> 6)) / 2**53
