"""Mixture-of-experts routing on the GPU: softmax top-k per token, grouping of the routed slots by
expert (prefill), and the weighted sum of the experts' outputs; numpy references beside each.

Legend: T tokens, E experts, k experts per token, S = T * k routed slots (slot s = t * k + j is
token t's j-th choice), D model dim.
"""

import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, int64, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.warp import scan_rounds, warp_max_u32, warp_min_u32, warp_sum, warp_sync
from impnb.kernels.moe.reference import combine_ref, group_ref, route_ref  # noqa: F401
from impnb.launch import launch

MAX_K = 8
MAX_EXPERTS = 1024       # a lane's taken-mask has one bit per 32 experts
QUEUE = 4                # experts a lane keeps sorted in registers in route_warp's short form
ROUTE_WARPS = 4          # tokens per route block
GROUP_THREADS = MAX_EXPERTS  # moe_group: a thread an expert
COMBINE_THREADS = 128
NEG = np.float32(-3.0e38)
SIGN = np.uint32(0x80000000)
ALL_ONES = np.uint32(0xFFFFFFFF)


def check_experts(cfg, own_loop: bool = False) -> None:
    """UnsupportedError unless the routing kernels take cfg's expert counts (and, for
    gpu/forward.py's loop, the experts have no post-norm; own_loop: gemma4's norms them apart)."""
    from impnb.errors import UnsupportedError

    if not (1 <= cfg.n_expert_used <= MAX_K and cfg.n_expert <= MAX_EXPERTS):
        raise UnsupportedError(f"{cfg.n_expert} experts with {cfg.n_expert_used} per token: the GPU "
                               f"path routes up to {MAX_EXPERTS} experts, up to {MAX_K} per token; "
                               "use --device cpu")
    if cfg.post_norms and not own_loop:
        raise UnsupportedError("experts with post-norms: the GPU path's decode fuses the pre-norms into "
                               "the expert GEMVs; use --device cpu")


def max_tiles(n_slots: int, n_expert: int, tm: int) -> int:
    """Most tiles moe_group can write: each non-empty expert adds at most one partial tile."""
    return min(n_slots, n_slots // tm + min(n_expert, n_slots))


@cuda.jit(device=True, inline=True)
def order_key(v):
    """A uint32 ordered as float32 v is (NaN aside): sign-flipped bits, -0 taken as +0 (equal
    floats, equal keys); 0 below every float."""
    b = qi.f32_bits(v + float32(0.0))  # -0 + 0 = +0
    return b ^ ALL_ONES if b & SIGN else b | SIGN


@cuda.jit(device=True, inline=True)
def key_value(u):
    """The float32 of order_key u."""
    return qi.as_f32(u ^ SIGN if u & SIGN else u ^ ALL_ONES)


@cuda.jit(device=True, inline=True)
def lane_best(row, lane, E, taken):
    """(order key, expert) of the lane's largest untaken logit, the lower expert on ties; key 0
    and expert E when none is left."""
    bk = np.uint32(0)
    bi = E
    for i in range((E + 31) >> 5):
        e = lane + 32 * i
        if e < E and (taken >> i) & 1 == 0:
            key = order_key(row[e])
            if key > bk:
                bk = key
                bi = e
    return bk, bi


@cuda.jit(device=True, inline=True)
def weigh(v, mx, t, E, k, normalize, logits, scale, weights):
    """A warp: the softmax weights of token t's k choices into weights[t], lane j < k holding v,
    the j-th choice's logit, and mx the first's; without normalize the denominator sums over
    every expert's logit (the first E of each row of logits (T, >= E) through L2, each times
    scale first)."""
    lane = cuda.threadIdx.x & 31
    stride = logits.shape[1]
    p = math.exp(v - mx) if lane < k else float32(0.0)
    if normalize:
        den = warp_sum(p)
    else:
        den = float32(0.0)
        for i in range((E + 31) >> 5):
            e = lane + 32 * i
            if e < E:
                den += math.exp(ptx.ld_global_cg_f32(logits, t * stride + e) * scale - mx)
        den = warp_sum(den)
    if lane < k:
        weights[t, lane] = p / den


@cuda.jit(device=True, inline=True)
def route_token(logits, t, k, normalize, experts, weights, row):
    """One warp: token t's top k experts and their softmax weights from logits (T, E) (route_ref)
    into experts[t], weights[t] (route_warp over every logit of the row)."""
    route_warp(logits, t, logits.shape[1], k, normalize, experts, weights, row, 0)


@cuda.jit(device=True, inline=True)
def _ahead(ka, ia, kb, ib):
    """Whether expert ib of order key kb goes before expert ia of key ka: a larger key, or an
    equal one at a lower expert."""
    return kb > ka or (kb == ka and ib < ia)


@cuda.jit(device=True, inline=True)
def _in_order(ka, ia, kb, ib):
    """(key, expert) pairs a and b, the one that goes first first."""
    if _ahead(ka, ia, kb, ib):
        return kb, ib, ka, ia
    return ka, ia, kb, ib


@cuda.jit(device=True, inline=True)
def _record(j, top, win, lane, t, experts, mx, mine):
    """A warp's round j: expert win, of order key top, is token t's j-th choice (lane 0 writes it);
    -> (mx, mine): the first choice's logit, and in lane j the j-th's."""
    val = key_value(top)
    if j == 0:
        mx = val
    if j == lane:
        mine = val
    if lane == 0:
        experts[t, j] = win
    return mx, mine


@cuda.jit(device=True, inline=True)
def _chosen(mine, mx, lane, t, E, k, normalize, logits, weights, raw):
    """A warp, lane j < k holding the j-th choice's logit: their softmax weights (weigh) into
    weights[t], or with raw the logits themselves."""
    if raw:
        if lane < k:
            weights[t, lane] = mine
    else:
        weigh(mine, mx, t, E, k, normalize, logits, float32(1.0), weights)


@cuda.jit(device=True, inline=True)
def _route_warp_queued(logits, t, E, k, normalize, experts, weights, raw):
    """route_warp for E <= 32 QUEUE experts: each lane's experts lane + 32 q (q < QUEUE; key 0
    past E, below every logit's) sorted once in registers, so that a round's winner takes its
    next best off the front of its queue instead of rescanning its experts (a round was ~1000
    cycles of one warp's chained latency; docs/EXPERIMENTS.md, 'router_batch's phases')."""
    lane = cuda.threadIdx.x & 31
    base = t * logits.shape[1]
    v0 = ptx.ld_global_cg_f32(logits, base + min(lane, E - 1))  # four L2 loads in flight
    v1 = ptx.ld_global_cg_f32(logits, base + min(lane + 32, E - 1))
    v2 = ptx.ld_global_cg_f32(logits, base + min(lane + 64, E - 1))
    v3 = ptx.ld_global_cg_f32(logits, base + min(lane + 96, E - 1))
    i0, i1, i2, i3 = uint32(lane), uint32(lane + 32), uint32(lane + 64), uint32(lane + 96)
    k0 = order_key(v0) if i0 < E else uint32(0)
    k1 = order_key(v1) if i1 < E else uint32(0)
    k2 = order_key(v2) if i2 < E else uint32(0)
    k3 = order_key(v3) if i3 < E else uint32(0)
    # -- a sorting network of four: (0, 1), (2, 3), (0, 2), (1, 3), (1, 2) --
    k0, i0, k1, i1 = _in_order(k0, i0, k1, i1)
    k2, i2, k3, i3 = _in_order(k2, i2, k3, i3)
    k0, i0, k2, i2 = _in_order(k0, i0, k2, i2)
    k1, i1, k3, i3 = _in_order(k1, i1, k3, i3)
    k1, i1, k2, i2 = _in_order(k1, i1, k2, i2)
    mx = NEG
    mine = NEG  # lane j < k: the logit of the j-th choice
    for j in range(k):
        top = warp_max_u32(k0)
        win = warp_min_u32(i0 if k0 == top else ALL_ONES)
        if win == i0:  # this lane's front was taken: the queue moves up
            k0, i0, k1, i1, k2, i2 = k1, i1, k2, i2, k3, i3
            k3, i3 = uint32(0), ALL_ONES
        mx, mine = _record(j, top, win, lane, t, experts, mx, mine)
    _chosen(mine, mx, lane, t, E, k, normalize, logits, weights, raw)


@cuda.jit(device=True, inline=True)
def route_warp(logits, t, E, k, normalize, experts, weights, row, raw):
    """One warp: token t's top k experts among the first E logits of row t of logits (T, >= E)
    and their softmax weights into experts[t], weights[t] (with raw: the chosen logits, for a
    later weigh), as route_block's bit for bit. The logits are read through L2 (ld.global.cg:
    they may come from other blocks of the same grid); up to 32 QUEUE experts into registers
    (_route_warp_queued), more into row, this warp's (MAX_EXPERTS,) float32 of shared memory.
    Lane owns experts lane, lane + 32, ... (bit i of `taken` marks expert lane + 32 i as chosen)
    and keeps its best untaken one; each of the k rounds takes the warp's largest key and, among
    the lanes holding it, the lowest expert (two redux.sync), and the winning lane finds its next
    best. The softmax denominator is a warp sum."""
    if E <= 32 * QUEUE:
        _route_warp_queued(logits, t, E, k, normalize, experts, weights, raw)
        return
    lane = cuda.threadIdx.x & 31
    base = t * logits.shape[1]
    for e0 in range(lane, E, 128):  # four L2 loads in flight a lane
        v = cuda.local.array(4, float32)
        for q in range(4):
            v[q] = ptx.ld_global_cg_f32(logits, base + min(e0 + 32 * q, E - 1))
        for q in range(4):
            if e0 + 32 * q < E:
                row[e0 + 32 * q] = v[q]
    warp_sync()
    taken = 0
    bk, bi = lane_best(row, lane, E, taken)
    mx = NEG
    mine = NEG  # lane j < k: the logit of the j-th choice
    # -- top k --
    for j in range(k):
        top = warp_max_u32(bk)
        win = warp_min_u32(np.uint32(bi) if bk == top else ALL_ONES)
        if win & 31 == lane:
            taken |= 1 << (win >> 5)
            bk, bi = lane_best(row, lane, E, taken)
        mx, mine = _record(j, top, win, lane, t, experts, mx, mine)
    _chosen(mine, mx, lane, t, E, k, normalize, logits, weights, raw)
    warp_sync()  # row is free again


@cuda.jit(device=True, inline=True)
def route_block(logits, t, E, k, normalize, experts, weights, keys, vals, raw):
    """Every thread of a block: route_token's experts and weights of token t into experts[t],
    weights[t], bit for bit, from the first E logits of row t of logits (T, >= E) (any past them
    are no expert's: Qwen3.5's shared expert gate), by ranks rather than k rounds: thread i
    keeps the order keys (order_key) of experts i, i + blockDim, ... in shared keys (MAX_EXPERTS,)
    uint32, then counts for each of them the experts ahead of it (a larger key, or an equal one at
    a lower index); rank j < k is the j-th choice (its logit into shared vals (MAX_K,) float32).
    Warp 0 then weighs the choices as route_token does (weigh), or with raw leaves the chosen
    logits in weights[t] for a later weigh. The logits are read through L2 (ld.global.cg)."""
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    stride = logits.shape[1]
    E4 = (E + 7) >> 3 << 3
    for e in range(tid, E4, n):  # keys past E are 0: at an index past every expert, never ahead
        keys[e] = order_key(ptx.ld_global_cg_f32(logits, t * stride + e)) if e < E else uint32(0)
    cuda.syncthreads()
    for e in range(tid, E, n):
        # -- eight keys a step into four counts: independent shared loads, not one a step (the
        # router 11% faster with four a step; eight measured even with four; docs/EXPERIMENTS.md,
        # 'MoE decode') --
        mine = keys[e]
        a0 = a1 = a2 = a3 = 0
        for f in range(0, E4, 8):
            k0, k1, k2, k3 = keys[f], keys[f + 1], keys[f + 2], keys[f + 3]
            k4, k5, k6, k7 = keys[f + 4], keys[f + 5], keys[f + 6], keys[f + 7]
            a0 += (k0 > mine) or (k0 == mine and f < e)
            a1 += (k1 > mine) or (k1 == mine and f + 1 < e)
            a2 += (k2 > mine) or (k2 == mine and f + 2 < e)
            a3 += (k3 > mine) or (k3 == mine and f + 3 < e)
            a0 += (k4 > mine) or (k4 == mine and f + 4 < e)
            a1 += (k5 > mine) or (k5 == mine and f + 5 < e)
            a2 += (k6 > mine) or (k6 == mine and f + 6 < e)
            a3 += (k7 > mine) or (k7 == mine and f + 7 < e)
        ahead = a0 + a1 + a2 + a3
        if ahead < k:
            experts[t, ahead] = e
            vals[ahead] = key_value(mine)
    cuda.syncthreads()
    if tid < k and raw:
        weights[t, tid] = vals[tid]
    elif tid < 32 and not raw:
        weigh(vals[tid] if tid < k else float32(0.0), vals[0], t, E, k, normalize, logits, float32(1.0), weights)
    cuda.syncthreads()  # keys and vals are free again


def route_rows(n_tok: int):
    """The device function route(logits, E, k, normalize, experts, weights, raw) that every thread
    of one block of ROUTE_WARPS warps calls to route the n_tok rows of logits (a grid's last block):
    route_block's ranks for one row (the whole block on it), a warp a row (route_warp, rows w,
    w + ROUTE_WARPS, ... on warp w) for more: the block's rows one after another cost a few µs
    each, the latency of route_block's barriers and L2 reads (docs/EXPERIMENTS.md, 'A batch's
    MoE router in one launch, the router's tail, decode attention's splits')."""
    if n_tok == 1:
        @cuda.jit(device=True, inline=True)
        def route_one(logits, E, k, normalize, experts, weights, raw):
            keys = cuda.shared.array(MAX_EXPERTS, uint32)
            vals = cuda.shared.array(MAX_K, float32)
            route_block(logits, 0, E, k, normalize, experts, weights, keys, vals, raw)
        return route_one

    @cuda.jit(device=True, inline=True)
    def route_warps(logits, E, k, normalize, experts, weights, raw):
        rows = cuda.shared.array((ROUTE_WARPS, MAX_EXPERTS), float32)
        warp = cuda.threadIdx.x >> 5
        if warp < ROUTE_WARPS:
            for t in range(warp, n_tok, ROUTE_WARPS):
                route_warp(logits, t, E, k, normalize, experts, weights, rows[warp], raw)
        cuda.syncthreads()  # experts and weights written for the block's later readers
    return route_warps


# grid (ceil(T / 4),), block 128: warp w of block b routes token t = 4b + w (route_token).
@cuda.jit
def _route_kernel(logits, k, normalize, experts, weights):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    warp = cuda.threadIdx.x >> 5
    rows = cuda.shared.array((ROUTE_WARPS, MAX_EXPERTS), float32)
    t = cuda.blockIdx.x * ROUTE_WARPS + warp
    if t < logits.shape[0]:
        route_token(logits, t, k, normalize, experts, weights, rows[warp])


def moe_route(logits, k: int, normalize: bool, experts, weights, stream) -> None:
    """Router logits (T, E) float32 -> experts (T, k) int32, weights (T, k) float32 (route_ref)."""
    T, E = logits.shape
    assert 1 <= k <= min(MAX_K, E) and E <= MAX_EXPERTS, (k, E)
    assert experts.shape == weights.shape == (T, k) and experts.dtype == np.int32
    assert logits.dtype == weights.dtype == np.float32
    launch(_route_kernel, -(-T // ROUTE_WARPS), 32 * ROUTE_WARPS, stream,
           logits, np.int32(k), np.int32(normalize), experts, weights)


class Grouping(NamedTuple):
    """A grouping of the routed slots by expert into tiles of at most tm rows: moe_group's outputs
    (moe_group(experts, E, *grouping, stream) writes them)."""
    tm: int
    order: object  # (S,) int32
    slot_row: object  # (S,) int32
    tiles: object  # (max_tiles(S, E, tm), 3) int32
    n_tiles: object  # (1,) int32


def make_group_slots(threads: int, max_experts: int):
    """group_slots(experts, n_expert, tm, order, slot_row, tiles, n_tiles): what moe_group writes,
    by every thread of a block of `threads` threads, one an expert (n_expert <= max_experts <=
    threads). Shared: counts, fill (max_experts), the scans' seg, tile0 (max_experts + 1) int32 and
    a Hillis-Steele double buffer (threads). Counts by shared atomics; the block scans each
    expert's (slots, tiles) packed in one int64 into segment starts and first tiles; each slot then
    takes the next free row of its expert's segment (by atomics, so the order inside a segment is
    unspecified: every row is computed on its own, results do not depend on it); each expert writes
    its tiles of at most tm rows. experts: read after a barrier (another kernel's output, or this
    block's)."""
    bounds = max_experts + 1  # the scans' starts and ends

    @cuda.jit(device=True, inline=True)
    def group_slots(experts, n_expert, tm, order, slot_row, tiles, n_tiles):
        tid = cuda.threadIdx.x
        S = experts.shape[0]
        counts = cuda.shared.array(max_experts, int32)
        fill = cuda.shared.array(max_experts, int32)
        seg = cuda.shared.array(bounds, int32)
        tile0 = cuda.shared.array(bounds, int32)
        buf = cuda.shared.array((2, threads), int64)
        if tid < n_expert:
            counts[tid] = 0
            fill[tid] = 0
        cuda.syncthreads()
        for s in range(tid, S, threads):
            cuda.atomic.add(counts, experts[s], 1)
        cuda.syncthreads()
        # -- inclusive scan of (slots << 32 | tiles) over the experts --
        own = int64(0)
        if tid < n_expert:
            c = counts[tid]
            own = (int64(c) << 32) | int64((c + tm - 1) // tm)
        buf[0, tid] = own
        cuda.syncthreads()
        src = scan_rounds(buf, tid, n_expert)
        if tid < n_expert:
            incl = buf[src, tid]
            first = incl - own
            seg[tid] = int32(first >> 32)
            tile0[tid] = int32(first & 0xFFFFFFFF)
            if tid == n_expert - 1:
                seg[n_expert] = int32(incl >> 32)
                tile0[n_expert] = int32(incl & 0xFFFFFFFF)
                n_tiles[0] = int32(incl & 0xFFFFFFFF)
        cuda.syncthreads()
        # -- place the slots, write the tiles --
        for s in range(tid, S, threads):
            e = experts[s]
            r = seg[e] + cuda.atomic.add(fill, e, 1)
            order[r] = s
            slot_row[s] = r
        if tid < n_expert:
            for i in range(tile0[tid], tile0[tid + 1]):
                r0 = seg[tid] + (i - tile0[tid]) * tm
                tiles[i, 0] = tid
                tiles[i, 1] = r0
                tiles[i, 2] = min(tm, seg[tid + 1] - r0)
        cuda.syncthreads()  # the shared arrays are free again

    return group_slots


_group_slots = make_group_slots(GROUP_THREADS, MAX_EXPERTS)


# grid (1,), block GROUP_THREADS (one thread an expert): group_slots
@cuda.jit
def _group_kernel(experts, n_expert, tm, order, slot_row, tiles, n_tiles):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    _group_slots(experts, n_expert, tm, order, slot_row, tiles, n_tiles)


def moe_group(experts, n_expert: int, tm: int, order, slot_row, tiles, n_tiles, stream) -> None:
    """Routed slots experts (S,) int32 grouped by expert: order (S,) the slot at each grouped row,
    slot_row (S,) its inverse, tiles (max_tiles, 3) int32 (e, first row, rows <= tm) in expert
    order, n_tiles (1,) int32 how many (group_ref's segments and tiles)."""
    S = experts.shape[0]
    assert n_expert <= MAX_EXPERTS and tm >= 1
    assert order.shape == slot_row.shape == (S,) and tiles.shape == (max_tiles(S, n_expert, tm), 3)
    for a in (experts, order, slot_row, tiles, n_tiles):
        assert a.dtype == np.int32 and a.is_c_contiguous()
    launch(_group_kernel, 1, GROUP_THREADS, stream, experts, np.int32(n_expert), np.int32(tm),
           order, slot_row, tiles, n_tiles)


# grid (T, ceil(D / 128)), block 128: thread d of token t sums its k weighted slot rows in order
# (and adds the sum to out's value with accumulate).
@cuda.jit
def _combine_kernel(y, rows, weights, out, accumulate):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    t = cuda.blockIdx.x
    d = cuda.blockIdx.y * COMBINE_THREADS + cuda.threadIdx.x
    if d < out.shape[1]:
        k = weights.shape[1]
        acc = float32(0.0)
        for j in range(k):
            acc += weights[t, j] * y[rows[t * k + j], d]
        out[t, d] = out[t, d] + acc if accumulate else acc


def moe_combine(y, rows, weights, out, stream, accumulate: bool = False) -> None:
    """out (T, D) = sum_j weights[t, j] * y[rows[t * k + j]] (out += with accumulate: a residual
    add, out + the sum); y (rows, D), rows (>= T * k,) int32."""
    T, D = out.shape
    assert weights.shape[0] == T and rows.shape[0] >= T * weights.shape[1] and y.shape[1] == D
    launch(_combine_kernel, (T, -(-D // COMBINE_THREADS)), COMBINE_THREADS, stream, y, rows, weights, out,
           np.int32(accumulate))


F32_2D = float32[:, ::1]
_I32_1D = int32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_route_kernel, (F32_2D, int32, int32, int32[:, ::1], F32_2D), {"max_registers": 64}),
        (_group_kernel, (_I32_1D, int32, int32, _I32_1D, _I32_1D, int32[:, ::1], _I32_1D), {"max_registers": 64}),
        (_combine_kernel, (F32_2D, _I32_1D, F32_2D, F32_2D, int32), {"max_registers": 32}),
    ]
