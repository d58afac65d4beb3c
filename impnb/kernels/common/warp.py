"""Warp and block reductions and shuffles shared by the kernels, with the simulator's twins
(the simulator has no warp shuffles: see `_sim_warp_values`)."""

import threading

import numpy as np
from numba import cuda, int32
from numba.cuda.core import config as cuda_config

from impnb.kernels.common import ptx

SIMULATOR = bool(cuda_config.ENABLE_CUDASIM)
WARP = 32


def _sim_warp_values(value):
    """The simulator has no warp shuffles: the warp's 32 threads meet at a barrier (kept on the
    BlockManager, which runs one block at a time with every thread live) and each gets the list
    of all 32 values. Two buffers taken in turn let one barrier per call suffice: a lane can only
    reuse a buffer after every lane has passed the next call's barrier, hence finished reading
    this one."""
    thread = threading.current_thread()
    warps = thread._manager.__dict__.setdefault("impnb_warps", {})
    barrier, bufs = warps.setdefault(thread.thread_id // WARP,
                                     (threading.Barrier(WARP), ([None] * WARP, [None] * WARP)))
    turn = thread.__dict__.get("impnb_turn", 0)
    thread.impnb_turn = turn ^ 1
    bufs[turn][thread.thread_id % WARP] = value
    barrier.wait()
    return list(bufs[turn])


def _sim_butterfly(value, combine, offsets=(16, 8, 4, 2, 1)):
    """Each lane replays the xor butterfly over the warp's 32 values: the shuffle result."""
    thread = threading.current_thread()
    vals = _sim_warp_values(value)
    for off in offsets:
        vals = [combine(vals[i], vals[i ^ off]) for i in range(WARP)]
    return vals[thread.thread_id % WARP]


if SIMULATOR:
    def warp_sum(v):
        return _sim_butterfly(v, lambda a, b: a + b)

    def warp_max(v):
        return _sim_butterfly(v, max)

    def quad_sum(v):
        return _sim_butterfly(v, lambda a, b: a + b, (1, 2))

    def quad_max(v):
        return _sim_butterfly(v, max, (1, 2))

    def warp_any(pred):
        return any(_sim_warp_values(bool(pred)))

    def warp_sync():
        _sim_warp_values(None)

    def warp_max_u32(v):
        return np.uint32(max(int(u) for u in _sim_warp_values(int(v) & 0xFFFFFFFF)))

    def warp_min_u32(v):
        return np.uint32(min(int(u) for u in _sim_warp_values(int(v) & 0xFFFFFFFF)))

    def shfl_xor(v, off):
        return _sim_butterfly(v, lambda a, b: b, (int(off),))

    def shfl_idx(v, src):
        return _sim_warp_values(v)[int(src)]
else:
    @cuda.jit(device=True, inline=True)
    def shfl_xor(v, off):
        """v of lane (lane xor off). Whole warps only."""
        return cuda.shfl_xor_sync(0xFFFFFFFF, v, off)

    @cuda.jit(device=True, inline=True)
    def shfl_idx(v, src):
        """v of lane src (the same for every lane, or not). Whole warps only."""
        return cuda.shfl_sync(0xFFFFFFFF, v, src)

    @cuda.jit(device=True, inline=True)
    def warp_sum(v):
        """Butterfly sum over the 32 lanes; every lane gets the total. Whole warps only."""
        for off in (16, 8, 4, 2, 1):
            v += cuda.shfl_xor_sync(0xFFFFFFFF, v, off)
        return v

    @cuda.jit(device=True, inline=True)
    def warp_max(v):
        """Butterfly max over the 32 lanes; every lane gets it. Whole warps only."""
        for off in (16, 8, 4, 2, 1):
            v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, off))
        return v

    @cuda.jit(device=True, inline=True)
    def warp_max_u32(v):
        """The largest uint32 v over the 32 lanes (one redux.sync); every lane gets it. Whole warps only."""
        return ptx.redux_max_u32(v)

    @cuda.jit(device=True, inline=True)
    def warp_min_u32(v):
        """The smallest uint32 v over the 32 lanes (one redux.sync); every lane gets it. Whole warps only."""
        return ptx.redux_min_u32(v)

    @cuda.jit(device=True, inline=True)
    def warp_sync():
        """bar.warp.sync: the warp's shared-memory writes are seen by all its lanes. Whole warps only."""
        cuda.syncwarp()

    @cuda.jit(device=True, inline=True)
    def warp_any(pred):
        """Whether pred holds on any of the 32 lanes (a warp vote); every lane gets it. Whole warps only."""
        return cuda.any_sync(0xFFFFFFFF, pred)

    @cuda.jit(device=True, inline=True)
    def quad_sum(v):
        """Sum over the 4 lanes of a quad (lanes 4i..4i+3, an mma fragment row). Whole warps only."""
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 1)
        return v + cuda.shfl_xor_sync(0xFFFFFFFF, v, 2)

    @cuda.jit(device=True, inline=True)
    def quad_max(v):
        """Max over the 4 lanes of a quad; every lane gets it. Whole warps only."""
        v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 1))
        return max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 2))


@cuda.jit(device=True, inline=True)
def _halve(v, lane, off, half):
    """One round of warp_sums_lanes: v[0 .. 2 half) to v[0 .. half), the pair (lane, lane ^ off)
    summing the upper half in the lane with bit off set, the lower half in the other."""
    up = (lane & off) != 0
    for i in range(half):
        keep, send = (v[i + half], v[i]) if up else (v[i], v[i + half])
        v[i] = keep + shfl_xor(send, off)


@cuda.jit(device=True, inline=True)
def warp_sums_lanes(v, n):
    """The warp's sums of n values at once (n a power of two up to 32, a constant): v, a local
    float32[n] of each lane (overwritten), -> in lane i the sum over the warp of v[i >> (5 -
    log2 n)] (n = 32: of v[i]). A transposing butterfly: log2 n rounds each halving the values a
    lane holds, then warp_sum's rounds on the one left; n - 1 + 5 - log2 n shuffles in five rounds,
    where a warp_sum each is 5 n in n chains of five. The same additions in the same order as
    warp_sum's butterfly (pairs by lane bit 16, then 8, ...; a float add commutes), so each sum is
    warp_sum's bit for bit."""
    return group_sums_lanes(v, n, WARP)


@cuda.jit(device=True, inline=True)
def group_sums_lanes(v, n, span):
    """warp_sums_lanes within each group of span lanes (8, 16 or 32, a constant; lanes span j ..
    span j + span - 1): n values a lane (a power of two up to span, a constant), v overwritten ->
    in the group's lane i the group's sum of v[i >> (log2 span - log2 n)]: halving rounds on the
    offsets span / 2, span / 4, ... while a lane holds more than one value, then sums on the
    offsets left; n - 1 + log2 span - log2 n shuffles."""
    lane = int32(cuda.threadIdx.x & 31)
    if n >= 2:
        _halve(v, lane, span // 2, n // 2)
    if n >= 4:
        _halve(v, lane, span // 4, n // 4)
    if n >= 8:
        _halve(v, lane, span // 8, n // 8)
    if n >= 16:
        _halve(v, lane, span // 16, n // 16)
    if n >= 32:
        _halve(v, lane, span // 32, 1)
    s = v[0]
    if n < 2:
        s += shfl_xor(s, span // 2)
    if n < 4 and span >= 4:
        s += shfl_xor(s, span // 4)
    if n < 8 and span >= 8:
        s += shfl_xor(s, span // 8)
    if n < 16 and span >= 16:
        s += shfl_xor(s, span // 16)
    if n < 32 and span >= 32:
        s += shfl_xor(s, span // 32)
    return s


@cuda.jit(device=True, inline=True)
def scan_rounds(buf, t, n):
    """Hillis-Steele inclusive prefix sums of buf[0, :n] (shared, (2, >= the block's threads), the
    values written and a barrier passed): every thread calls it, thread t owning element t; the
    row holding the sums is returned, after a barrier."""
    src = 0
    d = 1
    while d < n:
        v = buf[src, t]
        if t >= d:
            v += buf[src, t - d]
        buf[1 - src, t] = v
        src = 1 - src
        d *= 2
        cuda.syncthreads()
    return src


@cuda.jit(device=True, inline=True)
def block_sum(v, red):
    """Sum over the block (a multiple of 32 threads); every thread gets it. red: shared f32[32]."""
    tid = cuda.threadIdx.x
    v = warp_sum(v)
    if tid % WARP == 0:
        red[tid // WARP] = v
    cuda.syncthreads()
    lane = tid % WARP
    v = red[lane] if lane < cuda.blockDim.x // WARP else np.float32(0)
    v = warp_sum(v)
    cuda.syncthreads()  # red may be reused
    return v


@cuda.jit(device=True, inline=True)
def mma_lane():
    """(thread index, lane, warp, g = lane >> 2, c = lane & 3): a thread's place in a 1-D block and
    in an mma.sync fragment (row group g, column pair c)."""
    tid = cuda.threadIdx.x
    lane = tid & 31
    return tid, lane, tid >> 5, lane >> 2, lane & 3
