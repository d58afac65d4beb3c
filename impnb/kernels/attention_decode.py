"""Flash-decoding attention over the paged fp16 KV cache: one split-K kernel whose last split merges.

B sequences, T <= 8 query tokens each (1 for plain decode), H query heads sharing Hkv KV heads
(group g = H / Hkv), head dim D in HEAD_DIMS. Query t of sequence b sits at pos[b, t] and sees
keys k <= pos[b, t] with pos[b, t] - k < window. Everything that moves per step (positions,
hence the live context length) is read from `pos` on the device, so a captured graph stays valid
as the context grows; the split count is fixed per graph from its context bucket (num_splits).
"""

import math

import numpy as np
from numba import cuda
from numba.core import types

from impnb.kernels import ptx
from impnb.kernels import quant_intrinsics as qi
from impnb.kernels.kv_cache import PAGE_SIZES
from impnb.kernels.norm import warp_max, warp_sum
from impnb.launch import launch

HEAD_DIMS = (64, 128, 256)
ROW_TILES = (4, 8)     # query rows (token, head of the group) one block holds
MAX_T = 8
MAX_SPLITS = 256
NT = 128               # threads per block
NW = NT // 32          # warps per block
TILE = 32              # keys per inner step
MIN_CHUNK = 2 * TILE   # keys per split at least: short contexts use few splits
NEG = np.float32(-1e30)  # finite "minus infinity": neutral partials combine without NaN
_ZERO = np.float32(0)
_ONE = np.float32(1)


@cuda.jit(device=True, inline=True)
def _split_range(pos, b, r0, nrows, g, window, n_splits):
    """Keys [lo, hi) seen by query rows r0 .. r0 + nrows - 1 of sequence b, the keys per split
    (whole tiles, at least MIN_CHUNK) and the live splits: later splits have no keys."""
    hi = 0
    lo = 1 << 30
    for r in range(nrows):
        qp = pos[b, (r0 + r) // g]
        hi = max(hi, qp + 1)
        lo = min(lo, qp - window + 1 if window > 0 else 0)
    lo = max(lo, 0)
    chunk = max(MIN_CHUNK, ((hi - lo + n_splits - 1) // n_splits + TILE - 1) // TILE * TILE)
    return lo, hi, chunk, (hi - lo + chunk - 1) // chunk


def _make_split_kernel(D: int, RM: int):
    KP = D + 1           # padded K tile row: lane-per-key reads hit 32 distinct banks
    DW = D // NW         # dims each warp sums in the score stage
    WPK = D // 2         # 32-bit words (half pairs) per key row
    KWT = TILE * WPK // NT   # K words each thread stages per tile
    KB = min(KWT, 16)    # ... in batches of KB loads in flight
    KSPLIT = NT // WPK   # key groups in the P·V stage (4, 2, 1 for D = 64, 128, 256)
    KPG = TILE // KSPLIT  # keys per group: V words each thread prefetches per tile
    RPW = RM // NW       # rows each warp owns in the softmax stage
    QS, KS, SP, PT = (RM, D), TILE * KP, (NW, RM, TILE), (RM, TILE)  # shared array shapes

    # grid (n_splits, Hkv * n_row_groups, B), block 128 (4 warps).
    # A block owns up to RM query rows r = t * g + j (token t, head kh * g + j) of one KV head and
    # one split of their key range (_split_range); splits past the live ones return at once.
    # Per 32-key tile, every load is issued up front: thread (kg, p) prefetches the V words
    # (columns 2p, 2p + 1) of keys kg, kg + KSPLIT, ... into registers, and K is staged
    # fp16 -> f32 into shared in batches of KB 32-bit loads. Warp w forms partial scores over
    # dims [w * D/4, (w + 1) * D/4) with lane = key; warp w then owns rows w, w + 4 for the online
    # softmax (lane = key, shuffles); P·V accumulates from the prefetched V.
    # shared: qs f32[RM][D] (q * scale), ks f32[32 * (D + 1)], sp f32[4][RM][32] (per-warp
    # partial scores), pt f32[RM][32] (probabilities), alpha f32[RM] (rescale per row),
    # tile_page, tile_off i32[32] (where each key of the tile lives).
    # k_words, v_words: the pools as u32 (n_pages, page_size, Hkv, D / 2).
    # With one live split the rows are normalized into out; else unnormalized acc, running max m
    # and sum l go to partials[b, split, t, h, 0:D | D | D+1] (rows without keys: 0, NEG, 0),
    # and the block that brings counters[b, blockIdx.y] to n_live merges them into out and
    # resets the counter (threadfence before the count, so the last block sees every partial).
    def split_kernel(q, k_words, v_words, block_table, pos, partials, counters, out, scale, window,
                     softcap):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        split = cuda.blockIdx.x
        b = cuda.blockIdx.z
        T = q.shape[1]
        Hkv = k_words.shape[2]
        page_size = k_words.shape[1]
        g = q.shape[2] // Hkv
        n_groups = (g * T + RM - 1) // RM
        kh = cuda.blockIdx.y // n_groups
        r0 = (cuda.blockIdx.y - kh * n_groups) * RM
        nrows = min(RM, g * T - r0)
        lo, hi, chunk, n_live = _split_range(pos, b, r0, nrows, g, window, cuda.gridDim.x)
        if split >= n_live:
            return
        k_begin = lo + split * chunk
        k_end = min(hi, k_begin + chunk)
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        kg = tid // WPK
        p = tid - kg * WPK

        qs = cuda.shared.array(QS, types.float32)
        ks = cuda.shared.array(KS, types.float32)
        sp = cuda.shared.array(SP, types.float32)
        pt = cuda.shared.array(PT, types.float32)
        alpha = cuda.shared.array(RM, types.float32)
        tile_page = cuda.shared.array(TILE, types.int32)
        tile_off = cuda.shared.array(TILE, types.int32)
        last = cuda.shared.array(1, types.int32)

        # -- q rows, pre-scaled; rows past nrows are zero --
        for i in range(tid, RM * D, NT):
            r = i // D
            d = i - r * D
            val = _ZERO
            if r < nrows:
                row = r0 + r
                val = q[b, row // g, kh * g + row % g, d] * scale
            qs[r, d] = val
        m = cuda.local.array(RPW, types.float32)
        l = cuda.local.array(RPW, types.float32)
        qpos = cuda.local.array(RPW, types.int32)
        for i in range(RPW):
            r = warp + NW * i
            m[i] = NEG
            l[i] = _ZERO
            qpos[i] = pos[b, (r0 + r) // g] if r < nrows else -1
        acc = cuda.local.array((RM, 2), types.float32)
        for r in range(RM):
            acc[r, 0] = _ZERO
            acc[r, 1] = _ZERO
        vw = cuda.local.array(KPG, types.uint32)
        kw = cuda.local.array(KB, types.uint32)

        for kt in range(k_begin, k_end, TILE):
            # -- where this tile's keys live; -1 past k_end (their pages may not exist) --
            if tid < TILE:
                key = kt + tid
                tile_page[tid] = block_table[b, key // page_size] if key < k_end else -1
                tile_off[tid] = key % page_size
            cuda.syncthreads()

            # -- V words of this thread's keys into registers (0 past k_end) --
            for j in range(KPG):
                kk = kg + j * KSPLIT
                page = tile_page[kk]
                vw[j] = v_words[max(page, 0), tile_off[kk], kh, p] if page >= 0 else types.uint32(0)
            # -- K tile fp16 -> f32 into shared, KB loads in flight; keys past k_end are zero --
            for i0 in range(0, KWT, KB):
                for j in range(KB):
                    i = tid + (i0 + j) * NT
                    kk = i // WPK
                    page = tile_page[kk]
                    kw[j] = k_words[max(page, 0), tile_off[kk], kh, i - kk * WPK] \
                        if page >= 0 else types.uint32(0)
                for j in range(KB):
                    i = tid + (i0 + j) * NT
                    kk = i // WPK
                    d = 2 * (i - kk * WPK)
                    ks[kk * KP + d] = qi.f16_to_f32(kw[j] & qi.HALF)
                    ks[kk * KP + d + 1] = qi.f16_to_f32(kw[j] >> 16)
            cuda.syncthreads()

            # -- partial scores: warp w, dims [w * DW, (w + 1) * DW), key = lane, all RM rows --
            s = cuda.local.array(RM, types.float32)
            for r in range(RM):
                s[r] = _ZERO
            for dd in range(DW):
                d = warp * DW + dd
                kv = ks[lane * KP + d]
                for r in range(RM):
                    s[r] += qs[r, d] * kv
            for r in range(RM):
                sp[warp, r, lane] = s[r]
            cuda.syncthreads()

            # -- online softmax: warp w owns rows w, w + 4, ...; key = lane --
            key = kt + lane
            for i in range(RPW):
                r = warp + NW * i
                x = sp[0, r, lane] + sp[1, r, lane] + sp[2, r, lane] + sp[3, r, lane]
                if softcap > _ZERO:
                    x = softcap * math.tanh(x / softcap)
                qp = qpos[i]
                seen = key < k_end and key <= qp and (window <= 0 or qp - key < window)
                if not seen:
                    x = NEG
                m_new = max(m[i], warp_max(x))
                pr = math.exp(x - m_new) if seen else _ZERO
                a = math.exp(m[i] - m_new)
                l[i] = l[i] * a + warp_sum(pr)
                m[i] = m_new
                pt[r, lane] = pr
                if lane == 0:
                    alpha[r] = a
            cuda.syncthreads()

            # -- P·V: columns 2p, 2p + 1 of keys kg, kg + KSPLIT, ... from the prefetched words --
            for r in range(RM):
                a = alpha[r]
                acc[r, 0] *= a
                acc[r, 1] *= a
            for j in range(KPG):
                kk = kg + j * KSPLIT
                v0 = qi.f16_to_f32(vw[j] & qi.HALF)
                v1 = qi.f16_to_f32(vw[j] >> 16)
                for r in range(RM):
                    pr = pt[r, kk]
                    acc[r, 0] += pr * v0
                    acc[r, 1] += pr * v1
            cuda.syncthreads()

        # -- key groups summed through shared (ks is free now) --
        if KSPLIT > 1:
            if kg > 0:
                for r in range(RM):
                    ks[((kg - 1) * RM + r) * D + 2 * p] = acc[r, 0]
                    ks[((kg - 1) * RM + r) * D + 2 * p + 1] = acc[r, 1]
            cuda.syncthreads()
            if kg == 0:
                for g2 in range(1, KSPLIT):
                    for r in range(RM):
                        acc[r, 0] += ks[((g2 - 1) * RM + r) * D + 2 * p]
                        acc[r, 1] += ks[((g2 - 1) * RM + r) * D + 2 * p + 1]
        # -- one live split: normalized rows to out (l through shared); else the partials --
        for i in range(RPW):
            r = warp + NW * i
            if lane == 0:
                alpha[r] = l[i]
            if lane == 0 and r < nrows and n_live > 1:
                row = r0 + r
                partials[b, split, row // g, kh * g + row % g, D] = m[i]
                partials[b, split, row // g, kh * g + row % g, D + 1] = l[i]
        cuda.syncthreads()
        if kg == 0:
            for r in range(RM):
                if r < nrows:
                    row = r0 + r
                    t = row // g
                    h = kh * g + row % g
                    if n_live == 1:
                        inv = _ONE / alpha[r]
                        out[b, t, h, 2 * p] = acc[r, 0] * inv
                        out[b, t, h, 2 * p + 1] = acc[r, 1] * inv
                    else:
                        partials[b, split, t, h, 2 * p] = acc[r, 0]
                        partials[b, split, t, h, 2 * p + 1] = acc[r, 1]
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
        for i in range(tid, nrows * D, NT):
            r = i // D
            d = i - r * D
            row = r0 + r
            t = row // g
            h = kh * g + row % g
            mx = NEG
            for sp_ in range(n_live):
                mx = max(mx, partials[b, sp_, t, h, D])
            num = _ZERO
            den = _ZERO
            for sp_ in range(n_live):
                w = math.exp(partials[b, sp_, t, h, D] - mx)
                num += w * partials[b, sp_, t, h, d]
                den += w * partials[b, sp_, t, h, D + 1]
            out[b, t, h, d] = num / den

    split_kernel.__name__ = f"_decode_split_d{D}_r{RM}_kernel"
    return cuda.jit(split_kernel)


_SPLIT_KERNELS = {(D, RM): _make_split_kernel(D, RM) for D in HEAD_DIMS for RM in ROW_TILES}


# ---------------------------------------------------------------- host side

def row_tile(n_head: int, n_head_kv: int, T: int) -> int:
    """Query rows per block: the smallest of ROW_TILES holding a KV head's g * T rows, else the largest."""
    rows = n_head // n_head_kv * T
    return next((rm for rm in ROW_TILES if rows <= rm), ROW_TILES[-1])


def num_splits(ctx_bucket: int, n_head: int, n_head_kv: int, T: int = 1, batch: int = 1,
               window: int | None = None, n_sm: int = 132) -> int:
    """Splits for a graph serving contexts up to ctx_bucket (or its window): about two blocks per
    SM, at least one 32-key tile per split, at most MAX_SPLITS."""
    keys = min(ctx_bucket, window + T - 1) if window else ctx_bucket
    rows = n_head // n_head_kv * T
    blocks = batch * n_head_kv * -(-rows // row_tile(n_head, n_head_kv, T))
    want = -(-2 * n_sm // blocks)
    return max(1, min(want, keys // TILE, MAX_SPLITS))


def partials_shape(batch: int, n_splits: int, T: int, n_head: int, head_dim: int) -> tuple:
    """(B, n_splits, T, H, D + 2) float32 scratch: acc, then m and l, per split and query row."""
    return batch, n_splits, T, n_head, head_dim + 2


def counters_shape(batch: int, T: int, n_head: int) -> tuple:
    """(B, T * H) int32 split counters, zero before the first call; the kernel leaves them zero."""
    return batch, T * n_head


def _check(a, dtype, ndim: int, name: str):
    assert a.dtype == dtype and a.ndim == ndim and a.is_c_contiguous(), \
        f"{name}: C-contiguous {np.dtype(dtype)} with {ndim} dims expected, got {a.dtype} {a.shape}"


def attention_decode(q, k_pool, v_pool, block_table, pos, out, partials, counters, n_splits: int,
                     scale: float, window: int | None, softcap: float | None, stream,
                     rows_per_block: int | None = None) -> None:
    """out (B, T, H, D) = attention of q (B, T, H, D) float32 over the paged fp16 cache.

    k_pool, v_pool (n_pages, page_size, Hkv, D) float16; block_table (B, max_pages) int32;
    pos (B, T) int32, the positions of the queries, whose K/V are already in the cache;
    partials (B, >= n_splits, T, H, D + 2) float32 scratch; counters (counters_shape) int32,
    zeroed once; n_splits from num_splits.
    window None or > 0; softcap None or > 0. One sequence may pass q/out (T, H, D), pos (T,),
    block_table (max_pages,). rows_per_block: one of ROW_TILES (default row_tile's choice).
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
    assert partials.shape[0] == B and partials.shape[2:] == (T, H, D + 2), "partials shape"
    assert window is None or window > 0, "window must be None or positive"
    assert softcap is None or softcap > 0, "softcap must be None or positive"
    rm = rows_per_block or row_tile(H, Hkv, T)
    assert rm in ROW_TILES, f"rows_per_block {rm}"
    n_groups = -(-(H // Hkv * T) // rm)
    win = np.int32(window or 0)
    assert counters.shape[0] == B and counters.shape[1] >= Hkv * n_groups, "counters shape"
    launch(_SPLIT_KERNELS[(D, rm)], (n_splits, Hkv * n_groups, B), NT, stream,
           q, k_pool.view(np.uint32), v_pool.view(np.uint32), block_table, pos, partials, counters,
           out, np.float32(scale), win, np.float32(softcap or 0.0))


_Q = types.float32[:, :, :, ::1]
_POOL = types.uint32[:, :, :, ::1]
_I2 = types.int32[:, ::1]
_PART = types.float32[:, :, :, :, ::1]
_SPLIT_SIG = (_Q, _POOL, _POOL, _I2, _I2, _PART, _I2, _Q, types.float32, types.int32, types.float32)
BUILD_SIGNATURES = [
    # 166-252 registers: the unrolled score loop and the prefetched V words; few blocks run per
    # step, so occupancy is not what limits them.
    (kernel, _SPLIT_SIG, {"max_registers": 255}) for kernel in _SPLIT_KERNELS.values()
]
