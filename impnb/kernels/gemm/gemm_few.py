"""Tensor-core GEMM over quantized weights for few rows (a batched decode step's 9..64, more in
64-row slabs): C (M, N) float32 [+]= A (M, K) fp16 · dequant(W)ᵀ, W read as stored.

gemm_tc_quant's tiles decode 128 W rows a 32-deep stage into shared memory for every warp to
read; at a few rows of A that is all overhead and too little of W in flight to stream it at the
copy rate. Here the weights never touch shared memory: each lane decodes whole 32-weight chunks
of one W row straight into the B fragments of mma.sync m16n8k16, and A is what shared memory
holds.

Work: a block (4 warps) owns 8 NT rows of W a warp (NT n8 tiles), MT m16 tiles of A and a range
of 128-column groups of K (split-K: grid (ceil(N / BN), S, ceil(M / BM))); its partial tile goes
to part[s] and gemm_quant_splitk's reduce adds the S parts in split order (deterministic).

Lane (g, t) = (lane >> 2, lane & 3), at group grp: chunk c = 4 grp + t of W rows n0 + 8 i + g
(i < NT), both 16-weight halves h, decoded exactly (dequant's fp16 values) into B_h[0..7] =
(w[2j], w[2j + 1]) half pairs. mma step (h, q), q = 0..3, labels k = 2t, 2t + 1 with the weights
at columns col(c, h) + 4q + 0, 1 and k = 2t + 8, 2t + 9 with those at + 2, 3: b0 = B_h[2q],
b1 = B_h[2q + 1]. The labels depend on t and not on g, so the A fragments are A's values at the
same columns, which one 16-byte shared load a row gives for two steps. A group's 4 chunks cover
128 consecutive columns for every type (block32_k, k4_k, q6_k_k), the group's A stage.

Pipeline per group (two barriers): the next group's A stage (cp.async, zero rows past M) and
the next group's raw W (registers) are in flight while this group decodes and multiplies.
Requirements (asserted): K a multiple of 256 for K-quants, 128 otherwise; N % 8 == 0.
Numpy reference: gemm_tc.gemm_ref with the raw bytes and type.
"""

from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda, float32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemm.dequant import DECODERS
from impnb.kernels.gemm.gemm_quant_splitk import F32_3D, reduce_parts
from impnb.kernels.gemm.gemm_tc import F16_2D, check_shapes
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES, SMEM_ALIGN
from impnb.kernels.gemv.gemv import parts_type
from impnb.launch import launch

WARPS = 4
THREADS = 32 * WARPS
GROUP = 128                   # K columns a stage (4 chunks of 32)
ROW_STRIDE = 2 * GROUP + 16   # bytes of an A stage row in shared memory (16 bytes of padding)
NT = 4                        # n8 tiles a warp
BN = 8 * NT * WARPS           # W rows a block
MAX_MT = 4                    # m16 tiles a block at most (64 rows of A; more rows: grid.z)


def stage_bytes(mt: int) -> int:
    return 16 * mt * ROW_STRIDE


@cuda.jit(device=True, inline=True)
def block_split(n_grp, bm):
    """A split-K block's share and lane: (its first and past-last K group of n_grp, its first row
    of A, warp, g = lane >> 2, t = lane & 3) in grid (·, S splits, row slabs of bm)."""
    S = cuda.gridDim.y
    s = cuda.blockIdx.y
    lane = cuda.threadIdx.x & 31
    return (s * n_grp // S, (s + 1) * n_grp // S, cuda.blockIdx.z * bm, cuda.threadIdx.x >> 5, lane >> 2,
            lane & 3)


@lru_cache(maxsize=None)
def gemm_few_kernel(ggml_type, mt: int):
    """The split-K kernel of one weight type and mt m16 tiles (16 mt rows of A a block)."""
    load, run, col = DECODERS[T(ggml_type)]
    bm = 16 * mt
    a_units = bm * (GROUP // 8) // THREADS  # 16-byte cp.async units a thread a stage
    sbytes = stage_bytes(mt)
    smem_words = 2 * sbytes // 4
    n_acc = 4 * mt * NT
    n_b = 16 * NT

    @cuda.jit(device=True, inline=True)
    def load_a(sbase, a, m0, grp):
        # A rows m0..m0+bm-1, columns 128 grp..+128 -> stage at sbase (rows past M zero)
        t = cuda.threadIdx.x
        M = a.shape[0]
        K = a.shape[1]
        for i in range(a_units):
            idx = t + THREADS * i
            r = idx >> 4
            u = idx & 15
            row = m0 + r
            ok = row < M
            ptx.cp_async_16_zfill(sbase + r * ROW_STRIDE + 16 * u, a, (row if ok else m0) * K + GROUP * grp + 8 * u,
                                  16 if ok else 0)

    @cuda.jit(device=True, inline=True)
    def decode(raw, c, bregs, o):
        # this lane's chunk c of one W row -> bregs[o + 8h + j] = (w[2j], w[2j+1]) of half h, fp16
        w = cuda.local.array(16, float32)
        for h in range(2):
            s = run(raw, c, h, w)
            for j in range(8):
                bregs[o + 8 * h + j] = ptx.pack_f16x2(w[2 * j] * s, w[2 * j + 1] * s)

    @cuda.jit(device=True, inline=True)
    def multiply(sbase, grp, c, bregs, acc):
        # acc[4 (m NT + i) ..] += A stage (sbase) · the NT tiles' B fragments over the group's 128 k
        lane = cuda.threadIdx.x & 31
        g = lane >> 2
        for jp in range(4):  # step pairs (h, q0), (h, q0 + 1)
            h = jp >> 1
            q0 = 2 * (jp & 1)
            off = 2 * (col(c, h) - GROUP * grp + 4 * q0)
            for m in range(mt):
                r0, r1, r2, r3 = ptx.ld_shared_v4_u32(sbase + (16 * m + g) * ROW_STRIDE + off)
                s0, s1, s2, s3 = ptx.ld_shared_v4_u32(sbase + (16 * m + g + 8) * ROW_STRIDE + off)
                for i in range(NT):
                    b = 16 * i + 8 * h + 2 * q0
                    o = 4 * (m * NT + i)
                    d0, d1, d2, d3 = ptx.mma_f16(r0, s0, r1, s1, bregs[b], bregs[b + 1],
                                                 acc[o], acc[o + 1], acc[o + 2], acc[o + 3])
                    d0, d1, d2, d3 = ptx.mma_f16(r2, s2, r3, s3, bregs[b + 2], bregs[b + 3], d0, d1, d2, d3)
                    acc[o] = d0
                    acc[o + 1] = d1
                    acc[o + 2] = d2
                    acc[o + 3] = d3

    # grid (ceil(N / BN), S, ceil(M / bm)), block THREADS: block (x, s, z) owns W rows BN x .. and
    # A rows bm z .., over split s of the K groups; its partial tile -> part[s] (S, M, N).
    @cuda.jit
    def _gemm_few_kernel(a, parts, part):
        s = cuda.blockIdx.y
        M = part.shape[1]
        N = part.shape[2]
        K = a.shape[1]
        cpr = K // 32
        g0, g1, m0, warp, g, t = block_split(K // GROUP, bm)
        nb = cuda.blockIdx.x * BN + warp * (8 * NT) + g  # this lane's row of tile 0
        w0 = min(nb, N - 1) * cpr + t
        w1 = min(nb + 8, N - 1) * cpr + t
        w2 = min(nb + 16, N - 1) * cpr + t
        w3 = min(nb + 24, N - 1) * cpr + t
        smem = cuda.shared.array(smem_words, uint32, alignment=SMEM_ALIGN)
        base = ptx.smem_addr(smem, 0)
        acc = cuda.local.array(n_acc, float32)
        for i in range(n_acc):
            acc[i] = float32(0.0)
        bregs = cuda.local.array(n_b, uint32)
        load_a(base, a, m0, g0)
        ptx.cp_async_commit()
        c = 4 * g0
        x0 = load(parts, w0 + c)
        x1 = load(parts, w1 + c)
        x2 = load(parts, w2 + c)
        x3 = load(parts, w3 + c)
        for grp in range(g0, g1):
            cur = (grp - g0) & 1
            c = 4 * grp
            cn = 4 * min(grp + 1, g1 - 1)
            if grp + 1 < g1:
                load_a(base + (1 - cur) * sbytes, a, m0, grp + 1)
            ptx.cp_async_commit()
            y0 = load(parts, w0 + cn)
            y1 = load(parts, w1 + cn)
            y2 = load(parts, w2 + cn)
            y3 = load(parts, w3 + cn)
            decode(x0, c + t, bregs, 0)
            decode(x1, c + t, bregs, 16)
            decode(x2, c + t, bregs, 32)
            decode(x3, c + t, bregs, 48)
            ptx.cp_async_wait_group(1)
            cuda.syncthreads()
            multiply(base + cur * sbytes, grp, c + t, bregs, acc)
            cuda.syncthreads()  # the stage is rewritten at the next group's prefetch
            x0, x1, x2, x3 = y0, y1, y2, y3
        # -- epilogue: lane holds rows g, g + 8 of each m tile at columns 2t, 2t + 1 of each n tile --
        col0 = nb - g + 2 * t
        for m in range(mt):
            for half in range(2):
                row = m0 + 16 * m + g + 8 * half
                if row < M:
                    for i in range(NT):
                        n = col0 + 8 * i
                        if n < N:
                            o = 4 * (m * NT + i) + 2 * half
                            ptx.st_global_v2_f32(part, (s * M + row) * N + n, acc[o], acc[o + 1])

    return _gemm_few_kernel


def mt_for(M: int) -> int:
    """m16 tiles a block for M rows: 1, 2 or 4 (M > 64 in 64-row slabs)."""
    return 1 if M <= 16 else 2 if M <= 32 else MAX_MT


def splits_for(M: int, N: int, K: int, sms: int = 132) -> int:
    """Splits that bring the grid to about two blocks an SM, each at least two groups deep (three
    an SM was 1.1-2.4x slower on the Qwen3-8B shapes at 16..128 rows: more partials to add, no
    more W in flight; scripts/bench_gemm_few.py)."""
    blocks = -(-N // BN) * -(-M // (16 * mt_for(M)))
    return max(1, min(-(-2 * sms // blocks), K // GROUP // 2))


def supports(ggml_type, K: int) -> bool:
    t = T(ggml_type)
    return t in QUANT_TYPES and K % max(GROUP, GGML_QUANT_SIZES[t][0]) == 0


def _launch(a, w: PackedWeight, ys, n0: int, n1: int, part, stream, splits: int, accumulate: bool,
            reduce: bool = True):
    N, K = w.rows, w.cols
    M = a.shape[0]
    assert a.dtype == np.float16 and a.shape == (M, K) and a.is_c_contiguous() and N % 8 == 0
    for y in ys:
        assert y.dtype == np.float32 and y.is_c_contiguous() and y.shape[0] == M
    assert supports(w.ggml_type, K), f"no few-row GEMM for {T(w.ggml_type).name} at K={K}"
    assert 1 <= splits <= K // GROUP, f"{splits} splits of {K // GROUP} groups"
    assert part.dtype == np.float32 and part.shape == (splits, M, N) and part.is_c_contiguous()
    mt = mt_for(M)
    launch(gemm_few_kernel(T(w.ggml_type), mt), (-(-N // BN), splits, -(-M // (16 * mt))), THREADS, stream,
           a, w.parts, part)
    if reduce:
        reduce_parts(part, ys, n0, n1, accumulate, stream)


def gemm_few(a, w: PackedWeight, c, part, stream, splits: int, accumulate: bool = False, reduce: bool = True):
    """c (M, N) float32 = a (M, K) fp16 · dequant(w)ᵀ (c += with accumulate) in `splits` K parts;
    part: a float32 scratch (splits, M, N); reduce=False leaves the partial products there (c
    untouched, for a reduce of the caller's: reduce_glu)."""
    check_shapes(a, c, w.rows, w.cols)
    _launch(a, w, (c, c, c), w.rows, 0, part, stream, splits, accumulate, reduce)


def gemm_few_split(a, w: PackedWeight, ys, part, stream, splits: int, reduce: bool = True):
    """Rows of W stacked from up to three matrices (Q|K|V): ys[i] (M, N_i) = a · dequant(W rows of i)ᵀ,
    each N_i a multiple of 4; part and reduce as in gemm_few."""
    assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows and all(y.shape[1] % 4 == 0 for y in ys)
    y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
    n0, n1 = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0
    _launch(a, w, (y0, y1, y2), n0, n1, part, stream, splits, False, reduce)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (gemm_few_kernel(t, mt), types.void(F16_2D, parts_type(t), F32_3D), {"max_registers": 255})
        for t in QUANT_TYPES for mt in (1, 2, 4)
    ]
