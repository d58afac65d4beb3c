"""The MoE router of a batch's grouped decode (gpu/moe.py's moe_ffn_grouped_decode, up to MAX_T
rows) in one launch, in place of a norm kernel, the router's product (cuBLAS's GEMM past
GEMV_MAX_ROWS, gemv.py's GEMV below), moe_route, moe_group (once a tile size) and quantize_x:

  logits (T, E) = h · Wᵀ, h = RMSNorm(x) * wn, W the router's (E, D) float32 rows
  each token's top k experts and their softmax weights (moe.route_warp, as moe_route's)
  the T * k routed slots grouped by expert (moe.make_group_slots, as moe_group's) into tiles of
      at most tm rows, and of tm2 for a second path's tiles (0: none)
  h in int8 (quant_x's groups of 16) where the experts' gate|up takes the dp4a GEMV (quant)

Grid ceil(E / ROWS) blocks of THREADS: block b takes router rows ROWS b .. ROWS b + ROWS - 1 for
every token, TC tokens a pass, thread i columns 4 i, 4 i + 4 THREADS, ... of each; every block
reads all of x (from L2: T x D x 4 bytes a block, the router's rows once in all). A pass's ROWS x
TC dot products of x · wn with the rows and its TC sums of squares of x reduce over each warp at
once (warp_sums_lanes), then over the block; logit = dot / rms. Each block then writes its share
of h's int8 groups, items (t, g) = b, b + grid, ..., and the grid's last block routes the tokens
(a warp a token) and groups the slots (a thread an expert; at a token a tile also in slot order or
by ranks, tuning.ROUTER_DIRECT).
Numpy reference: router_batch_ref.
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32, types

from impnb import tuning
from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.prefetch import PREFETCH_OP
from impnb.kernels.common.warp import shfl_xor, warp_sums_lanes, warp_sync
from impnb.kernels.elementwise.norm import rms_norm_ref
from impnb.kernels.gemv.gemv import aligned16
from impnb.kernels.gemv.gemv_tail import last_block
from impnb.kernels.gemv.quant_x import GROUP, WORDS, QuantX, scale4, store_group
from impnb.kernels.moe.moe import MAX_K, make_group_slots, max_tiles, route_warp
from impnb.launch import launch

THREADS = 512
WARPS = THREADS // 32
ROWS = 2  # router rows a block
TC = 8  # tokens a pass
MAX_T = 32  # tokens a launch (a pass's sums of squares kept in shared memory)
MAX_E = 256  # experts (the grouping takes a thread an expert)
SQ = ROWS * TC  # a pass's sums: ROWS x TC dot products, then TC sums of squares
SUMS = SQ + TC
assert MAX_T % TC == 0 and SUMS <= 32

_group_slots = make_group_slots(THREADS, MAX_E)
SCAN, OWN, RANKED = 0, 1, 2  # a token a tile's grouping: moe_group's scans, slot order, ranks
MAX_S = MAX_T * MAX_K  # slots a launch


@cuda.jit(device=True, inline=True)
def _rank_slots(slots, order, slot_row, tiles, n_tiles):
    """moe_group's writes at a token a tile (tm 1) by every thread of the block: each slot's row is
    its rank among the S slots by (expert, slot), one tile a row; S <= MAX_S. P threads a slot (the
    largest power of two up to 32 with S P <= THREADS, lanes of one warp), each counting the slots
    ahead among every P-th, their counts summed by shuffles. slots: read after a barrier."""
    tid = cuda.threadIdx.x
    S = slots.shape[0]
    se = cuda.shared.array(MAX_S, int32)
    if tid < S:
        se[tid] = slots[tid]
    P = 32
    while P > 1 and S * P > THREADS:
        P >>= 1
    s = tid // P
    part = tid - s * P
    cuda.syncthreads()
    e = se[min(s, S - 1)]
    r = int32(0)
    for j in range(part, S, P):
        a = se[j]
        r += int32(a < e or a == e and j < s)
    off = P >> 1
    while off > 0:  # every lane of the warp: P divides 32, so a slot's lanes are one aligned group
        r += shfl_xor(r, off)
        off >>= 1
    if part == 0 and s < S:
        order[r] = s
        slot_row[s] = r
        tiles[r, 0] = e
        tiles[r, 1] = r
        tiles[r, 2] = 1
    if tid == 0:
        n_tiles[0] = S


@lru_cache(maxsize=None)
def router_batch_kernel(l2_rows: bool = False, early: bool = False, direct: int = SCAN):
    """The kernel; l2_rows: each block's router rows prefetched into L2 before its wait; early: a
    thread's first four columns of its rows and of wn loaded into registers before it; direct: how
    a grouping of a token a tile (tm 1, no second) is made: SCAN, moe_group's scans; OWN, the slots
    in their own order (slot s the tile s, its own row), written by the routing warps; RANKED, by
    expert, each slot's row its rank (_rank_slots)."""
    return cuda.jit(_make(l2_rows, early, direct))


def _make(l2_rows: bool, early: bool = False, direct: int = SCAN):
    """_router_batch_kernel's Python function for one setting of l2_rows, early and direct."""
    def _router_batch_kernel(x, wn, eps, w, logits, k, normalize, experts, slots, weights, q, d, s, quant,
                             tm, order, slot_row, tiles, n_tiles, tm2, order2, slot_row2, tiles2, n_tiles2, counter):
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        T, D = x.shape
        E = w.shape[0]
        e0 = cuda.blockIdx.x * ROWS
        red = cuda.shared.array((WARPS, SUMS), float32)
        rs = cuda.shared.array(MAX_T, float32)  # 1 / rms of each token
        acc = cuda.local.array(32, float32)  # a pass's sums: row r's dot of token t at r TC + t, its squares at SQ + t
        wr = cuda.local.array((ROWS, 4), float32)
        if l2_rows and tid == 0:  # the block's router rows on their way to L2 while the kernel before runs
            ptx.prefetch_l2(w, e0 * D * 4, (min(e0 + ROWS, E) - e0) * D * 4)
        pw = cuda.local.array((ROWS, 4), float32)  # early: the first columns' router rows and wn
        p0 = p1 = p2 = p3 = float32(0.0)
        if early and 4 * tid < D:  # (no kernel writes W or wn)
            p0, p1, p2, p3 = qi.ldg_f32x4(wn, 4 * tid)
            for r in range(ROWS):
                pw[r, 0], pw[r, 1], pw[r, 2], pw[r, 3] = qi.ldg_f32x4(w, min(e0 + r, E - 1) * D + 4 * tid)
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished (x)
        ptx.grid_dep_launch()
        # -- the block's logits, TC tokens a pass --
        for c0 in range(0, T, TC):
            for i in range(32):
                acc[i] = float32(0.0)
            for col in range(4 * tid, D, 4 * THREADS):
                if early and col == 4 * tid:
                    n0, n1, n2, n3 = p0, p1, p2, p3
                    for r in range(ROWS):
                        wr[r, 0], wr[r, 1], wr[r, 2], wr[r, 3] = pw[r, 0], pw[r, 1], pw[r, 2], pw[r, 3]
                else:
                    n0, n1, n2, n3 = qi.ldg_f32x4(wn, col)
                    for r in range(ROWS):
                        wr[r, 0], wr[r, 1], wr[r, 2], wr[r, 3] = qi.ldg_f32x4(w, min(e0 + r, E - 1) * D + col)
                for t in range(TC):
                    v0, v1, v2, v3 = qi.ldg_f32x4(x, min(c0 + t, T - 1) * D + col)
                    acc[SQ + t] += (v0 * v0 + v1 * v1) + (v2 * v2 + v3 * v3)
                    h0, h1, h2, h3 = v0 * n0, v1 * n1, v2 * n2, v3 * n3
                    for r in range(ROWS):
                        acc[r * TC + t] += (h0 * wr[r, 0] + h1 * wr[r, 1]) + (h2 * wr[r, 2] + h3 * wr[r, 3])
            v = warp_sums_lanes(acc, 32)  # lane i: the warp's sum i
            if lane < SUMS:
                red[warp, lane] = v
            cuda.syncthreads()
            if tid < SUMS:  # thread r TC + t: row r's logit of token c0 + t; past them: 1 / rms
                t = tid % TC
                dot = float32(0.0)
                ss = float32(0.0)
                for i in range(WARPS):
                    dot += red[i, tid]
                    ss += red[i, SQ + t]
                scale = float32(1.0) / math.sqrt(ss / float32(D) + eps)
                e = e0 + tid // TC
                if tid >= SQ:
                    rs[c0 + t] = scale
                elif c0 + t < T and e < E:
                    logits[c0 + t, e] = dot * scale
            cuda.syncthreads()  # red is free again; rs written
        # -- the block's share of h's int8 groups --
        if quant:
            G = d.shape[1]
            v = cuda.local.array(GROUP, float32)
            for item in range(cuda.blockIdx.x + cuda.gridDim.x * tid, T * G, cuda.gridDim.x * THREADS):
                t = item // G
                g = item - t * G
                for j in range(WORDS):
                    c = GROUP * g + 4 * j
                    v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3] = qi.ldg_f32x4(x, t * D + c)
                    scale4(v, j, rs[t], wn, c)
                store_group(v, q, d, s, t, g)
        # -- the last block: route each token, then group the slots --
        if last_block(counter):
            rows = cuda.shared.array((WARPS, MAX_E), float32)
            own = direct == OWN and tm == 1 and tm2 == 0
            for t in range(warp, T, WARPS):
                route_warp(logits, t, E, k, normalize, experts, weights, rows[warp], 0)
                if own:  # slot t k + j (lane j) is tile t k + j: the warp's own choices, no barrier
                    warp_sync()  # lane 0 wrote the choices
                    if lane < k:
                        sl = t * k + lane
                        tiles[sl, 0] = experts[t, lane]
                        tiles[sl, 1] = sl
                        tiles[sl, 2] = 1
                        order[sl] = sl
                        slot_row[sl] = sl
            if own:
                if tid == 0:
                    n_tiles[0] = T * k
                return
            cuda.syncthreads()  # experts written for the grouping's readers
            if direct == RANKED and tm == 1 and tm2 == 0:
                _rank_slots(slots, order, slot_row, tiles, n_tiles)
                return
            _group_slots(slots, E, tm, order, slot_row, tiles, n_tiles)
            if tm2 > 0:
                _group_slots(slots, E, tm2, order2, slot_row2, tiles2, n_tiles2)

    return _router_batch_kernel


def takes(n_tok: int, n_expert: int, k: int) -> bool:
    """Whether router_batch takes a step of n_tok rows routing k of n_expert experts."""
    return 1 <= n_tok <= MAX_T and 1 <= k <= min(MAX_K, n_expert) and n_expert <= MAX_E


def in_slot_order(groups: list) -> bool:
    """Whether router_batch writes groups (moe.Grouping) in slot order: each slot its own tile and
    row (OWN: one grouping, a token a tile)."""
    return tuning.ROUTER_DIRECT == OWN and len(groups) == 1 and groups[0].tm == 1


def router_batch(x, norm: tuple, w, logits, k: int, normalize: bool, experts, weights, xq: QuantX | None,
                 groups: list, counter, stream) -> None:
    """The router of T = x's rows (up to MAX_T) and its routing in one launch: logits (T, E) =
    RMSNorm(x) * wn · wᵀ (norm = (wn, eps); w (E, D) float32), experts (T, k) int32 and weights
    (T, k) float32 as moe_route's of those logits, the slots experts.reshape(T * k) grouped as
    moe_group's by each of groups (one or two moe.Grouping: the first writes order and slot_row as
    moe_group does, a second its tiles over its own order and slot_row), and with xq the int8
    form of RMSNorm(x) * wn there (quantize_x's groups). counter (1,) uint32, zero between uses."""
    T, D = x.shape
    E = w.shape[0]
    wn, eps = norm
    assert takes(T, E, k) and len(groups) in (1, 2) and D % GROUP == 0
    for a in (x, w, logits, weights, wn):
        assert a.dtype == np.float32 and a.is_c_contiguous()
    assert all(aligned16(a) for a in (x, w, wn)), "four-float loads"
    assert w.shape == (E, D) and wn.shape == (D,) and logits.shape == (T, E)
    assert experts.shape == weights.shape == (T, k) and experts.dtype == np.int32 and experts.is_c_contiguous()
    assert counter.dtype == np.uint32 and counter.shape == (1,)
    for g in groups:
        assert g.tm >= 1 and g.order.shape == g.slot_row.shape == (T * k,)
        assert g.tiles.shape == (max_tiles(T * k, E, g.tm), 3) and g.n_tiles.shape == (1,)
    if xq is not None:
        assert xq.q.shape == (T, D // 4) and xq.d.shape == xq.s.shape == (T, D // GROUP)
    q, dd, ss = xq or (x.view(np.uint32), x, x)  # without xq: not written, any of the right types
    second = groups[-1] if len(groups) == 2 else groups[0]._replace(tm=0)
    kernel = router_batch_kernel(tuning.L2_PREFETCH_ROWS, tuning.ROUTER_EARLY, tuning.ROUTER_DIRECT)
    launch(kernel, -(-E // ROWS), THREADS, stream, x, wn, np.float32(eps), w,
           logits, np.int32(k), np.int32(normalize), experts, experts.reshape(T * k), weights, q, dd, ss, np.int32(xq is not None),
           *(np.int32(a) if i == 0 else a for i, a in enumerate(groups[0])),
           *(np.int32(a) if i == 0 else a for i, a in enumerate(second)), counter)


def router_batch_ref(x: np.ndarray, wn: np.ndarray, eps: float, w: np.ndarray) -> np.ndarray:
    """The logits (T, E) float64 that router_batch computes in float32: RMSNorm(x) * wn · wᵀ; its
    experts and weights are route_ref's of its own logits, its groupings group_ref's of those."""
    return rms_norm_ref(x, wn, eps).astype(np.float64) @ w.astype(np.float64).T


_F2 = types.Array(types.float32, 2, "C")
_F1 = types.Array(types.float32, 1, "C")
_I1 = types.Array(types.int32, 1, "C")
_I2 = types.Array(types.int32, 2, "C")
_GROUPING = (types.int32, _I1, _I1, _I2, _I1)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    sig = types.void(_F2, _F1, types.float32, _F2, _F2, types.int32, types.int32, _I2, _I1, _F2,
                     types.Array(types.uint32, 2, "C"), _F2, _F2, types.int32, *_GROUPING, *_GROUPING,
                     types.Array(types.uint32, 1, "C"))
    return [(router_batch_kernel(l2, l2, d), sig, {"max_registers": 128, "ptx_contains": (PREFETCH_OP,) * l2})
            for l2, d in ((False, SCAN), (True, SCAN), (True, OWN), (True, RANKED))]  # (the engine: l2 and early on)
