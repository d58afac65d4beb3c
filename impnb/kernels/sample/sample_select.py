"""Block-wide building blocks of the sampling kernels (NT threads per block): orderable float keys,
prefix scans, histogram bin picks, a 3-level radix select, a bitonic sort, and the launchers'
shape checks. Keys: a float32's int32 bits map to an int64 in [0, 2^32) ordered like the float
(-0.0 as +0.0); the radix digits are key bits 31-21, 20-10, 9-0.
"""

import numpy as np
from numba import cuda, float64, int64
from numba.cuda.core import config as cuda_config

from impnb.kernels.common.warp import scan_rounds
from impnb.kernels.sample.philox import MASK32

SIMULATOR = bool(cuda_config.ENABLE_CUDASIM)
NT = 16 if SIMULATOR else 256            # threads per block of the sampling kernels
KMAX = 256                               # largest top-k, and candidates kept per chunk
NBINS = 2048                             # radix bins of the widest (11-bit) digit
NBINS_LAST = 1024                        # radix bins of the last (10-bit) digit


@cuda.jit(device=True, inline="always")
def sort_key(bits):
    """Orderable key in [0, 2^32) of a float32 from its int32 bits; -0.0 keys as +0.0."""
    b = np.int64(bits)
    if b == -2147483648:
        b = 0
    return b + 2147483648 if b >= 0 else -1 - b


@cuda.jit(device=True, inline="always")
def radix_digit(lvl):
    """(shift, bits) of radix level 0, 1, 2: key bits 31-21, 20-10, 9-0."""
    return (21 - 11 * lvl, 11) if lvl < 2 else (0, 10)


@cuda.jit(device=True, inline="always")
def row_k(T, top_k):
    """Candidates a row needs: 1 when greedy, top_k clamped to KMAX, KMAX when top-k is off."""
    if T <= 0:
        return 1
    return KMAX if top_k <= 0 or top_k > KMAX else top_k


@cuda.jit(device=True, inline="always")
def comp_id(comp):
    """Token id of a composite key << 31 | (2^31 - 1 - id): larger composite, earlier in order."""
    return np.int32(0x7FFFFFFF - (comp & 0x7FFFFFFF))


@cuda.jit(device=True, inline="always")
def block_scan(x, buf):
    """Block prefix sums of one float64 per thread in thread order: (exclusive, inclusive, total).
    buf: shared float64 (2, NT), Hillis-Steele double buffer."""
    t = cuda.threadIdx.x
    buf[0, t] = x
    cuda.syncthreads()
    src = scan_rounds(buf, t, NT)
    incl = buf[src, t]
    excl = buf[src, t - 1] if t > 0 else 0.0
    total = buf[src, NT - 1]
    cuda.syncthreads()
    return excl, incl, total


@cuda.jit(device=True, inline="always")
def pick_bin(hist_w, hist_c, nb, target, strict, buf, state):
    """Scanning bins from the top, the first non-empty one where the running weight reaches
    target (passes it if strict), else the last bin with weight: (bin, weight of the bins
    above, its count); (-1, 0, 0) when every bin is empty. Thread t owns nb / NT bins from the
    top; weights are counts when hist_w is hist_c. state: float64 (4,) scratch."""
    t = cuda.threadIdx.x
    per = nb // NT
    top = nb - 1 - t * per
    w = 0.0
    for q in range(per):
        w += float64(hist_w[top - q])
    acc, _, _ = block_scan(w, buf)
    found = -1
    found_acc = 0.0
    last = -1
    last_acc = 0.0
    for q in range(per):
        i = top - q
        wq = float64(hist_w[i])
        if hist_c[i] > 0:
            if found < 0 and ((acc + wq > target) if strict else (acc + wq >= target)):
                found = i
                found_acc = acc
            if wq > 0:
                last = i
                last_acc = acc
        acc += wq
    if t == 0:
        state[0] = -1.0
        state[1] = float64(nb)
    cuda.syncthreads()
    if found >= 0:
        cuda.atomic.max(state, 0, float64(found))
    if last >= 0:
        cuda.atomic.min(state, 1, float64(last))
    cuda.syncthreads()
    d = int64(state[0])
    if d < 0:  # rounding put target past the total
        d = int64(state[1])
        if d == nb:
            d = -1
    cuda.syncthreads()
    if d >= 0 and top - per < d <= top:
        state[2] = found_acc if d == found else last_acc
        state[3] = float64(hist_c[d])
    elif d < 0 and t == 0:
        state[2] = 0.0
        state[3] = 0.0
    cuda.syncthreads()
    above = state[2]
    cnt = int64(state[3])
    cuda.syncthreads()
    return d, above, cnt


@cuda.jit(device=True, inline="always")
def thread_run(L):
    """The calling thread's contiguous run [lo, hi) of L entries."""
    per = (L + NT - 1) // NT
    lo = cuda.threadIdx.x * per
    return lo, min(L, lo + per)


@cuda.jit(device=True, inline="always")
def entry_key(src, j, width, lim, span):
    """Key of entry j, src[j // width, j % width]; -1 past its row's valid length lim - row*span."""
    row = j // width
    col = j - row * width
    if col < lim - row * span:
        return sort_key(src[row, col])
    return np.int64(-1)


@cuda.jit(device=True, inline="always")
def select_top(src, width, lim, span, L, n, kk, hist, buf, state):
    """The kk largest keys of the n valid entries among L (see entry_key; thread t owns a contiguous
    run, so thread order is entry order): (tau, r, pos, ties) - keys above tau and the first r
    keyed tau win; pos is where the thread's winners start in entry order, ties how many entries
    keyed tau precede its run. A 3-level radix select on int32 hist[NBINS]; none when kk == n."""
    lo, hi = thread_run(L)
    tau = np.int64(-1)
    r = np.int64(0)
    cuda.syncthreads()  # src may be shared memory just written
    if kk < n:
        tau = 0
        r = kk
        for lvl in range(3):
            shift, nbits = radix_digit(lvl)
            nb = 1 << nbits
            for q in range(cuda.threadIdx.x, nb, NT):
                hist[q] = 0
            cuda.syncthreads()
            for j in range(lo, hi):
                key = entry_key(src, j, width, lim, span)
                if key >= 0 and key >> (shift + nbits) == tau >> (shift + nbits):
                    cuda.atomic.add(hist, (key >> shift) & (nb - 1), 1)
            cuda.syncthreads()
            d, above, _ = pick_bin(hist, hist, nb, float64(r), False, buf, state)
            tau |= d << shift
            r -= np.int64(above)
    gt = 0
    eq = 0
    for j in range(lo, hi):
        key = entry_key(src, j, width, lim, span)
        if key > tau:
            gt += 1
        elif key == tau and key >= 0:
            eq += 1
    gt_before = np.int64(block_scan(float64(gt), buf)[0])
    eq_before = np.int64(block_scan(float64(eq), buf)[0])
    return tau, r, gt_before + min(eq_before, r), eq_before


@cuda.jit(device=True, inline="always")
def bitonic_desc(comp, n):
    """Sort comp[:m] descending in place, m the power of two >= n (pads hold -1)."""
    t = cuda.threadIdx.x
    m = 1
    while m < n:
        m *= 2
    size = 2
    while size <= m:
        stride = size // 2
        while stride > 0:
            for i in range(t, m, NT):
                j = i ^ stride
                if j > i:
                    a = comp[i]
                    c = comp[j]
                    if (a < c) == ((i & size) == 0):
                        comp[i] = c
                        comp[j] = a
            cuda.syncthreads()
            stride //= 2
        size *= 2


@cuda.jit(device=True, inline="always")
def row_step(step, b):
    return np.int64(step[min(b, step.shape[0] - 1)]) & MASK32


def check_logits(logits):
    assert logits.ndim == 2 and logits.dtype == np.float32 and logits.is_c_contiguous(), \
        "logits: (B, V) contiguous float32"
    assert logits.shape[1] < 2**31


def check_rows(name, a, dtype, shape):
    assert a.dtype == dtype and a.shape == shape and a.is_c_contiguous(), f"{name}: {shape} {dtype}"
