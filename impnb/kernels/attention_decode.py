"""Flash-decoding attention over the paged fp16 KV cache: a split-K kernel and its combine kernel.

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

from impnb.kernels.kv_cache import PAGE_SIZES
from impnb.kernels.norm import warp_max, warp_sum

HEAD_DIMS = (64, 128, 256)
ROW_TILES = (4, 8)     # query rows (token, head of the group) one block holds
MAX_T = 8
MAX_SPLITS = 256
NT = 128               # threads per block
NW = NT // 32          # warps per block
TILE = 32              # keys per inner step
NEG = np.float32(-1e30)  # finite "minus infinity": neutral partials combine without NaN
_ZERO = np.float32(0)
_ONE = np.float32(1)


def _make_split_kernel(D: int, RM: int):
    KP = D + 1           # padded K tile row: lane-per-key reads hit 32 distinct banks
    DW = D // NW         # dims each warp sums in the score stage
    DT = min(D, NT)      # threads per key group in the P·V stage
    KSPLIT = NT // DT    # key groups (2 when D = 64)
    COLS = D // DT       # columns per thread (2 when D = 256)
    RPW = RM // NW       # rows each warp owns in the softmax stage
    QS, KS, SP, PT, ACC = (RM, D), TILE * KP, (NW, RM, TILE), (RM, TILE), (RM, COLS)  # array shapes

    # grid (n_splits, Hkv * n_row_groups, B), block 128 (4 warps).
    # A block owns up to RM query rows r = t * g + j (token t, head kh * g + j) of one KV head and
    # one split of their key range [lo, hi); the range is cut into n_splits chunks of whole
    # 32-key tiles. Per tile: K is staged fp16 -> f32 in shared; warp w forms partial scores over
    # dims [w * D/4, (w + 1) * D/4) with lane = key; warp w then owns rows w, w + 4 for the online
    # softmax (lane = key, shuffles); thread (kg, d0) accumulates P·V for columns d0 + c * DT of
    # keys kg, kg + KSPLIT, ..., reading V straight from global (coalesced over d).
    # shared: qs f32[RM][D] (q * scale), ks f32[32 * (D + 1)], sp f32[4][RM][32] (per-warp
    # partial scores), pt f32[RM][32] (probabilities), alpha f32[RM] (rescale per row),
    # tile_page, tile_off i32[32] (where each key of the tile lives).
    # Writes unnormalized acc, running max m and sum l to partials[b, split, t, h, 0:D | D | D+1];
    # a split with no keys writes (0, NEG, 0).
    def split_kernel(q, k_pool, v_pool, block_table, pos, partials, scale, window, softcap):
        split = cuda.blockIdx.x
        n_splits = cuda.gridDim.x
        b = cuda.blockIdx.z
        T = q.shape[1]
        Hkv = k_pool.shape[2]
        page_size = k_pool.shape[1]
        g = q.shape[2] // Hkv
        n_groups = (g * T + RM - 1) // RM
        kh = cuda.blockIdx.y // n_groups
        r0 = (cuda.blockIdx.y - kh * n_groups) * RM
        nrows = min(RM, g * T - r0)
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        kg = tid // DT
        d0 = tid - kg * DT

        qs = cuda.shared.array(QS, types.float32)
        ks = cuda.shared.array(KS, types.float32)
        sp = cuda.shared.array(SP, types.float32)
        pt = cuda.shared.array(PT, types.float32)
        alpha = cuda.shared.array(RM, types.float32)
        tile_page = cuda.shared.array(TILE, types.int32)
        tile_off = cuda.shared.array(TILE, types.int32)

        # -- the keys [lo, hi) these rows see, and this split's chunk [k_begin, k_end) --
        hi = 0
        lo = 1 << 30
        for r in range(nrows):
            qp = pos[b, (r0 + r) // g]
            hi = max(hi, qp + 1)
            lo = min(lo, qp - window + 1 if window > 0 else 0)
        lo = max(lo, 0)
        chunk = ((hi - lo + n_splits - 1) // n_splits + TILE - 1) // TILE * TILE
        k_begin = lo + split * chunk
        k_end = min(hi, k_begin + chunk)

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
        acc = cuda.local.array(ACC, types.float32)
        for r in range(RM):
            for c in range(COLS):
                acc[r, c] = _ZERO
        cuda.syncthreads()

        for kt in range(k_begin, k_end, TILE):
            # -- where this tile's keys live; -1 past k_end (their pages may not exist) --
            if tid < TILE:
                key = kt + tid
                tile_page[tid] = block_table[b, key // page_size] if key < k_end else -1
                tile_off[tid] = key % page_size
            cuda.syncthreads()

            # -- load K tile, fp16 -> f32; keys past k_end are zero --
            for i in range(tid, TILE * D, NT):
                kk = i // D
                d = i - kk * D
                page = tile_page[kk]
                val = _ZERO
                if page >= 0:
                    val = types.float32(k_pool[page, tile_off[kk], kh, d])
                ks[kk * KP + d] = val
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
                p = math.exp(x - m_new) if seen else _ZERO
                a = math.exp(m[i] - m_new)
                l[i] = l[i] * a + warp_sum(p)
                m[i] = m_new
                pt[r, lane] = p
                if lane == 0:
                    alpha[r] = a
            cuda.syncthreads()

            # -- P·V: columns d0 + c * DT of keys kg, kg + KSPLIT, ...; V from global --
            for r in range(RM):
                a = alpha[r]
                for c in range(COLS):
                    acc[r, c] *= a
            for kk in range(kg, min(TILE, k_end - kt), KSPLIT):
                page = tile_page[kk]
                off = tile_off[kk]
                for c in range(COLS):
                    vv = types.float32(v_pool[page, off, kh, d0 + c * DT])
                    for r in range(RM):
                        acc[r, c] += pt[r, kk] * vv
            cuda.syncthreads()

        # -- partials: key groups summed through shared (ks is free now), then acc, m, l --
        if KSPLIT > 1:
            if kg > 0:
                for r in range(RM):
                    ks[((kg - 1) * RM + r) * DT + d0] = acc[r, 0]
            cuda.syncthreads()
            if kg == 0:
                for g2 in range(1, KSPLIT):
                    for r in range(RM):
                        acc[r, 0] += ks[((g2 - 1) * RM + r) * DT + d0]
        if kg == 0:
            for r in range(RM):
                if r < nrows:
                    row = r0 + r
                    for c in range(COLS):
                        partials[b, split, row // g, kh * g + row % g, d0 + c * DT] = acc[r, c]
        for i in range(RPW):
            r = warp + NW * i
            if lane == 0 and r < nrows:
                row = r0 + r
                partials[b, split, row // g, kh * g + row % g, D] = m[i]
                partials[b, split, row // g, kh * g + row % g, D + 1] = l[i]

    split_kernel.__name__ = f"_decode_split_d{D}_r{RM}_kernel"
    return cuda.jit(split_kernel)


_SPLIT_KERNELS = {(D, RM): _make_split_kernel(D, RM) for D in HEAD_DIMS for RM in ROW_TILES}


# grid (T * H, B), block 128: one block merges the n_splits partials of query row (b, t, h);
# thread i owns columns i, i + 128, ... shared: w f32[MAX_SPLITS] (exp(m_s - M) per split).
@cuda.jit
def _decode_combine_kernel(partials, n_splits, out):
    b = cuda.blockIdx.y
    H = out.shape[2]
    t = cuda.blockIdx.x // H
    h = cuda.blockIdx.x - t * H
    D = out.shape[3]
    w = cuda.shared.array(MAX_SPLITS, types.float32)
    mx = NEG
    for s in range(n_splits):
        mx = max(mx, partials[b, s, t, h, D])
    for s in range(cuda.threadIdx.x, n_splits, cuda.blockDim.x):
        w[s] = math.exp(partials[b, s, t, h, D] - mx)
    cuda.syncthreads()
    total = _ZERO
    for s in range(n_splits):
        total += w[s] * partials[b, s, t, h, D + 1]
    inv = _ONE / total
    for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        acc = _ZERO
        for s in range(n_splits):
            acc += w[s] * partials[b, s, t, h, d]
        out[b, t, h, d] = acc * inv


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


def _check(a, dtype, ndim: int, name: str):
    assert a.dtype == dtype and a.ndim == ndim and a.is_c_contiguous(), \
        f"{name}: C-contiguous {np.dtype(dtype)} with {ndim} dims expected, got {a.dtype} {a.shape}"


def attention_decode(q, k_pool, v_pool, block_table, pos, out, partials, n_splits: int,
                     scale: float, window: int | None, softcap: float | None, stream) -> None:
    """out (B, T, H, D) = attention of q (B, T, H, D) float32 over the paged fp16 cache.

    k_pool, v_pool (n_pages, page_size, Hkv, D) float16; block_table (B, max_pages) int32;
    pos (B, T) int32, the positions of the queries, whose K/V are already in the cache;
    partials (B, >= n_splits, T, H, D + 2) float32 scratch; n_splits from num_splits.
    window None or > 0; softcap None or > 0. One sequence may pass q/out (T, H, D), pos (T,),
    block_table (max_pages,).
    """
    if q.ndim == 3:
        q, out, pos = q.reshape(1, *q.shape), out.reshape(1, *out.shape), pos.reshape(1, q.shape[0])
        block_table = block_table.reshape(1, block_table.size)
    for a, dt, nd, name in ((q, np.float32, 4, "q"), (out, np.float32, 4, "out"),
                            (k_pool, np.float16, 4, "k_pool"), (v_pool, np.float16, 4, "v_pool"),
                            (block_table, np.int32, 2, "block_table"), (pos, np.int32, 2, "pos"),
                            (partials, np.float32, 5, "partials")):
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
    rm = row_tile(H, Hkv, T)
    n_groups = -(-(H // Hkv * T) // rm)
    _SPLIT_KERNELS[(D, rm)][(n_splits, Hkv * n_groups, B), NT, stream](
        q, k_pool, v_pool, block_table, pos, partials, np.float32(scale),
        np.int32(window or 0), np.float32(softcap or 0.0))
    _decode_combine_kernel[(T * H, B), NT, stream](partials, np.int32(n_splits), out)


_Q = types.float32[:, :, :, ::1]
_POOL = types.float16[:, :, :, ::1]
_I2 = types.int32[:, ::1]
_PART = types.float32[:, :, :, :, ::1]
_SPLIT_SIG = (_Q, _POOL, _POOL, _I2, _I2, _PART, types.float32, types.int32, types.float32)
BUILD_SIGNATURES = [
    (kernel, _SPLIT_SIG, {"max_registers": 136}) for kernel in _SPLIT_KERNELS.values()
] + [
    (_decode_combine_kernel, (_PART, types.int32, _Q), {"max_registers": 48}),
]
