"""Probe kernels for the layout tests of ptx.py's intrinsics and gemm_tc's tiles (tests/gpu/test_ptx.py).

Each probe moves host-chosen bits through one intrinsic and writes every lane's raw registers
back, so the test can compare each lane's fragment with the PTX ISA tables it encodes in numpy;
the probes themselves know no fragment layout. The tile probes dump the fragments gemm_tc's warp
step loads and the fp16 W tile gemm_tc_quant decodes, so a failing GEMM test can be traced to
addressing, decoding or mma.
"""

from functools import lru_cache

from numba import cuda, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.gemm.gemm_tc import (BK, F16_TILE, ROW_BYTES, SMALL_TILE, THREADS, F16_2D, tile_offset,
                                   tile_ops)

_U32_1D = types.Array(types.uint32, 1, "C")
_U32_2D = types.Array(types.uint32, 2, "C")
_U32_4D = types.Array(types.uint32, 4, "C")
_F32_1D = types.Array(types.float32, 1, "C")
F32_2D = types.Array(types.float32, 2, "C")
_I32_1D = types.Array(types.int32, 1, "C")
SMEM_ALIGN = ptx.SMEM_ALIGN  # a global, so numba types it as a literal


def _mma_probe(mma):
    # grid 1, block 32: lane l runs mma on its registers a[l, 0:4], b[l, 0:2], c[l, 0:4] -> d[l, 0:4]
    @cuda.jit
    def _mma_probe_kernel(a, b, c, d):
        l = cuda.threadIdx.x
        d0, d1, d2, d3 = mma(a[l, 0], a[l, 1], a[l, 2], a[l, 3], b[l, 0], b[l, 1],
                             c[l, 0], c[l, 1], c[l, 2], c[l, 3])
        d[l, 0] = d0
        d[l, 1] = d1
        d[l, 2] = d2
        d[l, 3] = d3
    return _mma_probe_kernel


mma_f16_probe = _mma_probe(ptx.mma_f16)
mma_bf16_probe = _mma_probe(ptx.mma_bf16)


# grid 1, block 32: lane l runs the int8 mma on its registers a[l], b[l], c[l] -> d[l, 0:4] (int32)
@cuda.jit
def mma_s8_k32_probe(a, b, c, d):
    l = cuda.threadIdx.x
    d[l, 0], d[l, 1], d[l, 2], d[l, 3] = ptx.mma_s8_k32(a[l, 0], a[l, 1], a[l, 2], a[l, 3], b[l, 0], b[l, 1],
                                                        c[l, 0], c[l, 1], c[l, 2], c[l, 3])


@cuda.jit
def mma_s8_k16_probe(a, b, c, d):
    l = cuda.threadIdx.x
    d[l, 0], d[l, 1], d[l, 2], d[l, 3] = ptx.mma_s8_k16(a[l, 0], a[l, 1], b[l, 0], c[l, 0], c[l, 1], c[l, 2],
                                                        c[l, 3])


@lru_cache(maxsize=None)
def ldmatrix_probe(n, trans):
    """grid 1, block 32: rows (16 bytes = 4 words of src each) are stored at shared row slots[r];
    lane l addresses row l % 8n (row l % 8 of matrix l // 8); out[l, 0:n] = its registers."""
    ld = {(1, False): ptx.ldmatrix_x1, (2, False): ptx.ldmatrix_x2, (4, False): ptx.ldmatrix_x4,
          (1, True): ptx.ldmatrix_x1_trans, (2, True): ptx.ldmatrix_x2_trans,
          (4, True): ptx.ldmatrix_x4_trans}[(n, trans)]
    rows = 8 * n

    @cuda.jit(device=True, inline=True)
    def fill(src, slots, sm, l):
        if l < rows:
            for j in range(4):
                sm[4 * slots[l] + j] = src[4 * l + j]
        cuda.syncthreads()

    if n == 1:
        @cuda.jit
        def _ldmatrix_probe_kernel(src, slots, out):
            sm = cuda.shared.array(128, uint32, alignment=SMEM_ALIGN)  # 32 rows of 16 bytes
            l = cuda.threadIdx.x
            fill(src, slots, sm, l)
            out[l, 0] = ld(ptx.smem_addr(sm, 4 * slots[l % rows]))
    else:
        @cuda.jit
        def _ldmatrix_probe_kernel(src, slots, out):
            sm = cuda.shared.array(128, uint32, alignment=SMEM_ALIGN)
            l = cuda.threadIdx.x
            fill(src, slots, sm, l)
            r = ld(ptx.smem_addr(sm, 4 * slots[l % rows]))
            for j in range(n):
                out[l, j] = r[j]
    return _ldmatrix_probe_kernel


# grid 1, block 32: shared memory is poisoned (0xDEADBEEF), then thread t copies src chunk t (16
# bytes) into shared chunk slots[t]: chunks 0..15 with cp_async_16 (commit group 0), 16..31 with
# cp_async_16_zfill of nbytes[t] bytes (group 1).
# After wait_group 1 + barrier the group-0 chunks are read back; after wait_all the rest. out has
# chunk t at words 4t..4t+3 (read with ld_shared_v4_u32, written with st_global_v4_u32).
@cuda.jit
def cp_async_probe(src, slots, nbytes, out):
    sm = cuda.shared.array(128, uint32, alignment=SMEM_ALIGN)
    t = cuda.threadIdx.x
    for j in range(4):
        sm[4 * t + j] = uint32(0xDEADBEEF)
    cuda.syncthreads()
    dst = ptx.smem_addr(sm, 4 * slots[t])
    if t < 16:
        ptx.cp_async_16(dst, src, 4 * t)
    ptx.cp_async_commit()
    if t >= 16:
        ptx.cp_async_16_zfill(dst, src, 4 * t, nbytes[t])
    ptx.cp_async_commit()
    ptx.cp_async_wait_group(1)
    cuda.syncthreads()
    if t < 16:
        v = ptx.ld_shared_v4_u32(dst)
        ptx.st_global_v4_u32(out, 4 * t, v[0], v[1], v[2], v[3])
    ptx.cp_async_wait_all()
    cuda.syncthreads()
    if t >= 16:
        v = ptx.ld_shared_v4_u32(dst)
        ptx.st_global_v4_u32(out, 4 * t, v[0], v[1], v[2], v[3])


# grid 1, block 32: global 16-byte moves with the words reversed, st.global.v2.f32 with the pair
# swapped: out[4t:4t+4] = src[4t+3], .., src[4t]; outf[2t:2t+2] = srcf[2t+1], srcf[2t].
@cuda.jit
def global_v4_probe(src, out, srcf, outf):
    t = cuda.threadIdx.x
    v0, v1, v2, v3 = ptx.ld_global_v4_u32(src, 4 * t)
    ptx.st_global_v4_u32(out, 4 * t, v3, v2, v1, v0)
    ptx.st_global_v2_f32(outf, 2 * t, srcf[2 * t + 1], srcf[2 * t])


# grid 1, block 32: shared addresses and 16-byte shared moves. addr[0, t] = smem_addr(sm, t) -
# smem_addr(sm, 0), addr[1, t] = cvta_to_shared(sm, t) - smem_addr(sm, 0) (both 4t). Thread t
# stores src[4t:4t+4] at word 4*slots[t] with st_shared_v4_u32; out[0] is sm read back by numba
# indexing, out[1, 4t:4t+4] the words at slot t read with ld_shared_v4_u32 through cvta_to_shared.
@cuda.jit
def shared_v4_probe(src, slots, addr, out):
    sm = cuda.shared.array(128, uint32, alignment=SMEM_ALIGN)
    t = cuda.threadIdx.x
    base = ptx.smem_addr(sm, 0)
    addr[0, t] = ptx.smem_addr(sm, t) - base
    addr[1, t] = ptx.cvta_to_shared(sm, t) - base
    ptx.st_shared_v4_u32(ptx.smem_addr(sm, 4 * slots[t]), src[4 * t], src[4 * t + 1], src[4 * t + 2],
                         src[4 * t + 3])
    cuda.syncthreads()
    for j in range(4):
        out[0, 4 * t + j] = sm[4 * t + j]
    v = ptx.ld_shared_v4_u32(ptx.cvta_to_shared(sm, 4 * t))
    for j in range(4):
        out[1, 4 * t + j] = v[j]


# grid ceil(n/128), block 128: h[i] = pack_f16x2(x[2i], x[2i+1]), b[i] = pack_bf16x2(x[2i], x[2i+1])
@cuda.jit
def pack_probe(x, h, b):
    i = cuda.grid(1)
    if i < h.shape[0]:
        h[i] = ptx.pack_f16x2(x[2 * i], x[2 * i + 1])
        b[i] = ptx.pack_bf16x2(x[2 * i], x[2 * i + 1])


# grid (1, 1, S) launched as one cluster of S blocks, block 32: block z's lane l writes
# src[z, l] to shared, then (after cluster_sync) reads lane l's float of every block r through
# ld_cluster_f32 into out[z, r, l].
@cuda.jit
def cluster_probe(src, out):
    sm = cuda.shared.array(32, types.float32)
    z = cuda.blockIdx.z
    lane = cuda.threadIdx.x
    sm[lane] = src[z, lane]
    ptx.cluster_sync()
    for r in range(out.shape[1]):
        out[z, r, lane] = ptx.ld_cluster_f32(ptx.smem_addr(sm, lane), r)
    ptx.cluster_sync()  # no block leaves while another may still read its shared memory


@lru_cache(maxsize=None)
def tile_frag_probe(bm, bn, warps_m, warps_n):
    """grid 1, block 256: load A (bm x 32) and W (bn x 32) fp16 tiles with gemm_tc's cp.async
    loads, then every warp's fragments with its load_frags: af[warp, kk, r, lane] for r < n_af,
    bf[warp, kk, r, lane] for r < n_bf. Also dumps the tiles as stored: tiles[row, 16-byte chunk q
    at physical slot] -- a (bm + bn, 16) uint32 array of the raw shared bytes, A rows first."""
    ops = tile_ops(bm, bn, warps_m, warps_n)
    load_a, load_w, load_frags, n_af, n_bf = ops.load_a, ops.load_w, ops.load_frags, ops.n_af, ops.n_bf
    words = (bm + bn) * ROW_BYTES // 4

    @cuda.jit
    def _tile_frag_probe_kernel(a, w, af, bf, tiles):
        sm = cuda.shared.array(words, uint32, alignment=SMEM_ALIGN)
        base = ptx.smem_addr(sm, 0)
        load_a(base, a, 0, 0)
        load_w(base + bm * ROW_BYTES, w, 0, 0)
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        cuda.syncthreads()
        t = cuda.threadIdx.x
        for i in range(t, words, THREADS):
            tiles[i // 16, i % 16] = sm[i]
        warp = t >> 5
        lane = t & 31
        fa = cuda.local.array(n_af, uint32)
        fb = cuda.local.array(n_bf, uint32)
        for kk in range(2):
            load_frags(base, base + bm * ROW_BYTES, kk, fa, fb)
            for r in range(n_af):
                af[warp, kk, r, lane] = fa[r]
            for r in range(n_bf):
                bf[warp, kk, r, lane] = fb[r]
    return _tile_frag_probe_kernel


@lru_cache(maxsize=None)
def quant_tile_probe(ggml_type, bm=128):
    """grid 1, block 256: gemm_tc_quant's stage c -- A columns by load_a_split and the 128 x 32 W
    tile decoded from parts (rows 0..N-1, K = 32 * cpr) -- read back unswizzled:
    a_tile (bm, 16) and w_tile (128, 16) uint32 (fp16 pairs, k slots in order)."""
    from impnb.kernels.gemm.gemm_tc_quant import BN, quant_tile_ops

    load_raw, decode, col = quant_tile_ops(ggml_type)
    load_a_split = tile_ops(bm, BN, 2, 4).load_a_split
    a_bytes = bm * ROW_BYTES
    words = (bm + BN) * ROW_BYTES // 4

    @cuda.jit
    def _quant_tile_probe_kernel(a, parts, N, c, a_tile, w_tile):
        sm = cuda.shared.array(words, uint32, alignment=SMEM_ALIGN)
        base = ptx.smem_addr(sm, 0)
        cpr = a.shape[1] // BK
        load_a_split(base, a, 0, col(c, 0), col(c, 1))
        ptx.cp_async_commit()
        decode(load_raw(parts, 0, N, cpr, c), c, base + a_bytes)
        ptx.cp_async_wait_all()
        cuda.syncthreads()
        t = cuda.threadIdx.x
        for i in range(t, (bm + BN) * 4, THREADS):  # (row, logical chunk q) -> 4 words
            r = i >> 2
            q = i & 3
            off = tile_offset(r, q) // 4 if r < bm else (a_bytes + tile_offset(r - bm, q)) // 4
            for j in range(4):
                if r < bm:
                    a_tile[r, 4 * q + j] = sm[off + j]
                else:
                    w_tile[r - bm, 4 * q + j] = sm[off + j]
    return _quant_tile_probe_kernel


def _quant_sigs():
    from gguf import GGMLQuantizationType as T

    from impnb.kernels.gemv.gemv import parts_type

    return [(quant_tile_probe(t), types.void(F16_2D, parts_type(t), types.int32, types.int32, _U32_2D,
                                             _U32_2D), {"ptx_contains": ["st.shared.v4.u32", "cvt.rn.f16x2.f32"]})
            for t in (T.Q8_0, T.Q4_K, T.Q6_K)]


_MMA_SIG = types.void(_U32_2D, _U32_2D, F32_2D, F32_2D)
_MMA_S8_SIG = types.void(_U32_2D, _U32_2D, types.Array(types.int32, 2, "C"), types.Array(types.int32, 2, "C"))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (mma_f16_probe, _MMA_SIG, {"ptx_contains": ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"]}),
        (mma_bf16_probe, _MMA_SIG, {"ptx_contains": ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"]}),
        (mma_s8_k32_probe, _MMA_S8_SIG, {"ptx_contains": ["mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"]}),
        (mma_s8_k16_probe, _MMA_S8_SIG, {"ptx_contains": ["mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32"]}),
        *[(ldmatrix_probe(n, tr), types.void(_U32_1D, _I32_1D, _U32_2D),
           {"ptx_contains": [f"ldmatrix.sync.aligned.m8n8.x{n}{'.trans' if tr else ''}.shared.b16"]})
          for n in (1, 2, 4) for tr in (False, True)],
        (cp_async_probe, types.void(_U32_1D, _I32_1D, _I32_1D, _U32_1D),
         {"ptx_contains": ["cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group 1",
                           "cp.async.wait_all", "ld.shared.v4.u32", "st.global.v4.u32"]}),
        (global_v4_probe, types.void(_U32_1D, _U32_1D, _F32_1D, _F32_1D),
         {"ptx_contains": ["ld.global.v4.u32", "st.global.v4.u32", "st.global.v2.f32"]}),
        (shared_v4_probe, types.void(_U32_1D, _I32_1D, _U32_2D, _U32_2D),
         {"ptx_contains": ["st.shared.v4.u32", "ld.shared.v4.u32", "cvta.to.shared.u64"]}),
        (cluster_probe, types.void(F32_2D, types.float32[:, :, ::1]),
         {"ptx_contains": ["barrier.cluster.arrive.release", "barrier.cluster.wait.acquire",
                           "mapa.shared::cluster.u32", "ld.shared::cluster.f32"]}),
        (pack_probe, types.void(_F32_1D, _U32_1D, _U32_1D),
         {"ptx_contains": ["cvt.rn.f16x2.f32", "cvt.rn.bf16x2.f32"]}),
        *[(tile_frag_probe(*t[:4]), types.void(F16_2D, F16_2D, _U32_4D, _U32_4D, _U32_2D),
           {"ptx_contains": ["ldmatrix.sync.aligned.m8n8.x4.shared.b16", "cp.async.cg.shared.global"]})
          for t in (F16_TILE, SMALL_TILE)],
        *_quant_sigs(),
    ]
