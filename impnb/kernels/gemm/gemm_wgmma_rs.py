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
order: cast_f16's and reduce_glu's perm forms); the kernel reads A as given.

Each step's tokens, W quants and superblock headers are staged together by cp.async, `stages`
steps deep (3 measured best: more blocks an SM); then the lane's four rows decoded, eight wgmma
m64nNTk16 (A in registers, B K-major), waited before the next step's decode overwrites the
registers. Q6_K's kernel is gemm_wgmma_rs_q6_k.py's; what both share, gemm_wgmma_rs_block.py's;
gemm_wgmma_rs_pair runs a Q4_K and a Q6_K matrix in one grid.

Grid (ceil(N / (64 MT)), S, ceil(M / NT)), block 128 (one warpgroup); part (S, M, N) the split's
partial products, added by gemm_quant_splitk's reduce.
"""

from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32

from impnb import tuning
from impnb.kernels.common import ptx, ptx_wgmma as wg
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.quant_blocks_k import h2, k_scales, q4_word
from impnb.kernels.gemm import gemm_wgmma_rs_q6_k as q6_k
from impnb.kernels.gemm.gemm_quant_splitk import reduce_parts
from impnb.kernels.gemm.gemm_wgmma_rs_block import ALIGN, MT, THREADS, block_io, nt_for, ring
from impnb.kernels.gemm.gemm_wgmma_rs_q6_k import gemm_wgmma_rs_q6_k_kernel, q6_k_body
from impnb.launch import launch


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


W_SLOT = 128 * 32   # a step's W quants (128 rows of 32 bytes)
H_SLOT = 128 * 16   # their superblock headers


def slot_bytes(nt: int) -> int:
    return nt * 128 + W_SLOT + H_SLOT


def shared_bytes(nt: int, stages: int) -> int:
    return stages * slot_bytes(nt) + ALIGN


@lru_cache(maxsize=None)
def gemm_wgmma_rs_staged_kernel(nt: int, stages: int = 6):
    """The Q4_K kernel (a, qs, hdr, part) for token tiles of nt rows, each step's tokens, W quants
    and superblock headers staged by cp.async `stages` steps deep."""
    body = _q4_k_body(nt, stages)

    @cuda.jit
    def kernel(a, qs, hdr, part):
        body(a, qs, hdr, part, cuda.blockIdx.x, 0, part.shape[2])

    kernel.__name__ = f"_gemm_wgmma_rs_staged_q4_k_n{nt}_s{stages}_kernel"
    return kernel


@lru_cache(maxsize=None)
def _q4_k_body(nt: int, stages: int):
    """The Q4_K kernel's work as a device function body(a, qs, hdr, part, bx, col0, N): block bx
    of W's N rows, its partial products to part's columns col0 .."""
    coords, store, tokens, mma8, zero = block_io(nt)
    na = nt // 2
    sb = slot_bytes(nt)

    @cuda.jit(device=True, inline=True)
    def stage(dst, w, s):
        a, qs, hdr, m0, n0, M, N, K = w
        tokens(dst, a, m0, M, K, s)
        tid = cuda.threadIdx.x
        wdst = dst + nt * 128
        for i in range(2):
            u = tid + THREADS * i
            r = u >> 1
            wr = min(n0 + r, N - 1)
            ptx.cp_async_16(wdst + r * 32 + 16 * (u & 1), qs, wr * (K // 8) + 8 * s + 4 * (u & 1))
        ptx.cp_async_16(wdst + W_SLOT + tid * 16, hdr, 4 * (min(n0 + tid, N - 1) * (K // 256) + (s >> 2)))

    start, advance = ring(stage, stages, sb)

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
        w = (a, qs, hdr, m0, n0, M, N, K)
        start(base, k0, k1, w)
        acc0 = cuda.local.array(na, float32)
        acc1 = cuda.local.array(na, float32)
        zero(acc0, acc1)
        l0 = 16 * warp + g
        for s in range(k0, k1):
            sl = advance(base, k0, s, k1, w)
            desc = wg.desc_sw128(sl)
            wsl = sl + nt * 128
            mma8(acc0, acc1, row_frags(wsl, l0, t, s), row_frags(wsl, l0 + 8, t, s), row_frags(wsl, l0 + 64, t, s),
                 row_frags(wsl, l0 + 72, t, s), desc)
        ptx.cp_async_wait_all()
        store(part, acc0, acc1, sp, m0, n0 + 16 * warp + g, t, M, N, col0)

    return body


@lru_cache(maxsize=None)
def gemm_wgmma_rs_pair_kernel(nt: int):
    """Q4_K rows (Q|K) and Q6_K rows (a layer's V) in one launch, three stages deep: blocks below
    nb1 take the Q4_K weight's rows to part's first n1 columns, the others the Q6_K weight's to
    the rest (one grid, so the two run side by side; each block the shared memory of the larger)."""
    body4 = _q4_k_body(nt, 3)
    body6 = q6_k_body(nt, 3)

    @cuda.jit
    def kernel(a, qs, hdr, ql, qh, sc, dsb, part, nb1, n1):
        bx = cuda.blockIdx.x
        if bx < nb1:
            body4(a, qs, hdr, part, bx, 0, n1)
        else:
            body6(a, ql, qh, sc, dsb, part, bx - nb1, n1, part.shape[2] - n1)

    kernel.__name__ = f"_gemm_wgmma_rs_pair_q4_k_q6_k_n{nt}_kernel"
    return kernel


def _launch(a_perm, w, part, stream, splits: int, stages: int) -> None:
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
               shared_bytes=q6_k.shared_bytes(nt, 3), programmatic=nt not in tuning.WRS_PLAIN_TOKENS)
        return
    launch(gemm_wgmma_rs_staged_kernel(nt, stages), grid, THREADS, stream, a_perm, w.parts[0], w.parts[1], part,
           shared_bytes=shared_bytes(nt, stages), programmatic=nt not in tuning.WRS_PLAIN_TOKENS)


def gemm_wgmma_rs(a_perm, w, c, part, stream, splits: int, accumulate: bool = False, reduce: bool = True,
                  stages: int = 3):
    """c (M, N) float32 = a · dequant(w)ᵀ (c += with accumulate) from a_perm = a with permute_a's
    columns (fp16, device); part: a float32 scratch (splits, M, N), where reduce=False leaves the
    partial products (c untouched); stages: the Q4_K kernel's cp.async depth (Q6_K's is 3)."""
    _launch(a_perm, w, part, stream, splits, stages)
    if reduce:
        reduce_parts(part, (c, c, c), w.rows, 0, accumulate, stream)


def gemm_wgmma_rs_split(a_perm, w, ys, part, stream, splits: int, reduce: bool = True):
    """Rows of W stacked from up to three matrices (Q|K|V): ys[i] (M, N_i) = a · dequant(W rows of
    i)ᵀ, each N_i a multiple of 4; a_perm, part and reduce as in gemm_wgmma_rs."""
    assert 1 <= len(ys) <= 3 and sum(y.shape[1] for y in ys) == w.rows and all(y.shape[1] % 4 == 0 for y in ys)
    y0, y1, y2 = (list(ys) + [ys[-1]] * 2)[:3]
    n0, n1 = ys[0].shape[1], ys[1].shape[1] if len(ys) > 1 else 0
    _launch(a_perm, w, part, stream, splits, 3)
    if reduce:
        reduce_parts(part, (y0, y1, y2), n0, n1, False, stream)


def gemm_wgmma_rs_pair(a_perm, w1, w2, ys, part, stream, splits: int, reduce: bool = True):
    """A Q4_K matrix w1 (Q|K: ys[0], ys[1] its rows in turn) and a Q6_K matrix w2 (V: ys[2]) of
    the same input width in one launch (gemm_wgmma_rs_pair_kernel), then one split-K reduce:
    ys[i] (M, N_i) = a · dequant(rows of i)ᵀ; part a float32 scratch (splits, M, w1.rows + w2.rows),
    where reduce=False leaves the partial products (ys untouched)."""
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
           np.int32(nb1), np.int32(w1.rows), shared_bytes=max(shared_bytes(nt, 3), q6_k.shared_bytes(nt, 3)),
           programmatic=nt not in tuning.WRS_PLAIN_TOKENS)
    if reduce:
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
            for nt in (16, 32, 64)] + [
        (gemm_wgmma_rs_q6_k_kernel(nt, 3), types.void(types.Array(types.float16, 2, "C"), *parts_type(T.Q6_K),
                                                      types.Array(types.float32, 3, "C")), {"max_registers": 255})
        for nt in (16, 32, 64)] + [
        (gemm_wgmma_rs_pair_kernel(nt), types.void(types.Array(types.float16, 2, "C"), qs_t, hdr_t,
                                                   *parts_type(T.Q6_K), types.Array(types.float32, 3, "C"),
                                                   types.int32, types.int32), {"max_registers": 255})
        for nt in (16, 32, 64)]
