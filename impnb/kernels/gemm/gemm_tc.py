"""Tensor-core GEMM tiles: C (M, N) float32 [+]= A (M, K) fp16 · W (N, K)ᵀ fp16, fp32 accumulation.

mma.sync m16n8k16 through the inline-PTX intrinsics of ptx.py; a 4-stage cp.async pipeline of
BM x 32 A tiles and BN x 32 W tiles in XOR-swizzled dynamic shared memory (launched through
impnb.launch, which opts in past 48 KB); ldmatrix.x4 fragments. The pieces (tile loads, one warp's
32-deep step, the epilogue) are shared with the quantized-weight tiles of gemm_tc_quant.py, which
decode GGUF blocks into the same W tile layout.

Tile 128 x 128 x 32, 8 warps as 2 (M) x 4 (N), each warp 64 x 32 (4 x 4 mma tiles, 64 fp32
accumulators per lane, 125 registers): two blocks per SM (16 warps; 2 x 64 KB of shared memory)
to hide ldmatrix and mma latency. 64 x 32 warp tiles load 6 ldmatrix.x4 per 16 mma, the least
shared-memory traffic per mma 8 warps allow without 128-accumulator warp tiles, which would leave
one block per SM. 64 x 128 (2 x 4 warps of 32 x 32) is the small-M tile. A ring of 4 stages of
32-deep K keeps three 16 KB stages in flight while one is multiplied.

Requirements (asserted in gemm_f16): K % 32 == 0, N % 8 == 0, any M >= 1; C-contiguous arrays,
16-byte aligned. Rows past M and N are zero-filled by cp.async and never stored.

Shared tile layout (A and W alike): row r of 32 fp16 is 64 bytes = four 16-byte chunks; chunk q
sits at byte r*64 + 16 * (q ^ ((r >> 1) & 3)). An ldmatrix phase reads 8 consecutive rows at one
q; rows r and r+1 fill the two halves of a 128-byte line and (r >> 1) & 3 spreads the four lines
over distinct 16-byte bank groups, so ldmatrix and the 16-byte cp.async writes are conflict-free.

Numpy reference: `gemm_ref` (float64 on the dequantized weights).
"""

from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx
from impnb.launch import launch

BK = 32           # K per pipeline stage (two m16n8k16 steps)
THREADS = 256     # 8 warps
ROW_BYTES = 2 * BK
GROUP_M = 8       # blocks raster over groups of 8 M tiles so W tiles stay in L2
F16_TILE = (128, 128, 2, 4, 4)  # bm, bn, warps_m, warps_n, cp.async stages (64 KB of shared memory)
SMALL_TILE = (64, 128, 2, 4, 4)
SMEM_ALIGN = ptx.SMEM_ALIGN  # a global, so numba types it as a literal


@cuda.jit(device=True, inline=True)
def tile_offset(r, q):
    """Byte offset of 16-byte chunk q (0..3) of tile row r in the swizzled layout."""
    return r * ROW_BYTES + ((q ^ ((r >> 1) & 3)) << 4)


@cuda.jit(device=True, inline=True)
def block_tile(n_m, n_n):
    """(tile_m, tile_n) of this block: a 1-D grid rastered in groups of GROUP_M M tiles."""
    pid = cuda.blockIdx.x
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    size = min(n_m - first_m, GROUP_M)
    inner = pid - (pid // per_group) * per_group
    return first_m + inner % size, inner // size


class TileOps:
    """The device functions of one block-tile geometry (see tile_ops)."""

    def __init__(self, **fns):
        self.__dict__.update(fns)


@lru_cache(maxsize=None)
def tile_ops(bm, bn, warps_m, warps_n):
    """Device functions for a bm x bn block tile of 8 warps (warps_m x warps_n): load_a, load_a_split,
    load_w (cp.async tile loads), load_frags, warp_step (one 32-deep stage), store_c (epilogue);
    n_af, n_bf, n_acc (fragment and accumulator counts per lane)."""
    assert warps_m * warps_n == THREADS // 32
    wm_rows, wn_cols = bm // warps_m, bn // warps_n
    mt, nt = wm_rows // 16, wn_cols // 8  # mma tiles per warp
    a_chunks, w_chunks = bm * 4 // THREADS, bn * 4 // THREADS  # 16-byte chunks per thread per stage
    assert nt % 2 == 0 and a_chunks >= 1 and w_chunks >= 1
    n_af, n_bf, n_acc = 4 * mt, 2 * nt, 4 * mt * nt

    @cuda.jit(device=True, inline=True)
    def load_rows(sbase, src, row0, n_rows, K, col0, n_chunks):
        # rows row0..row0+n_chunks*64 of src (rows x K fp16) at columns col0..col0+32 -> tile at sbase
        t = cuda.threadIdx.x
        for i in range(n_chunks):
            idx = t + THREADS * i
            r = idx >> 2
            q = idx & 3
            row = row0 + r
            ok = row < n_rows
            src_row = row if ok else row0
            ptx.cp_async_16_zfill(sbase + tile_offset(r, q), src, src_row * K + col0 + 8 * q,
                                  16 if ok else 0)

    @cuda.jit(device=True, inline=True)
    def load_a(sbase, a, m0, col0):
        load_rows(sbase, a, m0, a.shape[0], a.shape[1], col0, a_chunks)

    @cuda.jit(device=True, inline=True)
    def load_a_split(sbase, a, m0, col_lo, col_hi):
        # k slots 0..15 <- columns col_lo..+16, slots 16..31 <- col_hi..+16 (quantized W's chunk order)
        t = cuda.threadIdx.x
        M = a.shape[0]
        K = a.shape[1]
        for i in range(a_chunks):
            idx = t + THREADS * i
            r = idx >> 2
            q = idx & 3
            row = m0 + r
            ok = row < M
            src_row = row if ok else m0
            col = (col_lo if q < 2 else col_hi) + 8 * (q & 1)
            ptx.cp_async_16_zfill(sbase + tile_offset(r, q), a, src_row * K + col, 16 if ok else 0)

    @cuda.jit(device=True, inline=True)
    def load_w(sbase, w, n0, col0):
        load_rows(sbase, w, n0, w.shape[0], w.shape[1], col0, w_chunks)

    @cuda.jit(device=True, inline=True)
    def load_frags(sa, sw, kk, af, bf):
        # this warp's A fragments (af[4i..4i+3]: a0a1, a2a3, a4a5, a6a7 of m tile i) and W
        # fragments (bf[2j], bf[2j+1]: b0b1, b2b3 of n tile j) for k 16kk..16kk+15 of the stage
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        x = (lane >> 1) & 3  # (row >> 1) & 3 of every row this lane addresses
        a_row = (warp // warps_n) * wm_rows + (lane & 15)
        b_row = (warp % warps_n) * wn_cols + (lane & 7) + ((lane >> 4) << 3)
        qa = ((2 * kk + (lane >> 4)) ^ x) << 4
        qb = ((2 * kk + ((lane >> 3) & 1)) ^ x) << 4
        for i in range(mt):  # matrices: rows 0-7 / 8-15 at k 0-7, then at k 8-15
            r0, r1, r2, r3 = ptx.ldmatrix_x4(sa + (a_row + 16 * i) * ROW_BYTES + qa)
            af[4 * i] = r0
            af[4 * i + 1] = r1
            af[4 * i + 2] = r2
            af[4 * i + 3] = r3
        for jp in range(nt // 2):  # matrices: n 0-7 at k 0-7, k 8-15, then n 8-15 likewise
            r0, r1, r2, r3 = ptx.ldmatrix_x4(sw + (b_row + 16 * jp) * ROW_BYTES + qb)
            bf[4 * jp] = r0
            bf[4 * jp + 1] = r1
            bf[4 * jp + 2] = r2
            bf[4 * jp + 3] = r3

    @cuda.jit(device=True, inline=True)
    def warp_step(sa, sw, acc):
        # acc[4*(i*nt + j) + 0..3] += A(sa) · W(sw)ᵀ over the stage's 32 k, this warp's mt x nt tiles
        af = cuda.local.array(n_af, uint32)
        bf = cuda.local.array(n_bf, uint32)
        for kk in range(2):
            load_frags(sa, sw, kk, af, bf)
            for i in range(mt):
                for j in range(nt):
                    o = 4 * (i * nt + j)
                    d0, d1, d2, d3 = ptx.mma_f16(af[4 * i], af[4 * i + 1], af[4 * i + 2], af[4 * i + 3],
                                                 bf[2 * j], bf[2 * j + 1],
                                                 acc[o], acc[o + 1], acc[o + 2], acc[o + 3])
                    acc[o] = d0
                    acc[o + 1] = d1
                    acc[o + 2] = d2
                    acc[o + 3] = d3

    @cuda.jit(device=True, inline=True)
    def store_c(c, acc, m0, n0, accumulate):
        # lane holds c0, c1 at (g, 2*tig + 0..1) and c2, c3 at (g + 8, ...) of each mma tile
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        M = c.shape[0]
        N = c.shape[1]
        row0 = m0 + (warp // warps_n) * wm_rows + (lane >> 2)
        col0 = n0 + (warp % warps_n) * wn_cols + 2 * (lane & 3)
        for i in range(mt):
            for half in range(2):
                row = row0 + 16 * i + 8 * half
                if row < M:
                    for j in range(nt):
                        col = col0 + 8 * j
                        if col < N:
                            o = 4 * (i * nt + j) + 2 * half
                            v0 = acc[o]
                            v1 = acc[o + 1]
                            if accumulate:
                                v0 += c[row, col]
                                v1 += c[row, col + 1]
                            ptx.st_global_v2_f32(c, row * N + col, v0, v1)

    return TileOps(load_a=load_a, load_a_split=load_a_split, load_w=load_w, load_frags=load_frags,
                   warp_step=warp_step, store_c=store_c, n_af=n_af, n_bf=n_bf, n_acc=n_acc,
                   mt=mt, nt=nt, wm_rows=wm_rows, wn_cols=wn_cols)


@lru_cache(maxsize=None)
def gemm_f16_kernel(bm=128, bn=128, warps_m=2, warps_n=4, stages=4):
    ops = tile_ops(bm, bn, warps_m, warps_n)
    load_a, load_w, warp_step, store_c, n_acc = ops.load_a, ops.load_w, ops.warp_step, ops.store_c, ops.n_acc
    a_bytes, w_bytes = bm * ROW_BYTES, bn * ROW_BYTES
    stage_bytes = a_bytes + w_bytes
    assert stages >= 2
    wait_pending = stages - 2
    last = stages - 1

    # grid (ceil(M/bm) * ceil(N/bn),), block 256: a block owns the bm x bn tile of C given by
    # block_tile; warp w the (w // warps_n, w % warps_n) sub-tile. Shared (dynamic, f16_shared_bytes):
    # a ring of `stages` [A tile bm x 32 | W tile bn x 32] fp16, swizzled (tile_offset).
    @cuda.jit
    def _gemm_f16_kernel(a, w, c, accumulate):
        n_k = a.shape[1] // BK
        tm, tn = block_tile((a.shape[0] + bm - 1) // bm, (w.shape[0] + bn - 1) // bn)
        m0 = tm * bm
        n0 = tn * bn
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        base = ptx.smem_addr(smem, 0)
        acc = cuda.local.array(n_acc, float32)
        for i in range(n_acc):
            acc[i] = float32(0.0)
        # -- prologue: stages 0 .. stages-2 in flight --
        for s in range(last):
            if s < n_k:
                sb = base + s * stage_bytes
                load_a(sb, a, m0, s * BK)
                load_w(sb + a_bytes, w, n0, s * BK)
            ptx.cp_async_commit()
        # -- main loop: wait for stage kt, refill the slot stage kt-1 used, multiply --
        rd = 0        # slot of stage kt
        wr = last     # slot of stage kt + stages - 1
        for kt in range(n_k):
            ptx.cp_async_wait_group(wait_pending)
            cuda.syncthreads()
            nxt = kt + last
            if nxt < n_k:
                sb = base + wr * stage_bytes
                load_a(sb, a, m0, nxt * BK)
                load_w(sb + a_bytes, w, n0, nxt * BK)
            ptx.cp_async_commit()
            sb = base + rd * stage_bytes
            warp_step(sb, sb + a_bytes, acc)
            rd = 0 if rd == last else rd + 1
            wr = 0 if wr == last else wr + 1
        # -- epilogue --
        store_c(c, acc, m0, n0, accumulate)

    return _gemm_f16_kernel


def f16_shared_bytes(bm, bn, warps_m, warps_n, stages) -> int:
    return stages * (bm + bn) * ROW_BYTES


def aligned16(a) -> bool:
    ptr = getattr(a, "device_ctypes_pointer", None)
    return ptr is None or (ptr.value or 0) % 16 == 0


def grid_size(M, N, bm, bn) -> int:
    return -(-M // bm) * -(-N // bn)


def check_shapes(a, c, N, K):
    M = a.shape[0]
    assert a.shape == (M, K) and c.shape == (M, N), (a.shape, c.shape, N, K)
    assert M >= 1 and K % BK == 0 and N % 8 == 0, f"gemm tiles need K % {BK} == 0 and N % 8 == 0: N={N} K={K}"
    assert a.dtype == np.float16 and c.dtype == np.float32
    assert a.is_c_contiguous() and c.is_c_contiguous() and aligned16(a) and aligned16(c)


def gemm_f16(a, w, c, stream, accumulate: bool = False, tile=F16_TILE):
    """c (M, N) float32 = a (M, K) fp16 · w (N, K)ᵀ fp16, or c += with accumulate.
    tile: (bm, bn, warps_m, warps_n, stages)."""
    N, K = w.shape
    check_shapes(a, c, N, K)
    assert w.dtype == np.float16 and w.is_c_contiguous() and aligned16(w)
    launch(gemm_f16_kernel(*tile), grid_size(a.shape[0], N, tile[0], tile[1]), THREADS, stream,
           a, w, c, np.int32(accumulate), shared_bytes=f16_shared_bytes(*tile))


def gemm_ref(a: np.ndarray, w: np.ndarray, ggml_type=None, c: np.ndarray | None = None,
             f16x2: bool = False) -> np.ndarray:
    """float64 a (M, K) · Wᵀ (+ c); w a float (N, K) array, or raw GGUF bytes (N, row_bytes) of
    ggml_type dequantized as the kernels see them (gguf's dequantize rounded to fp16; with f16x2,
    the f16x2 decoders' values where the type has one: wgmma_w_ops)."""
    if ggml_type is not None:
        from impnb.kernels.gemm.dequant import F16X2_REFS, dequant_ref

        w = F16X2_REFS[ggml_type](w) if f16x2 and ggml_type in F16X2_REFS else dequant_ref(w, ggml_type)
    out = np.asarray(a, np.float64) @ np.asarray(w, np.float64).T
    return out if c is None else out + c


F16_2D = types.Array(types.float16, 2, "C")
F32_2D = types.Array(types.float32, 2, "C")
GEMM_PTX = ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "cp.async.cg.shared.global", "cp.async.wait_group", "st.global.v2.f32"]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemm_f16_kernel(*tile), types.void(F16_2D, F16_2D, F32_2D, types.int32),
         {"max_registers": 128, "ptx_contains": GEMM_PTX + [f"cp.async.wait_group {tile[4] - 2}"]})
        for tile in (F16_TILE, SMALL_TILE)
    ]
