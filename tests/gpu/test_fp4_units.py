"""The FP4 decode units on the device against numpy: prmt (sign-replicate selectors included, the
PTX ISA's default mode, which the simulator's twin models), the E2M1 word lookups in their three
byte orders (e2m1_words, e2m1_interleaved, e2m1_signed) on every code at every nibble, and the
UE4M3 / E8M0 scale bytes against impnb.quant_fp4 (bit-exact against gguf: tests/test_quant_fp4.py).
Outputs are poisoned first. tests/sim/test_fp4.py runs the same checks in the simulator."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.common import quant_blocks_fp4 as qbf
from impnb.kernels.common import quant_intrinsics as qi
from impnb.quant_fp4 import KVALUES, e8m0_half, ue4m3_half

pytestmark = pytest.mark.gpu


@cuda.jit
def _prmt_kernel(a, b, sel, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = qi.prmt(a[i], b[i], sel[i])


@cuda.jit
def _e2m1_kernel(q, out):
    # out row i: e2m1_words' lo, hi, e2m1_interleaved's two words, e2m1_signed's pos and neg pairs
    i = cuda.grid(1)
    if i < q.size:
        out[i, 0], out[i, 1] = qbf.e2m1_words(q[i])
        out[i, 2], out[i, 3] = qbf.e2m1_interleaved(q[i])
        (out[i, 4], out[i, 5]), (out[i, 6], out[i, 7]) = qbf.e2m1_signed(q[i])


@cuda.jit
def _scales_kernel(b, ue4m3, e8m0):
    i = cuda.grid(1)
    if i < b.size:
        ue4m3[i] = qbf.ue4m3_half(b[i])
        e8m0[i] = qbf.e8m0_half(b[i])


def prmt_ref(a, b, sel):
    """numpy prmt: byte i is byte sel[4i:4i+3] of b:a, or with sel bit 4i+3 its sign replicated."""
    src = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
    out = np.zeros_like(a)
    for i in range(4):
        nib = (sel >> np.uint32(4 * i)) & np.uint32(15)
        byte = ((src >> (np.uint64(8) * (nib & np.uint32(7)).astype(np.uint64))) & np.uint64(0xFF)).astype(np.uint32)
        filled = np.where(byte & np.uint32(0x80), np.uint32(0xFF), np.uint32(0))
        out |= np.where(nib & np.uint32(8), filled, byte) << np.uint32(8 * i)
    return out


def _words(values):
    """(n, 4) int8 bytes -> (n,) uint32 words, byte 0 lowest."""
    return np.ascontiguousarray(values.astype(np.int8)).view(np.uint32).reshape(-1)


def check_prmt(rng, n=4096):
    a, b, sel = (rng.integers(0, 2 ** 32, n, dtype=np.uint32) for _ in range(3))
    out = cuda.to_device(np.full(n, 0xDEADBEEF, np.uint32))
    _prmt_kernel[(n + 127) // 128, 128](cuda.to_device(a), cuda.to_device(b), cuda.to_device(sel), out)
    assert np.array_equal(out.copy_to_host(), prmt_ref(a, b, sel))


def check_e2m1(rng, n=2048):
    # every code at every nibble (code c at nibble k of word 16 k + c), then random words
    fixed = np.array([c << (4 * k) for k in range(8) for c in range(16)], np.uint32)
    q = np.concatenate([fixed, rng.integers(0, 2 ** 32, n, dtype=np.uint32)])
    out = cuda.to_device(np.full((q.size, 8), 0xDEADBEEF, np.uint32))
    _e2m1_kernel[(q.size + 127) // 128, 128](cuda.to_device(q), out)
    got = out.copy_to_host()
    codes = (q[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15  # nibble k of each word
    v = KVALUES[codes]
    assert np.array_equal(got[:, 0], _words(v[:, 0::2])) and np.array_equal(got[:, 1], _words(v[:, 1::2]))
    assert np.array_equal(got[:, 2], _words(v[:, 0:4])) and np.array_equal(got[:, 3], _words(v[:, 4:8]))
    neg = codes >= 8
    pos_mag, neg_mag = np.where(neg, 0, v), np.where(neg, -v, 0)
    assert np.array_equal(got[:, 4], _words(pos_mag[:, 0:4])) and np.array_equal(got[:, 5], _words(pos_mag[:, 4:8]))
    assert np.array_equal(got[:, 6], _words(neg_mag[:, 0:4])) and np.array_equal(got[:, 7], _words(neg_mag[:, 4:8]))


def check_scales():
    b = np.arange(256, dtype=np.uint32)
    ue, e8 = (cuda.to_device(np.full(256, np.nan, np.float32)) for _ in range(2))
    _scales_kernel[2, 128](cuda.to_device(b), ue, e8)
    assert np.array_equal(ue.copy_to_host().view(np.uint32), ue4m3_half(b).view(np.uint32))
    assert np.array_equal(e8.copy_to_host().view(np.uint32), e8m0_half(b).view(np.uint32))


def test_prmt():
    check_prmt(np.random.default_rng(0))


def test_e2m1_lookups():
    check_e2m1(np.random.default_rng(1))


def test_scale_bytes():
    check_scales()
