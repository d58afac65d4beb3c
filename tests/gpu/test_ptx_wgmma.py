"""Layout probe for attention's wgmma forms (ptx_wgmma.MMA_FIRST and MMA_RS with an MN-major B):
every thread's accumulators against the PTX ISA.

Transcribed from the PTX ISA: the 128-byte swizzle (16-byte chunk ch of a 128-byte row r stored
at chunk ch ^ (r & 7), 8-row groups 1024 bytes apart), K-major (a row per m or n, k along it)
and MN-major (a row per k, 64 n values along it, 64-wide n blocks LBO bytes apart) layouts; the
register-A fragment of warp w (mma.sync m16n8k16's A layout, rows 16 w ..); the accumulators
("Register fragment of wgmma D, .f32": thread 32 w + 4 g + c, register i at row
16 w + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 c + (i & 1)). Gaussian operands rounded to
fp16 or bf16: a misplaced element costs O(1), far above the fp32 summation bound. (No simulator
twin: wgmma needs an sm_90a GPU.)
"""

import numpy as np
import pytest
from numba import cuda

from tests.probes import ptx_wgmma_probe as probe
from tests.gpu.test_ptx import a_frag, bits16, from16

pytestmark = pytest.mark.gpu


def swizzled(mat16, row_of, col_of, n_bytes):
    """uint32 words of a 128-byte-swizzled shared image holding 16-bit values mat16[i, j] at
    byte row_of(i, j) * 128 + chunk (col_of(i, j) // 8 ^ row & 7) * 16 + (col_of % 8) * 2, where
    row_of may run past one tile (its caller adds the block offset in rows)."""
    img = np.zeros(n_bytes // 2, np.uint16)
    for (i, j), v in np.ndenumerate(mat16):
        r, c = row_of(i, j), col_of(i, j)
        img[r * 64 + (((c // 8) ^ (r & 7)) * 8) + c % 8] = v
    return img.view(np.uint32)


def acc_map(n):
    """(128, n / 2, 2): the (row, column) of each thread's accumulator register."""
    t = np.arange(128)[:, None]
    i = np.arange(n // 2)[None, :]
    w, g, c = t >> 5, (t >> 2) & 7, t & 3
    return np.stack(np.broadcast_arrays(16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * c + (i & 1)), -1)


def check(got, want, bound, rows, cols, what):
    """got, want, bound (128, n / 2) per thread and register; rows, cols: acc_map's."""
    bad = ~(np.abs(got - want) <= bound)
    if bad.any():
        t, i = (int(x) for x in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} wrong, first thread {t} register {i} "
                             f"(row {rows[t, i]}, col {cols[t, i]}): {got[t, i]} against {want[t, i]}")


@pytest.mark.parametrize("n", [64, 128])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_wgmma_first_and_rs(dtype, n):
    rng = np.random.default_rng([n, len(dtype)])
    rnd = lambda *shape: bits16(rng.standard_normal(shape), dtype)  # noqa: E731
    a1, b1, a2, b2 = rnd(64, 16), rnd(n, 16), rnd(64, 16), rnd(16, n)
    c2 = rng.standard_normal((64, n)).astype(np.float32)
    # K-major images: a row per m (A) or n (B), k 0..15 in its first two chunks
    sa = swizzled(a1, lambda i, j: i, lambda i, j: j, 64 * 128)
    sb = swizzled(b1, lambda i, j: i, lambda i, j: j, n * 128)
    # MN-major B: a row per k, n block j // 64 of 16 rows (probe.MN_BLOCK bytes) after the one before
    smn = swizzled(b2, lambda i, j: 16 * (j // 64) + i, lambda i, j: j % 64, n // 64 * probe.MN_BLOCK)
    a_regs = np.zeros((128, 4), np.uint32)
    for t in range(128):
        for reg, half, r, col in a_frag(t & 31):
            a_regs[t, reg] |= np.uint32(a2[16 * (t >> 5) + r, col]) << np.uint32(16 * half)
    rows, cols = acc_map(n)[..., 0], acc_map(n)[..., 1]
    out = [cuda.to_device(np.full((128, n // 2), np.nan, np.float32)) for _ in range(2)]
    probe.wgmma_probe(n, dtype)[1, 128](*(cuda.to_device(x) for x in (sa, sb, smn, a_regs, c2[rows, cols])), *out)
    d_first, d_rs = (o.copy_to_host() for o in out)

    A1, B1, A2, B2 = (from16(x, dtype) for x in (a1, b1, a2, b2))
    want1 = (A1 @ B1.T)[rows, cols]  # S = Q·Kᵀ's form: both operands K-major
    want2 = (A2 @ B2 + c2)[rows, cols]
    bound1 = 2.0 ** -16 * (np.abs(A1) @ np.abs(B1.T))[rows, cols]
    bound2 = 2.0 ** -16 * (np.abs(A2) @ np.abs(B2) + np.abs(c2))[rows, cols]
    check(d_first, want1, bound1, rows, cols, f"MMA_FIRST {dtype} n{n}")
    check(d_rs, want2, bound2, rows, cols, f"MMA_RS {dtype} n{n}")
