"""Layout probes for ptx.py's intrinsics and gemm_tc's tiles: every lane's registers against the PTX ISA.

The fragment tables below are transcribed from the PTX ISA ("Matrix Fragments for mma.m16n8k16
with floating point type", "Warp-level matrix load instruction: ldmatrix"). Inputs encode where
they came from (code = row * 16 + col, exact in fp16 and bf16; raw 16-bit codes where nothing is
computed), so a failure names the lane, register and the element it got instead. Run these first:
the GEMM tests build on every one of them. (The numba simulator cannot run inline PTX; these need
a GPU and skip without one.)
"""

import numpy as np
import pytest
from numba import cuda

from tests.probes import ptx_probe as probe
from impnb.kernels.attention.kv_cache import bf16_bits, bf16_values

pytestmark = pytest.mark.gpu

LANES = np.arange(32)


# -- PTX ISA tables: (register, half, row, col) per lane --

def a_frag(lane):
    """m16n8k16 A (16 x 16, row-major), .f16/.bf16: a0..a7 in 4 registers, two per register."""
    g, t = lane >> 2, lane & 3
    return [(i // 2, i % 2, g + (8 if i in (2, 3, 6, 7) else 0), 2 * t + (i & 1) + (8 if i >= 4 else 0))
            for i in range(8)]


def b_frag(lane):
    """m16n8k16 B (16 x 8, k x n): b0..b3 in 2 registers; row = k, col = n."""
    g, t = lane >> 2, lane & 3
    return [(i // 2, i % 2, 2 * t + (i & 1) + (8 if i >= 2 else 0), g) for i in range(4)]


def c_frag(lane):
    """m16n8k16 C/D (16 x 8) .f32: c0..c3, one per register."""
    g, t = lane >> 2, lane & 3
    return [(i, 0, g + (8 if i >= 2 else 0), 2 * t + (i & 1)) for i in range(4)]


def a_frag_s8(lane, k):
    """m16n8k32 / m16n8k16 A (16 x k, row-major), .s8: (register, byte, row, col), four a register;
    register r holds row g (+8 for odd r), columns 4t .. 4t + 3 (+16 for r >= 2)."""
    g, t = lane >> 2, lane & 3
    return [(r, b, g + 8 * (r & 1), 4 * t + 16 * (r >> 1) + b) for r in range(k // 8) for b in range(4)]


def b_frag_s8(lane, k):
    """m16n8k32 / m16n8k16 B (k x 8), .s8: register r holds k = 4t .. 4t + 3 (+16 for r = 1), n = g."""
    g, t = lane >> 2, lane & 3
    return [(r, b, 4 * t + 16 * r + b, g) for r in range(k // 16) for b in range(4)]


def ldmatrix_frag(lane, trans):
    """ldmatrix m8n8 .b16, per matrix: the lane's register holds (row, col), (row, col + 1) of the
    8 x 8 matrix, row = lane / 4, col = 2 * (lane % 4); with .trans the transposed elements."""
    r, c = lane >> 2, 2 * (lane & 3)
    return [(c, r), (c + 1, r)] if trans else [(r, c), (r, c + 1)]


# -- helpers --

def bits16(x, dtype):
    """uint16 bit patterns of x rounded to fp16 or bf16 (round to nearest even)."""
    x = np.asarray(x, np.float32)
    if dtype == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).view(np.uint16)
    return bf16_bits(x)


def from16(b, dtype):
    b = np.asarray(b, np.uint16)
    if dtype == "f16":
        return b.view(np.float16).astype(np.float64)
    return bf16_values(b).astype(np.float64)


def pack_regs(mat16, table, n_regs):
    """(32, n_regs) uint32 registers of a 16-bit matrix, two elements per register per the table."""
    regs = np.zeros((32, n_regs), np.uint32)
    for lane in LANES:
        for reg, half, r, c in table(lane):
            regs[lane, reg] |= np.uint32(mat16[r, c]) << np.uint32(16 * half)
    return regs


def run_mma(dtype, A, B, C):
    """D = A·B + C through the mma probe with the registers built from the tables; D (16, 8)."""
    a = pack_regs(bits16(A, dtype), a_frag, 4)
    b = pack_regs(bits16(B, dtype), b_frag, 2)
    c = np.zeros((32, 4), np.float32)
    for lane in LANES:
        for reg, _, r, col in c_frag(lane):
            c[lane, reg] = C[r, col]
    d = cuda.to_device(np.full((32, 4), np.nan, np.float32))
    kernel = probe.mma_f16_probe if dtype == "f16" else probe.mma_bf16_probe
    kernel[1, 32](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), d)
    return c_matrix(d.copy_to_host(), np.full((16, 8), np.nan))


def c_matrix(regs, D):
    """D (16, 8) filled from the lanes' C/D registers regs (32, 4) by the table."""
    for lane in LANES:
        for reg, _, r, col in c_frag(lane):
            D[r, col] = regs[lane, reg]
    return D


def code_matrix(rows, cols):
    r, c = np.mgrid[0:rows, 0:cols]
    return (r * 16 + c).astype(np.float64)


def where_code(v):
    return f"(row {int(v) // 16}, col {int(v) % 16})" if np.isfinite(v) and v >= 0 else repr(v)


# -- mma.sync m16n8k16 --

@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_a_fragment(dtype):
    """D = A · S with S selecting k = n (+8): D[r, n] must be A[r, n] (A[r, n+8])."""
    A = code_matrix(16, 16)
    for shift in (0, 8):
        S = np.zeros((16, 8))
        S[np.arange(8) + shift, np.arange(8)] = 1
        D = run_mma(dtype, A, S, np.zeros((16, 8)))
        want = A[:, shift:shift + 8]
        bad = np.argwhere(D != want)
        assert not len(bad), "; ".join(f"D[{r},{c}] holds A{where_code(D[r, c])}, want A{where_code(want[r, c])}"
                                       for r, c in bad[:6])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_b_fragment(dtype):
    """D = I · B: D[k, n] must be B[k, n] for all 16 k."""
    B = code_matrix(16, 8)
    D = run_mma(dtype, np.eye(16), B, np.zeros((16, 8)))
    bad = np.argwhere(D != B)
    assert not len(bad), "; ".join(f"D[{r},{c}] holds B{where_code(D[r, c])}, want B{where_code(B[r, c])}"
                                   for r, c in bad[:6])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_c_fragment(dtype):
    """A = B = 0: D must equal C element for element."""
    C = code_matrix(16, 8) + 0.25
    D = run_mma(dtype, np.zeros((16, 16)), np.zeros((16, 8)), C)
    bad = np.argwhere(D != C)
    assert not len(bad), "; ".join(f"D[{r},{c}] = {D[r, c]}, want {C[r, c]}" for r, c in bad[:6])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_product(dtype):
    """Gaussian A, B (rounded to the input type), C: D against float64. Products of 16-bit
    floats are exact in fp32; the 17 terms are summed in fp32, so |error| <= 2^-18 * sum |terms|."""
    rng = np.random.default_rng(4)
    for std in (0.1, 1.0, 10.0):
        A = from16(bits16(rng.standard_normal((16, 16)) * std, dtype), dtype)
        B = from16(bits16(rng.standard_normal((16, 8)) * std, dtype), dtype)
        C = rng.standard_normal((16, 8)).astype(np.float32).astype(np.float64) * std
        D = run_mma(dtype, A, B, C)
        ref = A @ B + C
        bound = 2.0 ** -18 * (np.abs(A) @ np.abs(B) + np.abs(C))
        err = np.abs(D - ref)
        assert (err <= bound).all(), f"std {std}: max err {err.max():.3e}, bound there {bound.flat[err.argmax()]:.3e}"


# -- ldmatrix --

@pytest.mark.parametrize("trans", [False, True], ids=["plain", "trans"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_ldmatrix(n, trans):
    """Matrix i (8 x 8 b16 codes (i << 8 | row << 4 | col)) rows at shuffled shared slots:
    lane l's register i must hold the table's two elements of matrix i."""
    rng = np.random.default_rng(n)
    codes = np.zeros((n, 8, 8), np.uint32)
    for i in range(n):
        codes[i] = (i << 8) | (np.arange(8)[:, None] << 4) | np.arange(8)[None, :]
    src = (codes[..., 0::2] | (codes[..., 1::2] << 16)).reshape(-1).astype(np.uint32)  # 4 words a row
    slots = rng.permutation(32).astype(np.int32)
    out = cuda.to_device(np.full((32, n), 0xFFFFFFFF, np.uint32))
    probe.ldmatrix_probe(n, trans)[1, 32](cuda.to_device(src), cuda.to_device(slots), out)
    got = out.copy_to_host()
    errors = []
    for lane in LANES:
        for i in range(n):
            (r0, c0), (r1, c1) = ldmatrix_frag(lane, trans)
            want = codes[i, r0, c0] | (codes[i, r1, c1] << 16)
            if got[lane, i] != want:
                errors.append(f"lane {lane} reg {i}: got {got[lane, i]:08x}, want {want:08x} "
                              "(codes matrix<<8|row<<4|col, high half second)")
    assert not errors, "; ".join(errors[:6])


# -- cp.async, 16-byte moves, packing, shared addresses --

def test_cp_async():
    rng = np.random.default_rng(5)
    src = rng.integers(0, 2**32, 128, dtype=np.uint64).astype(np.uint32)
    slots = rng.permutation(32).astype(np.int32)
    nbytes = np.full(32, 16, np.int32)
    nbytes[16:] = [0, 4, 8, 12, 16, 0, 16, 4, 8, 12, 0, 16, 16, 8, 4, 0]
    out = cuda.to_device(np.full(128, 0x12345678, np.uint32))
    probe.cp_async_probe[1, 32](cuda.to_device(src), cuda.to_device(slots), cuda.to_device(nbytes), out)
    got = out.copy_to_host().reshape(32, 4)
    want = src.reshape(32, 4).copy()
    for t in range(32):
        want[t, nbytes[t] // 4:] = 0
    bad = [t for t in range(32) if not np.array_equal(got[t], want[t])]
    assert not bad, "; ".join(f"chunk {t} ({'cp_async_16' if t < 16 else f'zfill {nbytes[t]} B'}): "
                              f"got {got[t].tolist()}, want {want[t].tolist()}" for t in bad[:4])


def test_global_v4_and_v2():
    rng = np.random.default_rng(6)
    src = rng.integers(0, 2**32, 128, dtype=np.uint64).astype(np.uint32)
    srcf = rng.standard_normal(64).astype(np.float32)
    out = cuda.to_device(np.zeros(128, np.uint32))
    outf = cuda.to_device(np.full(64, np.nan, np.float32))
    probe.global_v4_probe[1, 32](cuda.to_device(src), out, cuda.to_device(srcf), outf)
    assert np.array_equal(out.copy_to_host(), src.reshape(32, 4)[:, ::-1].reshape(-1))
    assert np.array_equal(outf.copy_to_host(), srcf.reshape(32, 2)[:, ::-1].reshape(-1))


def test_shared_addresses_and_v4():
    rng = np.random.default_rng(7)
    src = rng.integers(0, 2**32, 128, dtype=np.uint64).astype(np.uint32)
    slots = rng.permutation(32).astype(np.int32)
    addr = cuda.to_device(np.full((2, 32), 0xFFFFFFFF, np.uint32))
    out = cuda.to_device(np.zeros((2, 128), np.uint32))
    probe.shared_v4_probe[1, 32](cuda.to_device(src), cuda.to_device(slots), addr, out)
    addr, out = addr.copy_to_host(), out.copy_to_host()
    assert np.array_equal(addr[0], 4 * LANES), f"smem_addr offsets {addr[0].tolist()}"
    assert np.array_equal(addr[1], 4 * LANES), f"cvta_to_shared offsets {addr[1].tolist()}"
    placed = np.zeros((32, 4), np.uint32)
    placed[slots] = src.reshape(32, 4)
    assert np.array_equal(out[0].reshape(32, 4), placed), "st_shared_v4_u32 at smem_addr != numba's view of sm"
    assert np.array_equal(out[1].reshape(32, 4), placed), "ld_shared_v4_u32 through cvta_to_shared"


@pytest.mark.parametrize("S", (2, 4, 8))
def test_cluster_shared(S):
    """ld_cluster_f32 after cluster_sync reads every block's shared memory of a cluster of S."""
    from impnb.launch import launch

    src = np.random.default_rng(S).standard_normal((S, 32)).astype(np.float32)
    out = cuda.to_device(np.full((S, S, 32), np.nan, np.float32))
    launch(probe.cluster_probe, (1, 1, S), 32, 0, cuda.to_device(src), out, cluster=(1, 1, S))
    got = out.copy_to_host()
    assert np.array_equal(got, np.broadcast_to(src, (S, S, 32))), "block z, rank r != src[r]"


def test_pack_f16x2_bf16x2():
    rng = np.random.default_rng(8)
    special = np.array([0.0, -0.0, 1.0, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, 65504.0,
                        65520.0, 70000.0, -70000.0, 2**-24, 2**-25, 3 * 2**-26, 1e-30, 3.4e38,
                        np.inf, -np.inf, np.nan, -np.nan], np.float32)
    with np.errstate(over="ignore"):
        x = np.concatenate([special] + [(rng.standard_normal(500) * s).astype(np.float32)
                                        for s in (1e-6, 0.1, 1.0, 10.0, 1e4, 1e38)])
    x = x[: len(x) // 2 * 2]
    h = cuda.to_device(np.zeros(len(x) // 2, np.uint32))
    b = cuda.to_device(np.zeros(len(x) // 2, np.uint32))
    probe.pack_probe[(len(x) // 2 + 127) // 128, 128](cuda.to_device(x), h, b)
    for name, got, dtype in (("f16x2", h.copy_to_host(), "f16"), ("bf16x2", b.copy_to_host(), "bf16")):
        halves = np.stack([got & 0xFFFF, got >> 16], axis=1).reshape(-1).astype(np.uint16)
        want = bits16(x, dtype)
        gv, wv = from16(halves, dtype), from16(want, dtype)
        ok = (halves == want) | (np.isnan(gv) & np.isnan(wv))
        bad = np.flatnonzero(~ok)
        assert not len(bad), f"{name}: " + "; ".join(
            f"x[{i}] = {x[i]!r} ({'lo' if i % 2 == 0 else 'hi'} half): got {halves[i]:04x}, want {want[i]:04x}"
            for i in bad[:6])


# -- gemm_tc tiles: cp.async + swizzle + ldmatrix addressing give the mma fragments --

def tile_codes(rows, cols=32):
    """Raw 16-bit codes row << 5 | col (moved, never computed on), as an fp16 array."""
    r, c = np.mgrid[0:rows, 0:cols]
    return ((r << 5) | c).astype(np.uint16)


@pytest.mark.parametrize("geometry", [(128, 128, 2, 4), (64, 128, 2, 4)], ids=["128x128", "64x128"])
def test_tile_fragments(geometry):
    bm, bn, warps_m, warps_n = geometry
    from impnb.kernels.gemm.gemm_tc import tile_ops

    ops = tile_ops(*geometry)
    m_rows, n_rows = bm - 3, bn - 5  # rows past the matrix must arrive as zeros
    A = tile_codes(m_rows)
    W = tile_codes(n_rows)
    af = cuda.to_device(np.zeros((8, 2, ops.n_af, 32), np.uint32))
    bf = cuda.to_device(np.zeros((8, 2, ops.n_bf, 32), np.uint32))
    tiles = cuda.to_device(np.zeros((bm + bn, 16), np.uint32))
    probe.tile_frag_probe(*geometry)[1, 256](cuda.to_device(A.view(np.float16)), cuda.to_device(W.view(np.float16)),
                                             af, bf, tiles)
    af, bf, tiles = af.copy_to_host(), bf.copy_to_host(), tiles.copy_to_host()
    A_pad = np.zeros((bm, 32), np.uint32)
    A_pad[:m_rows] = A
    W_pad = np.zeros((bn, 32), np.uint32)
    W_pad[:n_rows] = W

    # shared bytes: row r's logical 16-byte chunk q sits at physical chunk q ^ ((r >> 1) & 3)
    for name, mat, off in (("A", A_pad, 0), ("W", W_pad, bm)):
        for r in range(mat.shape[0]):
            for q in range(4):
                p = q ^ ((r >> 1) & 3)
                words = mat[r, 8 * q:8 * q + 8:2] | (mat[r, 8 * q + 1:8 * q + 8:2] << 16)
                assert np.array_equal(tiles[off + r, 4 * p:4 * p + 4], words), \
                    f"{name} tile row {r} chunk {q} not at physical chunk {p}"

    errors = []
    for warp in range(8):
        wm, wn = warp // warps_n, warp % warps_n
        for kk in range(2):
            for lane in LANES:
                for i in range(ops.mt):
                    for reg, half, r, c in a_frag(lane):
                        want = A_pad[wm * ops.wm_rows + 16 * i + r, 16 * kk + c]
                        got = (af[warp, kk, 4 * i + reg, lane] >> (16 * half)) & 0xFFFF
                        if got != want:
                            errors.append(f"A warp {warp} kk {kk} m-tile {i} lane {lane} a{2 * reg + half}: "
                                          f"got (row {got >> 5}, k {got & 31}), want (row {want >> 5}, k {want & 31})")
                for j in range(ops.nt):
                    for reg, half, k, n in b_frag(lane):
                        want = W_pad[wn * ops.wn_cols + 8 * j + n, 16 * kk + k]
                        got = (bf[warp, kk, 2 * j + reg, lane] >> (16 * half)) & 0xFFFF
                        if got != want:
                            errors.append(f"W warp {warp} kk {kk} n-tile {j} lane {lane} b{2 * reg + half}: "
                                          f"got (n {got >> 5}, k {got & 31}), want (n {want >> 5}, k {want & 31})")
    assert not errors, f"{len(errors)} wrong fragment elements: " + "; ".join(errors[:6])


# -- int8 mma.sync m16n8k32 / m16n8k16 --

def run_mma_s8(k, A, B, C):
    """D = A·B + C (int32) through the int8 mma probe, registers built from the tables; D (16, 8)."""
    a = np.zeros((32, k // 8), np.uint32)
    b = np.zeros((32, 2), np.uint32)
    c = np.zeros((32, 4), np.int32)
    for lane in LANES:
        for reg, byte, r, col in a_frag_s8(lane, k):
            a[lane, reg] |= np.uint32(np.uint8(np.int8(A[r, col]))) << np.uint32(8 * byte)
        for reg, byte, r, col in b_frag_s8(lane, k):
            b[lane, reg] |= np.uint32(np.uint8(np.int8(B[r, col]))) << np.uint32(8 * byte)
        for reg, _, r, col in c_frag(lane):
            c[lane, reg] = C[r, col]
    if k == 16:
        a = np.concatenate([a, np.zeros((32, 2), np.uint32)], axis=1)
    d = cuda.to_device(np.full((32, 4), -7, np.int32))
    kernel = probe.mma_s8_k32_probe if k == 32 else probe.mma_s8_k16_probe
    kernel[1, 32](cuda.to_device(np.ascontiguousarray(a)), cuda.to_device(b), cuda.to_device(c), d)
    return c_matrix(d.copy_to_host(), np.zeros((16, 8), np.int64))


@pytest.mark.parametrize("k", [32, 16])
def test_mma_s8(k):
    """Random int8 A, B over the whole range and int32 C: D exactly A·B + C, so every lane's
    registers sit where the tables say (a misplaced byte changes some sum)."""
    rng = np.random.default_rng(k)
    for _ in range(3):
        A = rng.integers(-128, 128, (16, k))
        B = rng.integers(-128, 128, (k, 8))
        C = rng.integers(-2 ** 20, 2 ** 20, (16, 8))
        D = run_mma_s8(k, A, B, C)
        bad = np.argwhere(D != A @ B + C)
        assert not len(bad), f"{len(bad)} of 128 wrong, first at {bad[0]}"
