"""Plain-Python twins of ptx.py's intrinsics, for numba's CUDA simulator (one Python thread per CUDA thread).

Warp-collective instructions (mma, ldmatrix) meet in a per-warp `threading.Barrier`: every lane
deposits its operands, the last to arrive computes all 32 lanes' results from the PTX ISA fragment
layouts, and each lane takes its own (a second barrier guards the slots). All 32 lanes of a warp
must call them together, as on the GPU. Shared memory is addressed by the host address of the
simulator's shared arrays (`smem_addr` registers each array). cp.async copies are queued per thread
and land at the latest moment PTX allows -- the wait_group that retires their group -- so a kernel
that reads a stage it has not waited for reads stale data here as well. mma sums in float64 and
rounds once to float32 (the tensor cores round the running fp32 sum toward zero per step).
"""

import threading

import numpy as np

_lock = threading.Lock()
_regions = {}  # host address of a shared array -> (nbytes, its bytes); arrays are kept alive


def _host(a):
    """The numpy array behind a simulator array (or a numpy array itself)."""
    if isinstance(a, np.ndarray):
        return a
    item = a.__dict__.get("_item")
    return item._ary if item is not None else a._ary


def global_bytes(a, i, n):
    """n bytes from element i (flat, C order) of array a, as a writable uint8 view."""
    h = _host(a)
    off = int(i) * h.itemsize
    return h.reshape(-1).view(np.uint8)[off:off + n]


def smem_addr(a, i):
    h = _host(a)
    base = h.ctypes.data
    with _lock:
        if base not in _regions:
            _regions[base] = (h.nbytes, h.reshape(-1).view(np.uint8))
    return base + int(i) * h.itemsize


cvta_to_shared = smem_addr


def _shared_bytes(addr, n):
    addr = int(addr)
    with _lock:
        regions = list(_regions.items())
    for base, (size, buf) in regions:
        if base <= addr and addr + n <= base + size:
            return buf[addr - base:addr - base + n]
    raise IndexError(f"shared address {addr:#x} (+{n} bytes) is in no shared array")


def _u32(v):
    return np.uint32(int(v) & 0xFFFFFFFF)


# -- 16-byte moves --

def ld_global_cg_f32(a, i):
    return np.float32(global_bytes(a, i, 4).view(np.float32)[0])


def ld_global_cg_v4_f32(a, i):
    return tuple(np.float32(v) for v in global_bytes(a, i, 16).view(np.float32))


def ld_global_v4_u32(a, i):
    return tuple(np.uint32(w) for w in global_bytes(a, i, 16).view(np.uint32))


def st_global_v4_u32(a, i, v0, v1, v2, v3):
    global_bytes(a, i, 16).view(np.uint32)[:] = [_u32(v) for v in (v0, v1, v2, v3)]


def st_global_v2_f32(a, i, v0, v1):
    global_bytes(a, i, 8).view(np.float32)[:] = [np.float32(v0), np.float32(v1)]


def ld_shared_v4_u32(saddr):
    return tuple(np.uint32(w) for w in _shared_bytes(saddr, 16).view(np.uint32))


def ld_shared_u32(saddr):
    return np.uint32(_shared_bytes(saddr, 4).view(np.uint32)[0])


def ld_shared_v2_u32(saddr):
    return tuple(np.uint32(w) for w in _shared_bytes(saddr, 8).view(np.uint32))


def ld_shared_v4_f32(saddr):
    return tuple(np.float32(v) for v in _shared_bytes(saddr, 16).view(np.float32))


def st_shared_v4_u32(saddr, v0, v1, v2, v3):
    _shared_bytes(saddr, 16).view(np.uint32)[:] = [_u32(v) for v in (v0, v1, v2, v3)]


# -- cp.async: per-thread queues, completed at wait_group --

def _cp_thread():
    t = threading.current_thread()
    if not hasattr(t, "_cp_groups"):
        t._cp_open, t._cp_groups = [], []
    return t


def cp_async_16_zfill(saddr, a, i, src_bytes):
    n = int(src_bytes)
    data = np.zeros(16, np.uint8)
    if n:
        data[:n] = global_bytes(a, i, n)
    _cp_thread()._cp_open.append((int(saddr), data))


def cp_async_16(saddr, a, i):
    cp_async_16_zfill(saddr, a, i, 16)


def cp_async_commit():
    t = _cp_thread()
    t._cp_groups.append(t._cp_open)
    t._cp_open = []


def cp_async_wait_group(n):
    t = _cp_thread()
    while len(t._cp_groups) > int(n):
        for saddr, data in t._cp_groups.pop(0):
            _shared_bytes(saddr, 16)[:] = data


def prefetch_l2(a, byte0, nbytes):
    """A hint the simulator has no cache for: only its operands checked, as the hardware takes
    them (16-byte multiples, a range within a's bytes: a prefetch past them would fault)."""
    byte0, nbytes = int(byte0), int(nbytes)
    h = _host(a)
    assert byte0 % 16 == 0 and nbytes % 16 == 0 and nbytes > 0, (byte0, nbytes)
    assert 0 <= byte0 and byte0 + nbytes <= h.nbytes, (byte0, nbytes, h.nbytes)
    if prefetched is not None:
        with _lock:
            prefetched.append((h.__array_interface__["data"][0], byte0, nbytes))


prefetched = None  # a list, where a test sets one: (a's host address, byte0, nbytes) of each prefetch_l2


def grid_dep_wait():
    """griddepcontrol.wait: the simulator runs kernels one after another."""


def grid_dep_launch():
    """griddepcontrol.launch_dependents: nothing to overlap in the simulator."""


def cluster_sync():
    raise NotImplementedError("thread-block clusters: the simulator runs one block at a time")


def ld_cluster_f32(saddr, rank):
    raise NotImplementedError("thread-block clusters: the simulator runs one block at a time")


def cp_async_wait_all():
    cp_async_commit()
    cp_async_wait_group(0)


# -- special functions --

def ex2_approx_ftz(x):
    """2^x in float32, subnormal results flushed to zero."""
    with np.errstate(over="ignore", under="ignore"):
        r = np.exp2(np.float32(x))
    return np.float32(0) if abs(r) < np.finfo(np.float32).tiny else r


# -- packing --

def _f16_bits(v):
    with np.errstate(over="ignore"):
        return int(np.float32(v).astype(np.float16).view(np.uint16))


def _bf16_bits(v):
    u = int(np.float32(v).view(np.uint32))
    if np.isnan(np.float32(v)):
        return (u >> 16) | 0x40
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def pack_f16x2(lo, hi):
    return np.uint32(_f16_bits(lo) | (_f16_bits(hi) << 16))


def pack_bf16x2(lo, hi):
    return np.uint32(_bf16_bits(lo) | (_bf16_bits(hi) << 16))


# -- warp collectives --

class _Warp:
    def __init__(self):
        self.slots = [None] * 32
        self.out = [None] * 32
        self.fn = None
        self.gather = threading.Barrier(32, action=self._compute, timeout=300)
        self.release = threading.Barrier(32, timeout=300)

    def _compute(self):
        self.out = self.fn(self.slots)


def _collective(fn, operand):
    t = threading.current_thread()
    with _lock:
        warps = t._manager.__dict__.setdefault("_ptx_warps", {})
        warp = warps.setdefault(t.thread_id // 32, _Warp())
    lane = t.thread_id % 32
    warp.slots[lane] = operand
    warp.fn = fn
    warp.gather.wait()
    res = warp.out[lane]
    warp.release.wait()
    return res


def _lanes(lane):
    return lane >> 2, lane & 3


def _half(reg, h, dtype):
    bits = (int(reg) >> (16 * h)) & 0xFFFF
    if dtype == "f16":
        return float(np.uint16(bits).view(np.float16))
    return float(np.uint32(bits << 16).view(np.float32))


def _mma_all(dtype):
    def compute(slots):
        A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
        for lane, (a, b, c) in enumerate(slots):
            g, t = _lanes(lane)
            for i in range(8):  # a_i: rows g / g+8, cols 2t + (i & 1) (+8 for i >= 4)
                A[g + (8 if i in (2, 3, 6, 7) else 0), 2 * t + (i & 1) + (8 if i >= 4 else 0)] = \
                    _half(a[i // 2], i % 2, dtype)
            for i in range(4):  # b_i: k = 2t + (i & 1) (+8 for i >= 2), n = g
                B[2 * t + (i & 1) + (8 if i >= 2 else 0), g] = _half(b[i // 2], i % 2, dtype)
            for i in range(4):  # c_i: rows g / g+8, cols 2t + (i & 1)
                C[g + (8 if i >= 2 else 0), 2 * t + (i & 1)] = float(c[i])
        D = (A @ B + C).astype(np.float32)
        return [tuple(D[(lane >> 2) + (8 if i >= 2 else 0), 2 * (lane & 3) + (i & 1)] for i in range(4))
                for lane in range(32)]
    return compute


_MMA = {"f16": _mma_all("f16"), "bf16": _mma_all("bf16")}


def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _collective(_MMA["f16"], ((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3)))


def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _collective(_MMA["bf16"], ((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3)))


def _s8(reg):
    return [b - 256 if b > 127 else b for b in ((int(reg) >> (8 * i)) & 0xFF for i in range(4))]


def _mma_s8_all(k):
    def compute(slots):
        A, B, C = np.zeros((16, k), np.int64), np.zeros((k, 8), np.int64), np.zeros((16, 8), np.int64)
        for lane, (a, b, c) in enumerate(slots):
            g, t = _lanes(lane)
            for r, reg in enumerate(a):  # a_r: row g (+8 for odd r), cols 4t.. (+16 for r >= 2)
                A[g + 8 * (r & 1), 4 * t + 16 * (r >> 1):4 * t + 16 * (r >> 1) + 4] = _s8(reg)
            for r, reg in enumerate(b):  # b_r: k = 4t.. (+16 for r = 1), n = g
                B[4 * t + 16 * r:4 * t + 16 * r + 4, g] = _s8(reg)
            for i in range(4):  # c_i: rows g / g+8, cols 2t + (i & 1)
                C[g + (8 if i >= 2 else 0), 2 * t + (i & 1)] = int(c[i])
        D = A @ B + C
        assert np.abs(D).max() < 2 ** 31, "int32 overflow"
        return [tuple(np.int32(D[(lane >> 2) + (8 if i >= 2 else 0), 2 * (lane & 3) + (i & 1)]) for i in range(4))
                for lane in range(32)]
    return compute


_MMA_S8 = {32: _mma_s8_all(32), 16: _mma_s8_all(16)}


def mma_s8_k32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _collective(_MMA_S8[32], ((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3)))


def mma_s8_k16(a0, a1, b0, c0, c1, c2, c3):
    return _collective(_MMA_S8[16], ((a0, a1), (b0,), (c0, c1, c2, c3)))


def _ldmatrix_all(n, trans):
    def compute(addrs):
        mats = [np.stack([_shared_bytes(addrs[8 * i + r], 16).view(np.uint16) for r in range(8)])
                for i in range(n)]
        out = []
        for lane in range(32):
            r, c = lane >> 2, 2 * (lane & 3)
            regs = []
            for m in mats:
                lo, hi = (m[c, r], m[c + 1, r]) if trans else (m[r, c], m[r, c + 1])
                regs.append(np.uint32(int(lo) | (int(hi) << 16)))
            out.append(regs[0] if n == 1 else tuple(regs))
        return out
    return compute


def _ldmatrix(n, trans):
    compute = _ldmatrix_all(n, trans)

    def ldmatrix(addr):
        return _collective(compute, addr)
    return ldmatrix


ldmatrix_x1 = _ldmatrix(1, False)
ldmatrix_x2 = _ldmatrix(2, False)
ldmatrix_x4 = _ldmatrix(4, False)
ldmatrix_x1_trans = _ldmatrix(1, True)
ldmatrix_x2_trans = _ldmatrix(2, True)
ldmatrix_x4_trans = _ldmatrix(4, True)
