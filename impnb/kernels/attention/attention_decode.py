"""Flash-decoding attention over the paged fp16 KV cache: one split-K kernel whose last split merges.

B sequences, T <= 8 query tokens each (1 for plain decode), H query heads sharing Hkv KV heads
(group g = H / Hkv), head dim D in HEAD_DIMS. Query t of sequence b sits at pos[b, t] and sees
keys k <= pos[b, t] with pos[b, t] - k < window. Everything that moves per step (positions,
hence the live context length) is read from `pos` on the device, so a captured graph stays valid
as the context grows; the split count is fixed per graph from its context bucket (num_splits).
Numpy reference: attention.attention_ref.
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.attention.kv_cache import PAGE_SIZES
from impnb.kernels.common.warp import shfl_xor, warp_max, warp_sum
from impnb.launch import launch

HEAD_DIMS = (64, 128, 256)
ROW_TILES = {64: (4, 8), 128: (4, 8), 256: (4,)}  # query rows (token, head of the group) per block
MAX_T = 8
MAX_SPLITS = 256
NT = 256               # threads per block
NW = NT // 32          # warps per block
STAGES = 4             # cp.async ring depth per lane (a power of two)
PENDING = STAGES - 2   # cp.async groups left in flight when a step's data is read
WIN = 1024             # keys whose page numbers are staged in shared memory at a time
MAX_WIN_PAGES = WIN // min(PAGE_SIZES) + 1
MIN_STEPS = 4          # block steps a split takes at least: short contexts use few splits
RING = NW * STAGES * 2 * 32 * 4  # 32-bit words: [warp][stage][K | V][lane][4]
NEG = np.float32(-1e30)  # finite "minus infinity": neutral partials combine without NaN
LOG2E = np.float32(1.4426950408889634)
SMEM_ALIGN = ptx.SMEM_ALIGN  # a global, so numba types it as a literal
_ZERO = np.float32(0)


def keys_per_step(D: int) -> int:
    """Keys a block reads per step: each key's row takes D/8 lanes (16 bytes of K and of V each)."""
    return NW * 32 // (D // 8)


@cuda.jit(device=True, inline=True)
def unpack_halves(w0, w1, w2, w3, f):
    """f[0:8] = the fp16 pairs of four 32-bit words as float32, low half first."""
    f[0] = qi.f16_to_f32(w0 & qi.HALF)
    f[1] = qi.f16_to_f32(w0 >> 16)
    f[2] = qi.f16_to_f32(w1 & qi.HALF)
    f[3] = qi.f16_to_f32(w1 >> 16)
    f[4] = qi.f16_to_f32(w2 & qi.HALF)
    f[5] = qi.f16_to_f32(w2 >> 16)
    f[6] = qi.f16_to_f32(w3 & qi.HALF)
    f[7] = qi.f16_to_f32(w3 >> 16)


@cuda.jit(device=True, inline=True)
def row_group(q, k_words, RM, y):
    """Block y's KV head kh and query rows r0 .. r0 + nrows - 1 at RM rows a block (row r = t * g
    + j: token t, query head kh * g + j) -> (g, kh, r0, nrows)."""
    T = q.shape[1]
    g = q.shape[2] // k_words.shape[2]
    n_groups = (g * T + RM - 1) // RM
    kh = y // n_groups
    r0 = (y - kh * n_groups) * RM
    return g, kh, r0, min(RM, g * T - r0)


@cuda.jit(device=True, inline=True)
def split_range(pos, b, r0, nrows, g, window, n_splits, min_chunk, step):
    """Keys [lo, hi) seen by query rows r0 .. r0 + nrows - 1 of sequence b, the keys per split
    (whole steps, at least min_chunk) and the live splits: later splits have no keys."""
    hi = 0
    lo = 1 << 30
    for r in range(nrows):
        qp = pos[b, (r0 + r) // g]
        hi = max(hi, qp + 1)
        lo = min(lo, qp - window + 1 if window > 0 else 0)
    lo = max(lo, 0)
    chunk = max(min_chunk, ((hi - lo + n_splits - 1) // n_splits + step - 1) // step * step)
    return lo, hi, chunk, (hi - lo + chunk - 1) // chunk


def _make_split_kernel(D: int, RM: int, capped: bool):
    LPK = D // 8            # lanes per key: 8 dims (16 bytes of K, 16 of V) each
    KPL = 32 // LPK         # keys per warp step
    BK = NW * KPL           # keys per block step
    WPR = D // 2            # 32-bit words per K or V row
    OPT = RM * D // NT      # outputs per thread in the in-block merge
    C4 = RM * D // 4        # float4 columns of the block's rows (final merge)
    SG = max(1, NT // C4)   # split groups of the final merge
    KEY_OFFS = tuple(1 << i for i in range(int(math.log2(LPK))))  # lanes of one key
    GROUP_OFFS = tuple(LPK << i for i in range(int(math.log2(KPL))))  # key slots of one warp
    assert NW * RM * D <= RING and MAX_SPLITS * RM <= RING and SG * C4 * 4 <= RING

    if KPL > 1:
        @cuda.jit(device=True, inline=True)
        def merge_key_slots(m, l, acc):
            # -- the warp's key slots merged by shuffles: every slot then holds the warp's rows --
            for off in GROUP_OFFS:
                for r in range(RM):
                    mo = shfl_xor(m[r], off)
                    lo = shfl_xor(l[r], off)
                    mx = max(m[r], mo)
                    a = ptx.ex2_approx_ftz(m[r] - mx)
                    c = ptx.ex2_approx_ftz(mo - mx)
                    l[r] = a * l[r] + c * lo
                    for i in range(8):
                        acc[r, i] = a * acc[r, i] + c * shfl_xor(acc[r, i], off)
                    m[r] = mx
    else:
        @cuda.jit(device=True, inline=True)
        def merge_key_slots(m, l, acc):
            pass  # one key slot per warp

    @cuda.jit(device=True, inline=True)
    def issue(ring, k_words, v_words, pages, j, key0, w1, p0, shift, Hkv, kh, warp, lane, dl):
        # -- cp.async this lane's 16 bytes of K and V for block step j into ring stage j % STAGES --
        key = key0 + j * BK
        sa = ptx.smem_addr(ring, ((warp * STAGES + (j & (STAGES - 1))) * 2 * 32 + lane) * 4)
        src = 0
        n = 0
        if key < w1:
            page = pages[(key >> shift) - p0]
            src = (((page << shift) + (key & ((1 << shift) - 1))) * Hkv + kh) * WPR + dl * 4
            n = 16
        ptx.cp_async_16_zfill(sa, k_words, src, n)   # keys past the window: zeros
        ptx.cp_async_16_zfill(sa + 512, v_words, src, n)
        ptx.cp_async_commit()

    # grid (n_splits, Hkv * n_row_groups, B), block 256 (8 warps).
    # capped: scores go through softcap * tanh(s / softcap) (a variant, off the common path).
    # A block owns up to RM query rows r = t * g + j (token t, head kh * g + j) of one KV head and
    # one split of their key range (split_range); splits past the live ones return at once.
    # Lane = (key slot kq of KPL, dim slice dl of LPK): per block step each warp reads KPL keys,
    # each lane 16 bytes of K and 16 of V (8 dims), cp.async'd STAGES - 1 steps ahead into its own
    # slots of the ring, so no barrier is needed inside the loop. Scores are reduced over the key's
    # LPK lanes by shuffles; every key slot runs its own online softmax (base 2) over its keys;
    # slots merge by shuffles, warps through shared memory.
    # shared: ring u32/f32[RING] (K|V stages, then per-warp rows red[NW][RM][D], then merge
    # weights [split][RM] and split-group sums); pages i32[MAX_WIN_PAGES] (the window's pages);
    # ms, ls f32[NW][RM] (per-warp max and sum); last i32[1].
    # k_words, v_words: the pools as u32 (n_pages, page_size, Hkv, D / 2); page_size = 1 << shift.
    # With one live split the rows are normalized into out; else unnormalized acc, running max m
    # (base 2) and sum l go to partials[b, split, t, h, 0:D | D | D+1] (rows without keys:
    # 0, NEG, 0), and the block that brings counters[b, blockIdx.y] to n_live merges them into
    # out and resets the counter (threadfence before the count, so the last block sees every
    # partial; it reads them through L2).
    def split_kernel(q, k_words, v_words, block_table, pos, partials, counters, out, scale, window,
                     softcap, min_chunk, shift):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        split = cuda.blockIdx.x
        b = cuda.blockIdx.z
        T = q.shape[1]
        H = q.shape[2]
        Hkv = k_words.shape[2]
        g, kh, r0, nrows = row_group(q, k_words, RM, cuda.blockIdx.y)
        lo, hi, chunk, n_live = split_range(pos, b, r0, nrows, g, window, cuda.gridDim.x, min_chunk, BK)
        if split >= n_live:
            return
        k_begin = lo + split * chunk
        k_end = min(hi, k_begin + chunk)
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        kq = lane // LPK
        dl = lane - kq * LPK

        ring = cuda.shared.array(RING, types.float32, alignment=SMEM_ALIGN)
        pages = cuda.shared.array(MAX_WIN_PAGES, types.int32)
        row_t = cuda.shared.array(RM, types.int32)  # token and head of each row
        row_h = cuda.shared.array(RM, types.int32)
        ms = cuda.shared.array((NW, RM), types.float32)
        ls = cuda.shared.array((NW, RM), types.float32)
        last = cuda.shared.array(1, types.int32)

        # -- this lane's 8 dims of the query rows, pre-scaled; rows past nrows are zero --
        qr = cuda.local.array((RM, 8), types.float32)
        qpos = cuda.local.array(RM, types.int32)
        m = cuda.local.array(RM, types.float32)
        l = cuda.local.array(RM, types.float32)
        acc = cuda.local.array((RM, 8), types.float32)
        for r in range(RM):
            qpos[r] = -1
            m[r] = NEG
            l[r] = _ZERO
            for i in range(8):
                qr[r, i] = _ZERO
                acc[r, i] = _ZERO
            if r < nrows:
                row = r0 + r
                t = row // g
                h = kh * g + row - t * g
                if tid == r:
                    row_t[r] = t
                    row_h[r] = h
                qpos[r] = pos[b, t]
                base = ((b * T + t) * H + h) * D + dl * 8
                for h4 in range(2):
                    x0, x1, x2, x3 = qi.ldg_f32x4(q, base + 4 * h4)
                    qr[r, 4 * h4] = x0 * scale
                    qr[r, 4 * h4 + 1] = x1 * scale
                    qr[r, 4 * h4 + 2] = x2 * scale
                    qr[r, 4 * h4 + 3] = x3 * scale
        kf = cuda.local.array(8, types.float32)
        vf = cuda.local.array(8, types.float32)

        for w0 in range(k_begin, k_end, WIN):
            # -- page numbers of this window's keys into shared --
            w1 = min(k_end, w0 + WIN)
            p0 = w0 >> shift
            cuda.syncthreads()
            if tid <= ((w1 - 1) >> shift) - p0:
                pages[tid] = block_table[b, p0 + tid]
            cuda.syncthreads()
            key0 = w0 + warp * KPL + kq
            n_steps = (w1 - w0 + BK - 1) // BK
            for j in range(STAGES - 1):
                issue(ring, k_words, v_words, pages, j, key0, w1, p0, shift, Hkv, kh, warp, lane, dl)
            for j in range(n_steps):
                # -- step j's K and V words from the ring, then step j + STAGES - 1 issued --
                ptx.cp_async_wait_group(PENDING)
                sa = ptx.smem_addr(ring, ((warp * STAGES + (j & (STAGES - 1))) * 2 * 32 + lane) * 4)
                k0, k1, k2, k3 = ptx.ld_shared_v4_u32(sa)
                v0, v1, v2, v3 = ptx.ld_shared_v4_u32(sa + 512)
                issue(ring, k_words, v_words, pages, j + STAGES - 1, key0, w1, p0, shift, Hkv, kh,
                      warp, lane, dl)
                unpack_halves(k0, k1, k2, k3, kf)
                unpack_halves(v0, v1, v2, v3, vf)
                key = key0 + j * BK
                # -- scores of this key for every row, online softmax per key slot --
                for r in range(RM):
                    s = _ZERO
                    s2 = _ZERO
                    for i in range(4):
                        s += qr[r, i] * kf[i]
                        s2 += qr[r, 4 + i] * kf[4 + i]
                    s += s2
                    for off in KEY_OFFS:
                        s += shfl_xor(s, off)
                    if capped:
                        s = softcap * math.tanh(s / softcap)
                    s *= LOG2E
                    qp = qpos[r]
                    seen = (key < w1) & (key <= qp) & ((window <= 0) | (qp - key < window))
                    m_new = max(m[r], s) if seen else m[r]
                    a = ptx.ex2_approx_ftz(m[r] - m_new)
                    p = ptx.ex2_approx_ftz(s - m_new) if seen else _ZERO
                    l[r] = l[r] * a + p
                    for i in range(8):
                        acc[r, i] = acc[r, i] * a + p * vf[i]
                    m[r] = m_new
        ptx.cp_async_wait_all()

        merge_key_slots(m, l, acc)
        # -- warps merged through shared: red[w][r][d] in the ring --
        cuda.syncthreads()
        if kq == 0:
            for r in range(RM):
                for i in range(8):
                    ring[(warp * RM + r) * D + dl * 8 + i] = acc[r, i]
        if lane == 0:
            for r in range(RM):
                ms[warp, r] = m[r]
                ls[warp, r] = l[r]
        cuda.syncthreads()
        for o in range(OPT):
            idx = tid + o * NT
            r = idx // D
            d = idx - r * D
            mx = NEG
            for w in range(NW):
                mx = max(mx, ms[w, r])
            num = _ZERO
            den = _ZERO
            for w in range(NW):
                e = ptx.ex2_approx_ftz(ms[w, r] - mx)
                num += e * ring[(w * RM + r) * D + d]
                den += e * ls[w, r]
            if r < nrows:
                t = row_t[r]
                h = row_h[r]
                if n_live == 1:
                    out[b, t, h, d] = num / den
                else:
                    partials[b, split, t, h, d] = num
                    if d == 0:
                        partials[b, split, t, h, D] = mx
                        partials[b, split, t, h, D + 1] = den
        if n_live == 1:
            return

        # -- the last live split to finish merges the partials of these rows into out --
        cuda.threadfence()
        cuda.syncthreads()
        if tid == 0:
            done = cuda.atomic.add(counters, (b, cuda.blockIdx.y), 1)
            last[0] = 1 if done == n_live - 1 else 0
            if last[0]:
                counters[b, cuda.blockIdx.y] = 0  # ready for the next step (graph replay)
        cuda.syncthreads()
        if last[0] == 0:
            return
        cuda.threadfence()
        PW = partials.shape[4]
        if warp < nrows:
            # -- warp r: the splits' weights 2^(m_s - max) into ring[s * RM + r], the denominator --
            rbase = ((b * partials.shape[1] * T + row_t[warp]) * H + row_h[warp]) * PW
            sstride = T * H * PW
            mx = NEG
            for s in range(lane, n_live, 32):
                mx = max(mx, ptx.ld_global_cg_v4_f32(partials, rbase + s * sstride + D)[0])
            mx = warp_max(mx)
            den = _ZERO
            for s in range(lane, n_live, 32):
                ml = ptx.ld_global_cg_v4_f32(partials, rbase + s * sstride + D)
                e = ptx.ex2_approx_ftz(ml[0] - mx)
                ring[s * RM + warp] = e
                den += e * ml[1]
            den = warp_sum(den)
            if lane == 0:
                ls[0, warp] = den
        cuda.syncthreads()
        # -- thread (split group sg, float4 column c): its splits' weighted sums, then over groups --
        sg = tid // C4
        c = tid - sg * C4
        r = c * 4 // D
        d = c * 4 - r * D
        s0 = _ZERO
        s1 = _ZERO
        s2 = _ZERO
        s3 = _ZERO
        if sg < SG and r < nrows:
            rbase = ((b * partials.shape[1] * T + row_t[r]) * H + row_h[r]) * PW + d
            sstride = T * H * PW
            for s in range(sg, n_live, SG):
                a0, a1, a2, a3 = ptx.ld_global_cg_v4_f32(partials, rbase + s * sstride)
                e = ring[s * RM + r]
                s0 += e * a0
                s1 += e * a1
                s2 += e * a2
                s3 += e * a3
        cuda.syncthreads()  # the weights are read; group sums reuse the ring past them
        sums = MAX_SPLITS * RM
        if SG > 1 and sg < SG:
            ring[sums + tid * 4] = s0
            ring[sums + tid * 4 + 1] = s1
            ring[sums + tid * 4 + 2] = s2
            ring[sums + tid * 4 + 3] = s3
        cuda.syncthreads()
        if sg == 0 and r < nrows:
            for g2 in range(1, SG):
                s0 += ring[sums + (g2 * C4 + c) * 4]
                s1 += ring[sums + (g2 * C4 + c) * 4 + 1]
                s2 += ring[sums + (g2 * C4 + c) * 4 + 2]
                s3 += ring[sums + (g2 * C4 + c) * 4 + 3]
            t = row_t[r]
            h = row_h[r]
            inv = np.float32(1) / ls[0, r]
            out[b, t, h, d] = s0 * inv
            out[b, t, h, d + 1] = s1 * inv
            out[b, t, h, d + 2] = s2 * inv
            out[b, t, h, d + 3] = s3 * inv

    split_kernel.__name__ = f"_decode_split_d{D}_r{RM}{'_softcap' if capped else ''}_kernel"
    return cuda.jit(split_kernel)


SPLIT_KEYS = tuple((D, RM, capped) for D in HEAD_DIMS for RM in ROW_TILES[D] for capped in (False, True))


@lru_cache(maxsize=None)
def split_kernel(key: tuple):
    """The split kernel of SPLIT_KEYS' key (D, RM, capped), made at its first use."""
    return _make_split_kernel(*key)


# ---------------------------------------------------------------- host side

def row_tile(n_head: int, n_head_kv: int, T: int, head_dim: int = 64) -> int:
    """Query rows per block: the smallest tile holding a KV head's g * T rows, else the largest."""
    rows = n_head // n_head_kv * T
    tiles = ROW_TILES[head_dim]
    return next((rm for rm in tiles if rows <= rm), tiles[-1])


def min_chunk(head_dim: int) -> int:
    """Keys a split takes at least (MIN_STEPS block steps)."""
    return MIN_STEPS * keys_per_step(head_dim)


def num_splits(ctx_bucket: int, n_head: int, n_head_kv: int, T: int = 1, batch: int = 1,
               window: int | None = None, n_sm: int = 132, head_dim: int = 128) -> int:
    """Splits for a graph serving contexts up to ctx_bucket (or its window): about one block per
    SM, at least min_chunk keys a split, at most MAX_SPLITS."""
    keys = min(ctx_bucket, window + T - 1) if window else ctx_bucket
    rows = n_head // n_head_kv * T
    blocks = batch * n_head_kv * -(-rows // row_tile(n_head, n_head_kv, T, head_dim))
    want = -(-n_sm // blocks)
    return max(1, min(want, keys // min_chunk(head_dim), MAX_SPLITS))


def partials_shape(batch: int, n_splits: int, T: int, n_head: int, head_dim: int) -> tuple:
    """(B, n_splits, T, H, D + 4) float32 scratch: acc, then m and l (and 2 pad: rows of 16 bytes)."""
    return batch, n_splits, T, n_head, head_dim + 4


def counters_shape(batch: int, T: int, n_head: int) -> tuple:
    """(B, T * H) int32 split counters, zero before the first call; the kernel leaves them zero."""
    return batch, T * n_head


def _check(a, dtype, ndim: int, name: str):
    assert a.dtype == dtype and a.ndim == ndim and a.is_c_contiguous(), \
        f"{name}: C-contiguous {np.dtype(dtype)} with {ndim} dims expected, got {a.dtype} {a.shape}"


def attention_decode(q, k_pool, v_pool, block_table, pos, out, partials, counters, n_splits: int,
                     scale: float, window: int | None, softcap: float | None, stream,
                     rows_per_block: int | None = None, split_keys: int | None = None) -> None:
    """out (B, T, H, D) = attention of q (B, T, H, D) float32 over the paged fp16 cache.

    k_pool, v_pool (n_pages, page_size, Hkv, D) float16; block_table (B, max_pages) int32;
    pos (B, T) int32, the positions of the queries, whose K/V are already in the cache;
    partials (partials_shape with >= n_splits) float32 scratch; counters (counters_shape) int32,
    zeroed once; n_splits from num_splits.
    window None or > 0; softcap None or > 0. One sequence may pass q/out (T, H, D), pos (T,),
    block_table (max_pages,). rows_per_block: one of ROW_TILES[D] (default row_tile's choice);
    split_keys: keys a split takes at least (default min_chunk(D)).
    """
    if q.ndim == 3:
        q, out, pos = q.reshape(1, *q.shape), out.reshape(1, *out.shape), pos.reshape(1, q.shape[0])
        block_table = block_table.reshape(1, block_table.size)
    for a, dt, nd, name in ((q, np.float32, 4, "q"), (out, np.float32, 4, "out"),
                            (k_pool, np.float16, 4, "k_pool"), (v_pool, np.float16, 4, "v_pool"),
                            (block_table, np.int32, 2, "block_table"), (pos, np.int32, 2, "pos"),
                            (partials, np.float32, 5, "partials"), (counters, np.int32, 2, "counters")):
        _check(a, dt, nd, name)
    B, T, H, D = q.shape
    Hkv = k_pool.shape[2]
    assert out.shape == q.shape and pos.shape == (B, T) and block_table.shape[0] == B
    assert D in HEAD_DIMS and k_pool.shape[3] == D and v_pool.shape == k_pool.shape, "head dims"
    assert k_pool.shape[1] in PAGE_SIZES and H % Hkv == 0 and 1 <= T <= MAX_T, "pages, heads or T"
    assert 1 <= n_splits <= min(MAX_SPLITS, partials.shape[1]), f"n_splits {n_splits}"
    assert partials.shape == partials_shape(B, partials.shape[1], T, H, D), "partials shape"
    assert window is None or window > 0, "window must be None or positive"
    assert softcap is None or softcap > 0, "softcap must be None or positive"
    rm = rows_per_block or row_tile(H, Hkv, T, D)
    assert rm in ROW_TILES[D], f"rows_per_block {rm}"
    n_groups = -(-(H // Hkv * T) // rm)
    win = np.int32(window or 0)
    assert counters.shape[0] == B and counters.shape[1] >= Hkv * n_groups, "counters shape"
    launch(split_kernel((D, rm, bool(softcap))), (n_splits, Hkv * n_groups, B), NT, stream,
           q, k_pool.view(np.uint32), v_pool.view(np.uint32), block_table, pos, partials, counters,
           out, np.float32(scale), win, np.float32(softcap or 0.0),
           np.int32(split_keys or min_chunk(D)), np.int32(k_pool.shape[1].bit_length() - 1))


_Q = types.float32[:, :, :, ::1]
_POOL = types.uint32[:, :, :, ::1]
_I2 = types.int32[:, ::1]
_PART = types.float32[:, :, :, :, ::1]
_SPLIT_SIG = (_Q, _POOL, _POOL, _I2, _I2, _PART, _I2, _Q, types.float32, types.int32, types.float32,
              types.int32, types.int32)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (split_kernel(key), _SPLIT_SIG, {"max_registers": 255}) for key in SPLIT_KEYS
    ]
