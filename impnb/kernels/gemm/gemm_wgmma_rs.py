"""wgmma GEMM with the weights in registers (W the m64 operand, decoded straight into wgmma's A
fragments; the tokens the n operand from shared memory) for a batched decode step's 9..128 rows:
C (M, N) float32 = A (M, K) fp16 · dequant(W)ᵀ, Q4_K and Q6_K, split along K: gemm_dispatch's path
"wrs", taken where tune_gemm's table measured it fastest (scripts/bench_gemm_few.py --kernels wrs3
times it alone against gemm_mmq and gemm_wgmma_few).

gemm_wgmma_few decodes W into shared memory as wgmma's B operand (a store and a barrier a step
for every weight); here each lane's raw quants become its A fragments in registers and the
hardware reads the few token rows from shared memory, so a weight costs its decode alone.

Layout: a 64-column K step of a W row is one Q4_K sub-block pair (32 qs bytes); lane (g, t) of
warp w holds rows 16 w + g and + 8 of each of the block's MT m64 tiles, bytes 8t .. 8t + 7 of the
pair: columns 8t .. 8t + 7 (low nibbles) and 32 + 8t .. (high). Its f16x2 pairs (quant_blocks_k's
q4_word: q * fp16(d sc) + fp16(-dmin m)) fill the fragments' k slots in the order perm_columns
gives, so A must hold its columns permuted the same way (permute_a; a cast kernel writing that
order: cast_f16_perm and reduce_glu's perm form); the kernel reads A as given.

Two forms: gemm_wgmma_rs_kernel holds one step of raw W ahead in registers, the tokens in a
STAGES-deep cp.async ring; gemm_wgmma_rs_staged_kernel stages each step's tokens, W quants and
superblock headers together by cp.async, `stages` steps deep (3 measured best: more blocks an SM).
Each step: the lane's four rows decoded, eight wgmma m64nNTk16 (A in registers, B K-major), then
waited before the next step's decode overwrites the registers.

Grid (ceil(N / (64 MT)), S, ceil(M / NT)), block 128 (one warpgroup); part (S, M, N) the split's
partial products, added by gemm_quant_splitk's reduce.
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, int32, uint32

from impnb.kernels.common import ptx, ptx_wgmma as wg
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.quant_blocks_k import h2, k_scales, q4_word, q6_pairs
from impnb.kernels.gemm.gemm_quant_splitk import reduce_parts
from impnb.launch import launch

THREADS = 128
MT = 2          # m64 tiles of W a block
STAGES = 4      # token stages in flight
WAIT = STAGES - 2  # cp.async groups left in flight when a step starts
ALIGN = 1024
SMEM_ALIGN = ptx.SMEM_ALIGN


def perm_columns() -> np.ndarray:
    """perm[q]: the column (of a 64-column step) at fragment position q = 16 kk + 8 j + 2 t + e."""
    q = np.arange(64)
    kk, j, t, e = q // 16, (q % 16) // 8, (q % 8) // 2, q % 2
    return 32 * (kk // 2) + 8 * t + 4 * (kk % 2) + 2 * j + e


def permute_a(a: np.ndarray) -> np.ndarray:
    """A (M, K) with each 64-column step's columns in perm_columns' order."""
    M, K = a.shape
    return np.ascontiguousarray(a.reshape(M, K // 64, 64)[:, :, perm_columns()].reshape(M, K))


if not wg.SIM:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from impnb.kernels.common.ptx import inline_asm

    def _mma_rs_k(n):
        text = (f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 "
                "{" + ", ".join(f"${i}" for i in range(n // 2)) + "}, "
                "{" + ", ".join(f"${n + i}" for i in range(4)) + "}, "
                f"${n + 4}, 1, 1, 1, 0;")
        constraints = ",".join(["=f"] * (n // 2) + [str(i) for i in range(n // 2)] + ["r"] * 4 + ["l", "~{memory}"])

        @intrinsic
        def mma(typingctx, acc, a0, a1, a2, a3, db):
            """acc (n/2 float32) += A (registers) · B (K-major descriptor db), asynchronously."""
            def codegen(context, builder, sig, args):
                data = context.make_array(sig.args[0])(context, builder, args[0]).data
                ptrs = [builder.gep(data, [ir.IntType(64)(i)]) for i in range(n // 2)]
                vals = [builder.load(p) for p in ptrs]
                regs = [builder.trunc(a, ir.IntType(32)) if a.type.width > 32 else a for a in args[1:5]]
                desc = builder.zext(args[5], ir.IntType(64)) if args[5].type.width < 64 else args[5]
                res = inline_asm(builder, ir.LiteralStructType([ir.FloatType()] * (n // 2)), vals + regs + [desc],
                                 text, constraints, side_effect=True)
                for i, p in enumerate(ptrs):
                    builder.store(builder.extract_value(res, i), p)
                return context.get_dummy_value()
            return types.void(acc, a0, a1, a2, a3, db), codegen
        return mma

    MMA_RS_K = {n: _mma_rs_k(n) for n in (16, 32, 64, 128)}


@cuda.jit(device=True, inline=True)
def q4_row_pairs(w0, w1, e0, e1, e2, e3, s):
    """A lane's 8 f16x2 pairs of one W row at 64-column step s, in fragment slot order (kk, j):
    its quant words w0, w1 (bytes 8t .. 8t + 7 of the sub-block pair) under the superblock
    header e0..e3 (d, dmin, the 6-bit scales and mins)."""
    sc0, mn0, sc1, mn1 = k_scales((e0, e1, e2, e3), 2 * (s & 3))
    d = qi.f16_to_f32(e0 & qi.HALF)
    dm = qi.f16_to_f32(e0 >> 16)
    ls, lm, hs, hm = h2(d * sc0), h2(-(dm * mn0)), h2(d * sc1), h2(-(dm * mn1))
    a0, a1, b0, b1 = q4_word(w0, ls, lm, hs, hm)
    c0, c1, f0, f1 = q4_word(w1, ls, lm, hs, hm)
    return a0, a1, c0, c1, b0, b1, f0, f1


def nt_for(M: int) -> int:
    return 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128


@lru_cache(maxsize=None)
def gemm_wgmma_rs_kernel(nt: int):
    coords, store, tokens, mma8 = _block_io(nt)
    na = nt // 2               # accumulators a tile
    sbytes = nt * 128          # a token stage

    @cuda.jit(device=True, inline=True)
    def row_raw(qs, hdr, r, K, s, t):
        w0, w1 = qi.ldg_u32x2(qs, r * (K // 8) + 8 * s + 2 * t)
        e0, e1, e2, e3 = qi.ldg_u32x4_l1(hdr, 4 * (r * (K // 256) + (s >> 2)))
        return w0, w1, e0, e1, e2, e3

    @cuda.jit(device=True, inline=True)
    def row_frags(raw, s):
        # -- one row's 8 f16x2 pairs of this step, in slot order (kk, j) --
        w0, w1, e0, e1, e2, e3 = raw
        return q4_row_pairs(w0, w1, e0, e1, e2, e3, s)

    @cuda.jit
    def kernel(a, qs, hdr, part):
        ptx.grid_dep_wait()
        ptx.grid_dep_launch()
        M, K = a.shape
        N = part.shape[2]
        sp, k0, k1, m0, warp, g, t, n0, base = coords(cuda.blockIdx.x, K // 64)
        for i in range(STAGES - 1):
            if k0 + i < k1:
                tokens(base + i * sbytes, a, m0, M, K, k0 + i)
            ptx.cp_async_commit()
        acc0 = cuda.local.array(na, float32)
        acc1 = cuda.local.array(na, float32)
        for i in range(na):
            acc0[i] = float32(0.0)
            acc1[i] = float32(0.0)
        r0 = min(n0 + 16 * warp + g, N - 1)
        r1 = min(n0 + 16 * warp + g + 8, N - 1)
        r2 = min(n0 + 64 + 16 * warp + g, N - 1)
        r3 = min(n0 + 64 + 16 * warp + g + 8, N - 1)
        x0 = row_raw(qs, hdr, r0, K, k0, t)
        x1 = row_raw(qs, hdr, r1, K, k0, t)
        x2 = row_raw(qs, hdr, r2, K, k0, t)
        x3 = row_raw(qs, hdr, r3, K, k0, t)
        for s in range(k0, k1):
            sn = min(s + 1, k1 - 1)
            y0 = row_raw(qs, hdr, r0, K, sn, t)
            y1 = row_raw(qs, hdr, r1, K, sn, t)
            y2 = row_raw(qs, hdr, r2, K, sn, t)
            y3 = row_raw(qs, hdr, r3, K, sn, t)
            i = s - k0
            ptx.cp_async_wait_group(WAIT)
            cuda.syncthreads()  # step s's tokens landed; every warp's wgmmas of step s - 1 done
            if s + STAGES - 1 < k1:
                tokens(base + ((i + STAGES - 1) % STAGES) * sbytes, a, m0, M, K, s + STAGES - 1)
            ptx.cp_async_commit()
            desc = wg.desc_sw128(base + (i % STAGES) * sbytes)
            mma8(acc0, acc1, row_frags(x0, s), row_frags(x1, s), row_frags(x2, s),
                 row_frags(x3, s), desc)
            x0, x1, x2, x3 = y0, y1, y2, y3
        ptx.cp_async_wait_all()
        store(part, acc0, acc1, sp, m0, n0 + 16 * warp + g, t, M, N, 0)

    kernel.__name__ = f"_gemm_wgmma_rs_q4_k_n{nt}_kernel"
    return kernel


def shared_bytes(nt: int, staged: int = 0) -> int:
    return (staged * slot_bytes(nt) if staged else STAGES * nt * 128) + ALIGN


W_SLOT = 128 * 32   # a step's W quants (128 rows of 32 bytes)
H_SLOT = 128 * 16   # their superblock headers


def slot_bytes(nt: int) -> int:
    return nt * 128 + W_SLOT + H_SLOT


@lru_cache(maxsize=None)
def gemm_wgmma_rs_staged_kernel(nt: int, stages: int = 6):
    """As gemm_wgmma_rs_kernel, with each step's W quants and headers staged by cp.async beside its
    tokens, `stages` steps deep, where the registers held one step of W ahead."""
    body = _q4_k_body(nt, stages)

    @cuda.jit
    def kernel(a, qs, hdr, part):
        body(a, qs, hdr, part, cuda.blockIdx.x, 0, part.shape[2])

    kernel.__name__ = f"_gemm_wgmma_rs_staged_q4_k_n{nt}_s{stages}_kernel"
    return kernel


@lru_cache(maxsize=None)
def _block_io(nt: int):
    """Device functions the staged kernels share: coords(bx, KT) -> (split sp, its steps k0 .. k1
    of KT, first token m0, warp, lane's g and t, first W row n0 of block bx, the dynamic shared
    memory's aligned base); store(part, acc0, acc1, sp, m0, row0, t, M, N, col0): the lane's
    accumulators (register i of tile u: W row row0 + 64 u + 8 ((i >> 1) & 1), token m0 + 8 (i >> 2)
    + 2 t + (i & 1)) to part's columns col0 + row, rows below N and tokens below M; mma8: a step's
    eight wgmmas; tokens: a 64-column step's token tile staged."""
    na = nt // 2
    mma = MMA_RS_K[nt]
    units = nt * 8 // THREADS  # 16-byte token copies a thread a step (nt >= 16)

    @cuda.jit(device=True, inline=True)
    def coords(bx, KT):
        S = cuda.gridDim.y
        sp = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        lane = tid & 31
        smem = cuda.shared.array(0, uint32, alignment=SMEM_ALIGN)
        base = (ptx.smem_addr(smem, 0) + uint32(ALIGN - 1)) & uint32(~(ALIGN - 1) & 0xFFFFFFFF)
        return (sp, sp * KT // S, (sp + 1) * KT // S, cuda.blockIdx.z * nt, tid >> 5, lane >> 2, lane & 3,
                bx * 64 * MT, base)

    @cuda.jit(device=True, inline=True)
    def store(part, acc0, acc1, sp, m0, row0, t, M, N, col0):
        for i in range(na):
            row = row0 + 8 * ((i >> 1) & 1)
            tok = m0 + 8 * (i >> 2) + 2 * t + (i & 1)
            if tok < M:
                if row < N:
                    part[sp, tok, col0 + row] = acc0[i]
                if row + 64 < N:
                    part[sp, tok, col0 + row + 64] = acc1[i]

    @cuda.jit(device=True, inline=True)
    def tokens(dst, a, m0, M, K, s):
        # -- the nt token rows' 64 columns of step s into a swizzled (128-byte) tile at dst by
        #    cp.async; rows past M zero-filled --
        tid = cuda.threadIdx.x
        for i in range(units):
            u = tid + THREADS * i
            r = u >> 3
            ch = u & 7
            row = m0 + r
            ok = row < M
            ptx.cp_async_16_zfill(dst + r * 128 + ((ch ^ (r & 7)) << 4), a,
                                  (row if ok else m0) * K + 64 * s + 8 * ch, 16 if ok else 0)

    @cuda.jit(device=True, inline=True)
    def mma8(acc0, acc1, p0, p1, p2, p3, desc):
        # -- a 64-column step of both m64 tiles from four rows' 8 pairs each (rows l0, l0 + 8 of
        #    tile 0; l0 + 64, l0 + 72 of tile 1), the tokens at descriptor desc; waited --
        wg.wgmma_fence()
        mma(acc0, p0[0], p1[0], p0[1], p1[1], desc)
        mma(acc0, p0[2], p1[2], p0[3], p1[3], desc + 2)
        mma(acc0, p0[4], p1[4], p0[5], p1[5], desc + 4)
        mma(acc0, p0[6], p1[6], p0[7], p1[7], desc + 6)
        mma(acc1, p2[0], p3[0], p2[1], p3[1], desc)
        mma(acc1, p2[2], p3[2], p2[3], p3[3], desc + 2)
        mma(acc1, p2[4], p3[4], p2[5], p3[5], desc + 4)
        mma(acc1, p2[6], p3[6], p2[7], p3[7], desc + 6)
        wg.wgmma_commit()
        wg.wgmma_wait(0)

    return coords, store, tokens, mma8


@lru_cache(maxsize=None)
def _q4_k_body(nt: int, stages: int):
    """The staged Q4_K kernel's work as a device function: block bx of W's rows (N of them), its
    partial products to part's columns col0 ..."""
    coords, store, tokens, mma8 = _block_io(nt)
    na = nt // 2
    sb = slot_bytes(nt)
    ahead = stages - 1
    wait = stages - 2

    @cuda.jit(device=True, inline=True)
    def stage(dst, a, qs, hdr, m0, n0, M, N, K, s):
        tokens(dst, a, m0, M, K, s)
        tid = cuda.threadIdx.x
        wdst = dst + nt * 128
        for i in range(2):
            u = tid + THREADS * i
            r = u >> 1
            wr = min(n0 + r, N - 1)
            ptx.cp_async_16(wdst + r * 32 + 16 * (u & 1), qs, wr * (K // 8) + 8 * s + 4 * (u & 1))
        ptx.cp_async_16(wdst + W_SLOT + tid * 16, hdr, 4 * (min(n0 + tid, N - 1) * (K // 256) + (s >> 2)))

    @cuda.jit(device=True, inline=True)
    def row_frags(wsl, lr, t, s):
        w0, w1 = ptx.ld_shared_v2_u32(wsl + lr * 32 + 8 * t)
        e0, e1, e2, e3 = ptx.ld_shared_v4_u32(wsl + W_SLOT + lr * 16)
        return q4_row_pairs(w0, w1, e0, e1, e2, e3, s)

    @cuda.jit(device=True, inline=True)
    def body(a, qs, hdr, part, bx, col0, N):
        ptx.grid_dep_wait()
        ptx.grid_dep_launch()
        M, K = a.shape
        sp, k0, k1, m0, warp, g, t, n0, base = coords(bx, K // 64)
        for i in range(ahead):
            if k0 + i < k1:
                stage(base + i * sb, a, qs, hdr, m0, n0, M, N, K, k0 + i)
            ptx.cp_async_commit()
        acc0 = cuda.local.array(na, float32)
        acc1 = cuda.local.array(na, float32)
        for i in range(na):
            acc0[i] = float32(0.0)
            acc1[i] = float32(0.0)
        l0 = 16 * warp + g
        for s in range(k0, k1):
            i = s - k0
            ptx.cp_async_wait_group(wait)
            cuda.syncthreads()  # step s's slot landed; every warp's wgmmas of step s - 1 done
            if s + ahead < k1:
                stage(base + ((i + ahead) % stages) * sb, a, qs, hdr, m0, n0, M, N, K, s + ahead)
            ptx.cp_async_commit()
            sl = base + (i % stages) * sb
            desc = wg.desc_sw128(sl)
            wsl = sl + nt * 128
            mma8(acc0, acc1, row_frags(wsl, l0, t, s), row_frags(wsl, l0 + 8, t, s), row_frags(wsl, l0 + 64, t, s),
                 row_frags(wsl, l0 + 72, t, s), desc)
        ptx.cp_async_wait_all()
        store(part, acc0, acc1, sp, m0, n0 + 16 * warp + g, t, M, N, col0)

    return body


def _launch(a_perm, w, part, stream, splits: int, staged: int) -> None:
    M, K = a_perm.shape
    N = w.rows
    q6 = T(w.ggml_type) == T.Q6_K
    assert supports(w.ggml_type, K) and w.cols == K and 1 <= splits <= K // (128 if q6 else GROUP), \
        f"no register-operand wgmma GEMM for {T(w.ggml_type).name} {N}x{K}, {splits} splits"
    assert part.shape == (splits, M, N) and a_perm.dtype == np.float16 and a_perm.is_c_contiguous()
    nt = nt_for(M)
    grid = (-(-N // (64 * MT)), splits, -(-M // nt))
    if q6:
        launch(gemm_wgmma_rs_q6_k_kernel(nt, 3), grid, THREADS, stream, a_perm, *w.parts, part,
               shared_bytes=3 * (nt * 256 + Q6_SLOT) + ALIGN)
        return
    kernel = gemm_wgmma_rs_staged_kernel(nt, staged) if staged else gemm_wgmma_rs_kernel(nt)
    launch(kernel, grid, THREADS, stream, a_perm, w.parts[0], w.parts[1], part, shared_bytes=shared_bytes(nt, staged))


def gemm_wgmma_rs(a_perm, w, c, part, stream, splits: int, accumulate: bool = False, reduce: bool = True,
                  staged: int = 3):
    """c (M, N) float32 = a · dequant(w)ᵀ (c += with accumulate) from a_perm = a with permute_a's
    columns (fp16, device); part: a float32 scratch (splits, M, N), where reduce=False leaves the
    partial products (c untouched); staged: the staged kernel's depth (0: W ahead in registers)."""
    _launch(a_perm, w, part, stream, splits, staged)
    if reduce:
        reduce_parts(part, (c, c, c), w.rows, 0, accumulate, stream)


def gemm_wgmma_rs_split(a_perm, w, ys, part, stream, splits: int):
    """Rows of W stacked from up to three matrices (Q|K|V): ys[i] (M, N_i) = a · dequant(W rows of
    i)ᵀ, each N_i a multiple of 4; a_perm, part as in gemm_wgmma_rs."""
    assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows and all(y.shape[1] % 4 == 0 for y in ys)
    y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
    n0, n1 = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0
    _launch(a_perm, w, part, stream, splits, 3)
    reduce_parts(part, (y0, y1, y2), n0, n1, False, stream)


def gemm_wgmma_rs_pair(a_perm, w1, w2, ys, part, stream, splits: int):
    """A Q4_K matrix w1 (Q|K: ys[0], ys[1] its rows in turn) and a Q6_K matrix w2 (V: ys[2]) of
    the same input width in one launch (gemm_wgmma_rs_pair_kernel), then one split-K reduce:
    ys[i] (M, N_i) = a · dequant(rows of i)ᵀ; part a float32 scratch (splits, M, w1.rows + w2.rows)."""
    M, K = a_perm.shape
    y0, y1, y2 = ys
    n0, n1 = y0.shape[1], y1.shape[1]
    assert pair_supports(w1.ggml_type, w2.ggml_type, K) and w1.cols == K and w2.cols == K
    assert n0 + n1 == w1.rows and y2.shape[1] == w2.rows and all(y.shape[1] % 4 == 0 for y in ys)
    assert 1 <= splits <= K // 128 and part.shape == (splits, M, w1.rows + w2.rows)
    assert a_perm.dtype == np.float16 and a_perm.is_c_contiguous()
    nt = nt_for(M)
    nb1 = -(-w1.rows // (64 * MT))
    grid = (nb1 + -(-w2.rows // (64 * MT)), splits, -(-M // nt))
    launch(gemm_wgmma_rs_pair_kernel(nt), grid, THREADS, stream, a_perm, *w1.parts[:2], *w2.parts, part,
           np.int32(nb1), np.int32(w1.rows), shared_bytes=max(shared_bytes(nt, 3), 3 * (nt * 256 + Q6_SLOT) + ALIGN))
    reduce_parts(part, (y0, y1, y2), n0, n1, False, stream)


def pair_supports(type1, type2, K: int) -> bool:
    """Whether gemm_wgmma_rs_pair takes a Q|K of type1 and a V of type2 of input width K."""
    return T(type1) == T.Q4_K and T(type2) == T.Q6_K and K % 256 == 0


GROUP = 64  # K columns a step (the split unit)


def supports(ggml_type, K: int) -> bool:
    return T(ggml_type) in (T.Q4_K, T.Q6_K) and K % 256 == 0


def splits_for(M: int, N: int, K: int, sms: int = 132) -> int:
    """About three blocks an SM, each split at least 512 columns deep (from the sweep of
    scripts/bench_gemm_few.py --kernels wrs3 over the synthetic Qwen3-8B's Q4_K shapes; its own
    counts not yet measured at every shape)."""
    blocks = -(-N // (64 * MT)) * -(-M // nt_for(M))
    return max(1, min(round(3 * sms / blocks), K // 512))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    if wg.SIM:
        return []
    from numba import types

    from impnb.kernels.gemv.gemv import parts_type

    qs_t, hdr_t = parts_type(T.Q4_K)
    sig = types.void(types.Array(types.float16, 2, "C"), qs_t, hdr_t, types.Array(types.float32, 3, "C"))
    return [(gemm_wgmma_rs_staged_kernel(nt, 3), sig,
             {"ptx_contains": [f"wgmma.mma_async.sync.aligned.m64n{nt}k16.f32.f16.f16"], "max_registers": 168})
            for nt in (16, 32, 64)] + [(gemm_wgmma_rs_kernel(16), sig, {"max_registers": 168})] + [
        (gemm_wgmma_rs_q6_k_kernel(nt, 3), types.void(types.Array(types.float16, 2, "C"), *parts_type(T.Q6_K),
                                                      types.Array(types.float32, 3, "C")), {"max_registers": 255})
        for nt in (16, 32, 64)] + [
        (gemm_wgmma_rs_pair_kernel(nt), types.void(types.Array(types.float16, 2, "C"), qs_t, hdr_t,
                                                   *parts_type(T.Q6_K), types.Array(types.float32, 3, "C"),
                                                   types.int32, types.int32), {"max_registers": 255})
        for nt in (16, 32, 64)]


@cuda.jit(device=True, inline=True)
def _s8(word, b):
    # byte b of word as a signed int32
    v = int32(qi.shr32(word, 8 * b) & 0xFF)
    return int32(v - 256) if v > 127 else v


Q6_SLOT = 128 * (64 + 32 + 16)  # a 128-column step's ql (64 bytes a row), qh (32) and the superblock's scales (16)


@lru_cache(maxsize=None)
def gemm_wgmma_rs_q6_k_kernel(nt: int, stages: int = 3):
    """The staged form for Q6_K, a step 128 columns (half a superblock: ql bytes i and 32 + i and qh
    byte i hold columns i, + 32, + 64, + 96): lane (g, t) takes the same columns of each 64-column
    half as of a Q4_K step (8t .., 32 + 8t ..; low nibbles and qh bits 0-3 the first half, high
    nibbles and bits 4-7 the second), so A's permutation is Q4_K's; two sets of 8 wgmmas a step,
    the tokens' 128 columns as two 64-column swizzled tiles."""
    body = _q6_k_body(nt, stages)

    @cuda.jit
    def kernel(a, ql, qh, sc, dsb, part):
        body(a, ql, qh, sc, dsb, part, cuda.blockIdx.x, 0, part.shape[2])

    kernel.__name__ = f"_gemm_wgmma_rs_q6_k_n{nt}_s{stages}_kernel"
    return kernel


@lru_cache(maxsize=None)
def gemm_wgmma_rs_pair_kernel(nt: int):
    """Q4_K rows (Q|K) and Q6_K rows (a layer's V) in one launch, three stages deep: blocks below
    nb1 take the Q4_K weight's rows to part's first n1 columns, the others the Q6_K weight's to
    the rest (one grid, so the two run side by side; each block the shared memory of the larger)."""
    body4 = _q4_k_body(nt, 3)
    body6 = _q6_k_body(nt, 3)

    @cuda.jit
    def kernel(a, qs, hdr, ql, qh, sc, dsb, part, nb1, n1):
        bx = cuda.blockIdx.x
        if bx < nb1:
            body4(a, qs, hdr, part, bx, 0, n1)
        else:
            body6(a, ql, qh, sc, dsb, part, bx - nb1, n1, part.shape[2] - n1)

    kernel.__name__ = f"_gemm_wgmma_rs_pair_q4_k_q6_k_n{nt}_kernel"
    return kernel


@lru_cache(maxsize=None)
def _q6_k_body(nt: int, stages: int):
    """The Q6_K kernel's work as a device function (as _q4_k_body)."""
    coords, store, tokens, mma8 = _block_io(nt)
    na = nt // 2
    tb = nt * 256              # a step's tokens: two tiles of nt rows x 128 bytes
    sb = tb + Q6_SLOT
    ahead = stages - 1
    wait = stages - 2
    units = nt * 16 // THREADS  # 16-byte token copies a thread a step

    @cuda.jit(device=True, inline=True)
    def stage(dst, a, ql, qh, sc, m0, n0, M, N, K, s):
        tid = cuda.threadIdx.x
        for i in range(units):
            u = tid + THREADS * i
            r = u >> 4
            ch = u & 15  # 16-byte chunk of the row's 128 columns: tile ch >> 3, chunk ch & 7
            row = m0 + r
            ok = row < M
            ptx.cp_async_16_zfill(dst + (ch >> 3) * nt * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4), a,
                                  (row if ok else m0) * K + 128 * s + 8 * ch, 16 if ok else 0)
        wdst = dst + tb
        for i in range(4):  # ql: 4 copies a row
            u = tid + THREADS * i
            r = u >> 2
            wr = min(n0 + r, N - 1)
            ptx.cp_async_16(wdst + r * 64 + 16 * (u & 3), ql, wr * (K // 8) + 16 * s + 4 * (u & 3))
        for i in range(2):  # qh: 2 a row
            u = tid + THREADS * i
            r = u >> 1
            wr = min(n0 + r, N - 1)
            ptx.cp_async_16(wdst + 128 * 64 + r * 32 + 16 * (u & 1), qh, wr * (K // 16) + 8 * s + 4 * (u & 1))
        ptx.cp_async_16(wdst + 128 * 96 + tid * 16, sc, min(n0 + tid, N - 1) * (K // 16) + 16 * (s >> 1))

    @cuda.jit(device=True, inline=True)
    def row_frags(wsl, lr, t, s, d, hi):
        # -- one row's 8 f16x2 pairs of half `hi` of step s, in slot order (kk, j) --
        l0, l1 = ptx.ld_shared_v2_u32(wsl + lr * 64 + 8 * t)
        l2, l3 = ptx.ld_shared_v2_u32(wsl + lr * 64 + 32 + 8 * t)
        q0, q1 = ptx.ld_shared_v2_u32(wsl + 128 * 64 + lr * 32 + 8 * t)
        sw = ptx.ld_shared_u32(wsl + 128 * 96 + lr * 16 + 8 * (s & 1) + 4 * hi)  # this half's scales 4 hi ..
        ls = h2(d * float32(_s8(sw, t >> 1)))
        hs = h2(d * float32(_s8(sw, 2 + (t >> 1))))
        sh = 4 * hi  # ql's nibble; qh's bits 4 hi .. (columns 8t ..) and 4 hi + 2 .. (32 + 8t ..)
        a0, a1 = q6_pairs((qi.shr32(l0, sh) & qi.LO4) | ((qi.shr32(q0, sh) & qi.LO2) << 4), ls)
        c0, c1 = q6_pairs((qi.shr32(l1, sh) & qi.LO4) | ((qi.shr32(q1, sh) & qi.LO2) << 4), ls)
        b0, b1 = q6_pairs((qi.shr32(l2, sh) & qi.LO4) | ((qi.shr32(q0, sh + 2) & qi.LO2) << 4), hs)
        f0, f1 = q6_pairs((qi.shr32(l3, sh) & qi.LO4) | ((qi.shr32(q1, sh + 2) & qi.LO2) << 4), hs)
        return a0, a1, c0, c1, b0, b1, f0, f1

    @cuda.jit(device=True, inline=True)
    def half(acc0, acc1, wsl, l0, t, s, dd, hi, desc):
        d0, d1, d2, d3 = dd
        p0 = row_frags(wsl, l0, t, s, d0, hi)
        p1 = row_frags(wsl, l0 + 8, t, s, d1, hi)
        p2 = row_frags(wsl, l0 + 64, t, s, d2, hi)
        p3 = row_frags(wsl, l0 + 72, t, s, d3, hi)
        mma8(acc0, acc1, p0, p1, p2, p3, desc)

    @cuda.jit(device=True, inline=True)
    def body(a, ql, qh, sc, dsb, part, bx, col0, N):
        ptx.grid_dep_wait()
        ptx.grid_dep_launch()
        M, K = a.shape
        sp, k0, k1, m0, warp, g, t, n0, base = coords(bx, K // 128)
        for i in range(ahead):
            if k0 + i < k1:
                stage(base + i * sb, a, ql, qh, sc, m0, n0, M, N, K, k0 + i)
            ptx.cp_async_commit()
        acc0 = cuda.local.array(na, float32)
        acc1 = cuda.local.array(na, float32)
        for i in range(na):
            acc0[i] = float32(0.0)
            acc1[i] = float32(0.0)
        l0 = 16 * warp + g
        r0 = min(n0 + l0, N - 1)
        r1 = min(n0 + l0 + 8, N - 1)
        r2 = min(n0 + l0 + 64, N - 1)
        r3 = min(n0 + l0 + 72, N - 1)
        for s in range(k0, k1):
            i = s - k0
            sbk = s >> 1
            dd = (float32(dsb[r0 * (K // 256) + sbk]), float32(dsb[r1 * (K // 256) + sbk]),
                  float32(dsb[r2 * (K // 256) + sbk]), float32(dsb[r3 * (K // 256) + sbk]))
            ptx.cp_async_wait_group(wait)
            cuda.syncthreads()  # step s's slot landed; every warp's wgmmas of step s - 1 done
            if s + ahead < k1:
                stage(base + ((i + ahead) % stages) * sb, a, ql, qh, sc, m0, n0, M, N, K, s + ahead)
            ptx.cp_async_commit()
            sl = base + (i % stages) * sb
            half(acc0, acc1, sl + tb, l0, t, s, dd, 0, wg.desc_sw128(sl))
            half(acc0, acc1, sl + tb, l0, t, s, dd, 1, wg.desc_sw128(sl + nt * 128))
        ptx.cp_async_wait_all()
        store(part, acc0, acc1, sp, m0, n0 + 16 * warp + g, t, M, N, col0)

    return body
