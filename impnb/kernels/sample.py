"""Sampling on the GPU so a decode step copies only the token ids back: repetition penalty,
and seeded top-k / top-p / min-p / temperature sampling with llama.cpp's order
and impnb.sampling.filter_probs' numbers (float64 probabilities, ties to the lowest id).

  params = cuda.to_device(sample_params([SamplingParams, ...]))   # (B, 8) float64, once
  scratch = sample_scratch(B, V)                                  # once per (B, V)
  repeat_penalty(logits, history, params, stream)   # optional, in place; history (B, H) int32 ring
  sample(logits, params, step, out_ids, scratch, stream)  # greedy rows: argmax.py is faster
  push_history(out_ids, step, history, stream)      # optional: history[b, step % H] = out_ids[b]

params row: temperature (0 = greedy), top_k (0 = off, <= KMAX), top_p, min_p, repeat_penalty,
seed bits 0-31, seed bits 32-63, unused. step: int32 (1,) or (B,) on the device, read by the
kernels. The draw is one uniform from Philox4x32-10, key = seed, counter = (step, row, 0, 0).
Keys: a float32's int32 bits map to an int64 in [0, 2^32) ordered like the float (-0.0 as +0.0);
top-k is a 3-level radix select on them (11, 11, 10 bits). sample_ref is the numpy twin.
"""

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, float64, int32, int64, void
from numba.cuda.core import config as cuda_config

from impnb.errors import ParameterError
from impnb.launch import launch
from impnb.sampling import SamplingParams, apply_repeat_penalty, filter_probs

SIMULATOR = bool(cuda_config.ENABLE_CUDASIM)
NT = 16 if SIMULATOR else 256            # threads per block of the sampling kernels
CHUNK = 512 if SIMULATOR else 4096       # logits per candidate block (the simulator's is small)
EPT = CHUNK // NT                        # logits per thread, contiguous (16 on the GPU)
KMAX = 256                               # largest top-k, and candidates kept per chunk
EPK = KMAX // NT                         # sorted candidates per thread, contiguous
NBINS = 2048                             # radix bins of the widest (11-bit) digit
NBINS_LAST = 1024                        # radix bins of the last (10-bit) digit
EPT_PAD = EPT + 1                        # shared row stride of the chunk kernel
NPARAM = 8
MASK32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85


# ---------------------------------------------------------------- Philox4x32 and its numpy twin

@cuda.jit(device=True, inline="always")
def _mulhilo(a, m):
    p = np.uint64(a) * np.uint64(m)
    return np.int64(p >> np.uint64(32)), np.int64(p & np.uint64(MASK32))


@cuda.jit(device=True, inline="always")
def _philox4x32(c0, c1, c2, c3, k0, k1, rounds):
    """Random123's philox4x32_R on 32-bit words held in int64s (values in [0, 2^32))."""
    for r in range(rounds):
        if r > 0:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


@cuda.jit(device=True, inline="always")
def _uniform(seed_lo, seed_hi, seq, step):
    """A float64 in [0, 1) from 53 bits of Philox4x32-10 at counter (step, seq, 0, 0)."""
    x0, x1, _, _ = _philox4x32(step, seq, 0, 0, seed_lo, seed_hi, 10)
    return ((x0 >> 5) * 67108864 + (x1 >> 6)) * (1.0 / 9007199254740992.0)


def philox4x32_ref(counter, key, rounds: int = 10) -> np.ndarray:
    """Philox4x32-R: counter (..., 4) and key (..., 2) uint32 words -> (..., 4) uint32."""
    c = [np.asarray(counter, np.uint64)[..., i] for i in range(4)]
    k0, k1 = (np.asarray(key, np.uint64)[..., i] for i in range(2))
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
        p0, p1 = c[0] * np.uint64(PHILOX_M0), c[2] * np.uint64(PHILOX_M1)
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & MASK32, (p0 >> 32) ^ c[3] ^ k1, p0 & MASK32]
    return np.stack(c, -1).astype(np.uint32)


def uniform_ref(seed: int, seq: int, step: int) -> float:
    """The kernel's uniform for sequence `seq` at `step`."""
    x = philox4x32_ref([step & MASK32, seq, 0, 0], [seed & MASK32, (seed >> 32) & MASK32])
    return ((int(x[0]) >> 5) * 2**26 + (int(x[1]) >> 6)) / 2**53


def sample_ref(logits: np.ndarray, history, p: SamplingParams, seq: int, step: int) -> int:
    """The kernels' pick on the host: penalty over the ring (-1 = empty), filter_probs, then the
    inverse CDF (candidates in filter_probs' order) at the kernel's uniform."""
    seen = [int(h) for h in history if 0 <= h < len(logits)]
    x = apply_repeat_penalty(logits, seen, p.repeat_penalty)
    if p.greedy:
        return int(np.argmax(x))
    ids, probs = filter_probs(x, p)
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf / cdf[-1], uniform_ref(p.seed, seq, step), side="right"))
    return int(ids[min(i, len(ids) - 1)])


def sample_params(params: list[SamplingParams]) -> np.ndarray:
    """(B, NPARAM) float64 rows for the kernels (upload once; all values are exact in float64)."""
    rows = np.zeros((len(params), NPARAM), np.float64)
    for row, p in zip(rows, params):
        p.validate()
        if p.top_k > KMAX:
            raise ParameterError(f"the GPU sampler keeps at most top-k {KMAX} (0 = off), "
                                 f"got {p.top_k}")
        row[:7] = (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty,
                   p.seed & MASK32, (p.seed >> 32) & MASK32)
    return rows


# ---------------------------------------------------------------- block helpers (NT threads)

@cuda.jit(device=True, inline="always")
def _key(bits):
    """Orderable key in [0, 2^32) of a float32 from its int32 bits; -0.0 keys as +0.0."""
    b = np.int64(bits)
    if b == -2147483648:
        b = 0
    return b + 2147483648 if b >= 0 else -1 - b


@cuda.jit(device=True, inline="always")
def _digit(lvl):
    """(shift, bits) of radix level 0, 1, 2: key bits 31-21, 20-10, 9-0."""
    return (21 - 11 * lvl, 11) if lvl < 2 else (0, 10)


@cuda.jit(device=True, inline="always")
def _row_k(T, top_k):
    """Candidates a row needs: 1 when greedy, top_k clamped to KMAX, KMAX when top-k is off."""
    if T <= 0:
        return 1
    return KMAX if top_k <= 0 or top_k > KMAX else top_k


@cuda.jit(device=True, inline="always")
def _comp_id(comp):
    """Token id of a composite key << 31 | (2^31 - 1 - id): larger composite, earlier in order."""
    return np.int32(0x7FFFFFFF - (comp & 0x7FFFFFFF))


@cuda.jit(device=True, inline="always")
def _scan(x, buf):
    """Block prefix sums of one float64 per thread in thread order: (exclusive, inclusive, total).
    buf: shared float64 (2, NT), Hillis-Steele double buffer."""
    t = cuda.threadIdx.x
    buf[0, t] = x
    cuda.syncthreads()
    src = 0
    d = 1
    while d < NT:
        v = buf[src, t]
        if t >= d:
            v += buf[src, t - d]
        buf[1 - src, t] = v
        src = 1 - src
        d *= 2
        cuda.syncthreads()
    incl = buf[src, t]
    excl = buf[src, t - 1] if t > 0 else 0.0
    total = buf[src, NT - 1]
    cuda.syncthreads()
    return excl, incl, total


@cuda.jit(device=True, inline="always")
def _pick_bin(hist_w, hist_c, nb, target, strict, buf, state):
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
    acc, _, _ = _scan(w, buf)
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
def _run(L):
    """The calling thread's contiguous run [lo, hi) of L entries."""
    per = (L + NT - 1) // NT
    lo = cuda.threadIdx.x * per
    return lo, min(L, lo + per)


@cuda.jit(device=True, inline="always")
def _entry(src, j, width, lim, span):
    """Key of entry j, src[j // width, j % width]; -1 past its row's valid length lim - row*span."""
    row = j // width
    col = j - row * width
    if col < lim - row * span:
        return _key(src[row, col])
    return np.int64(-1)


@cuda.jit(device=True, inline="always")
def _select_top(src, width, lim, span, L, n, kk, hist, buf, state):
    """The kk largest keys of the n valid entries among L (see _entry; thread t owns a contiguous
    run, so thread order is entry order): (tau, r, pos, ties) - keys above tau and the first r
    keyed tau win; pos is where the thread's winners start in entry order, ties how many entries
    keyed tau precede its run. A 3-level radix select on int32 hist[NBINS]; none when kk == n."""
    lo, hi = _run(L)
    tau = np.int64(-1)
    r = np.int64(0)
    cuda.syncthreads()  # src may be shared memory just written
    if kk < n:
        tau = 0
        r = kk
        for lvl in range(3):
            shift, nbits = _digit(lvl)
            nb = 1 << nbits
            for q in range(cuda.threadIdx.x, nb, NT):
                hist[q] = 0
            cuda.syncthreads()
            for j in range(lo, hi):
                key = _entry(src, j, width, lim, span)
                if key >= 0 and key >> (shift + nbits) == tau >> (shift + nbits):
                    cuda.atomic.add(hist, (key >> shift) & (nb - 1), 1)
            cuda.syncthreads()
            d, above, _ = _pick_bin(hist, hist, nb, float64(r), False, buf, state)
            tau |= d << shift
            r -= np.int64(above)
    gt = 0
    eq = 0
    for j in range(lo, hi):
        key = _entry(src, j, width, lim, span)
        if key > tau:
            gt += 1
        elif key == tau and key >= 0:
            eq += 1
    gt_before = np.int64(_scan(float64(gt), buf)[0])
    eq_before = np.int64(_scan(float64(eq), buf)[0])
    return tau, r, gt_before + min(eq_before, r), eq_before


@cuda.jit(device=True, inline="always")
def _bitonic_desc(comp, n):
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
def _row_step(step, b):
    return np.int64(step[min(b, step.shape[0] - 1)]) & MASK32


# ---------------------------------------------------------------- penalty, history

@cuda.jit
def _penalty_kernel(logits, history, params):
    """grid (B,), block NT. Row b: each distinct id in [0, V) of the ring history[b] (-1 = empty)
    gets logit / penalty if positive, else logit * penalty, in float32 (apply_repeat_penalty)."""
    b = cuda.blockIdx.x
    pen = np.float32(params[b, 4])
    if pen == 1:
        return
    for j in range(cuda.threadIdx.x, history.shape[1], NT):
        tok = history[b, j]
        if 0 <= tok < logits.shape[1]:
            first = True
            for q in range(j):
                if history[b, q] == tok:
                    first = False
            if first:
                x = logits[b, tok]
                logits[b, tok] = x / pen if x > 0 else x * pen


@cuda.jit
def _push_kernel(ids, step, history):
    """grid ceil(B / 32), block 32: history[b, step % H] = ids[b]."""
    b = cuda.grid(1)
    if b < ids.shape[0]:
        history[b, _row_step(step, b) % history.shape[1]] = ids[b]


# ---------------------------------------------------------------- sampling, 1: chunk candidates

@cuda.jit
def _chunks_kernel(logits, bits, params, cand_bits, cand_idx, stats):
    """grid (C, B), block NT. Block (c, b) owns logits[b, c*CHUNK : (c+1)*CHUNK]; thread t the
    EPT contiguous ones from t*EPT. Writes the chunk's best k = min(_row_k, len) logits (bits and
    ids, in id order) to cand_*[b, c, :k]; for rows with top-k off, stats[b, c] = (max z, sum of
    exp(z - max z)), z = x / T. shared: bits int32 (NT, EPT+1) (padded: no bank conflicts),
    hist int32[NBINS], scan buffer float64 (2, NT) (also the softmax tree), state float64[4]."""
    c = cuda.blockIdx.x
    b = cuda.blockIdx.y
    t = cuda.threadIdx.x
    sbits = cuda.shared.array((NT, EPT_PAD), int32)
    hist = cuda.shared.array(NBINS, int32)
    buf = cuda.shared.array((2, NT), float64)
    state = cuda.shared.array(4, float64)
    base = c * CHUNK
    n = min(CHUNK, logits.shape[1] - base)
    T = params[b, 0]
    top_k = np.int64(params[b, 1])
    k = min(_row_k(T, top_k), n)
    softmax = T > 0 and top_k <= 0
    # -- load, coalesced; running softmax per thread --
    zm = -math.inf
    s = 0.0
    for i in range(EPT):
        j = i * NT + t
        if j < n:
            sbits[j // EPT, j % EPT] = bits[b, base + j]
            if softmax:
                z = float64(logits[b, base + j]) / T
                if z > zm:
                    s = s * math.exp(zm - z) + 1.0
                    zm = z
                elif zm > -math.inf:
                    s += math.exp(z - zm)
    if softmax:  # -- tree merge of (max z, sum) --
        buf[0, t] = zm
        buf[1, t] = s
        cuda.syncthreads()
        h = NT // 2
        while h > 0:
            if t < h:
                za = buf[0, t]
                zb = buf[0, t + h]
                zmax = max(za, zb)
                if zmax > -math.inf:
                    buf[1, t] = (buf[1, t] * math.exp(za - zmax)
                                 + buf[1, t + h] * math.exp(zb - zmax))
                buf[0, t] = zmax
            cuda.syncthreads()
            h //= 2
        if t == 0:
            stats[b, c, 0] = buf[0, 0]
            stats[b, c, 1] = buf[1, 0]
    # -- the k best in id order: keys above tau, then the first r ties --
    tau, r, pos, seen = _select_top(sbits, EPT, n, EPT, CHUNK, n, k, hist, buf, state)
    for j in range(t * EPT, t * EPT + EPT):
        key = _entry(sbits, j, EPT, n, EPT)
        keep = key > tau
        if key == tau and key >= 0:
            keep = seen < r
            seen += 1
        if keep:
            cand_bits[b, c, pos] = sbits[t, j - t * EPT]
            cand_idx[b, c, pos] = base + j
            pos += 1


# ---------------------------------------------------------------- sampling, 2: the pick

@cuda.jit(device=True, inline="always")
def _row_select(logits, bits, b, T, z0, S, tau_lo, min_p, target, strict, hist_m, hist_c, hist_v,
                buf, state):
    """Mass radix select over row b, keys >= tau_lo passing min-p, weights e = exp(z - z0):
    the key where the running mass from the top first reaches target (passes it if strict).
    Returns (key, mass of the keys above it, its count, its float value)."""
    prefix = np.int64(0)
    above = 0.0
    cnt = np.int64(0)
    d = np.int64(0)
    for lvl in range(3):
        shift, nbits = _digit(lvl)
        nb = 1 << nbits
        for q in range(cuda.threadIdx.x, nb, NT):
            hist_m[q] = 0.0
            hist_c[q] = 0
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, logits.shape[1], NT):
            key = _key(bits[b, i])
            if key >= tau_lo and key >> (shift + nbits) == prefix >> (shift + nbits):
                x = logits[b, i]
                e = math.exp(float64(x) / T - z0)
                if e / S >= min_p * (1.0 / S):
                    d = (key >> shift) & (nb - 1)
                    cuda.atomic.add(hist_c, d, 1)
                    if e > 0:
                        cuda.atomic.add(hist_m, d, e)
                    if lvl == 2:
                        hist_v[d] = x
        cuda.syncthreads()
        d, a, cnt = _pick_bin(hist_m, hist_c, nb, target - above, strict, buf, state)
        prefix |= d << shift
        above += a
    return prefix, above, cnt, hist_v[d]


@cuda.jit(device=True, inline="always")
def _nth_tie(bits, b, tau, j, cnt, buf, state):
    """Id of the j-th (0-based, in id order) of the cnt logits of row b whose key is tau."""
    t = cuda.threadIdx.x
    V = bits.shape[1]
    if cnt == 1:
        for i in range(t, V, NT):
            if _key(bits[b, i]) == tau:
                state[0] = i
    else:  # thread t owns a contiguous range; count its ties, scan, walk
        per = (V + NT - 1) // NT
        lo = t * per
        hi = min(V, lo + per)
        n = 0
        for i in range(lo, hi):
            if _key(bits[b, i]) == tau:
                n += 1
        seen = np.int64(_scan(float64(n), buf)[0])
        if seen <= j < seen + n:
            for i in range(lo, hi):
                if _key(bits[b, i]) == tau:
                    if seen == j:
                        state[0] = i
                    seen += 1
    cuda.syncthreads()
    return np.int32(state[0])


@cuda.jit(device=True, inline="always")
def _full_vocab_pick(logits, bits, b, T, z0, S, top_p, min_p, u, hist_m, hist_c, hist_v, buf,
                     state):
    """Top-k off and the best KMAX do not settle top-p / min-p: work on the whole row.
    Top-p keeps keys above tau_p and r_p of its ties; the draw is the mass select at u * kept."""
    tau_p = np.int64(-1)
    r_p = np.int64(0)
    above_p = 0.0
    e_p = 0.0
    if top_p < 1:
        target = top_p * S
        tau_p, above_p, cnt, x_p = _row_select(logits, bits, b, T, z0, S, -1, 0.0, target, False,
                                               hist_m, hist_c, hist_v, buf, state)
        e_p = math.exp(float64(x_p) / T - z0)
        r_p = min(max(np.int64(math.ceil((target - above_p) / e_p)), 1), cnt)
    # -- the kept mass --
    if tau_p >= 0 and e_p / S >= min_p * (1.0 / S):
        kept = above_p + r_p * e_p
    elif min_p <= 0:
        kept = S
    else:  # min-p is the tighter cut: sum what passes it
        w = 0.0
        for i in range(cuda.threadIdx.x, logits.shape[1], NT):
            if _key(bits[b, i]) > tau_p:
                e = math.exp(float64(logits[b, i]) / T - z0)
                if e / S >= min_p * (1.0 / S):
                    w += e
        kept = _scan(w, buf)[2]
    # -- the draw --
    target = u * kept
    tau, above, cnt, x = _row_select(logits, bits, b, T, z0, S, tau_p, min_p, target, True,
                                     hist_m, hist_c, hist_v, buf, state)
    e = math.exp(float64(x) / T - z0)
    j = min(max(np.int64(math.floor((target - above) / e)), 0), cnt - 1)
    if tau == tau_p:
        j = min(j, r_p - 1)
    return _nth_tie(bits, b, tau, j, cnt, buf, state)


@cuda.jit
def _pick_kernel(logits, bits, params, step, cand_bits, cand_idx, stats, out):
    """grid (B,), block NT. Row b: the best kk = min(_row_k, V) of the chunks' candidates
    (thread t owns a contiguous run of them) by radix select, a bitonic sort (value down, id up),
    filter_probs' float64 numbers over them (thread t owns sorted EPK from t*EPK), the draw;
    rows with top-k off that the best KMAX do not settle go to _full_vocab_pick.
    shared: hist_m float64[NBINS], hist_c int32[NBINS], hist_v float32[NBINS/2], scan buffer
    float64 (2, NT), comp int64[KMAX] (sorted composites), ex / cum float64[KMAX], state."""
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    hist_m = cuda.shared.array(NBINS, float64)
    hist_c = cuda.shared.array(NBINS, int32)
    hist_v = cuda.shared.array(NBINS_LAST, float32)
    buf = cuda.shared.array((2, NT), float64)
    state = cuda.shared.array(4, float64)
    comp = cuda.shared.array(KMAX, int64)
    ex = cuda.shared.array(KMAX, float64)
    cum = cuda.shared.array(KMAX, float64)
    V = logits.shape[1]
    C = cand_idx.shape[1]
    T = params[b, 0]
    top_k = np.int64(params[b, 1])
    top_p = params[b, 2]
    min_p = params[b, 3]
    k = _row_k(T, top_k)
    kk = min(k, V)
    # -- the kk best candidates (chunk c's at cand_*[b, c, :min(k, V - c*CHUNK)]), in id order --
    src = cand_bits[b]
    L = C * k
    n = (C - 1) * k + min(k, V - (C - 1) * CHUNK)
    tau, r, pos, seen = _select_top(src, k, V, CHUNK, L, n, kk, hist_c, buf, state)
    lo, hi = _run(L)
    for j in range(lo, hi):
        key = _entry(src, j, k, V, CHUNK)
        keep = key > tau
        if key == tau and key >= 0:
            keep = seen < r
            seen += 1
        if keep:
            comp[pos] = (key << 31) | (0x7FFFFFFF - np.int64(cand_idx[b, j // k, j % k]))
            pos += 1
    for i in range(kk + t, KMAX, NT):
        comp[i] = -1
    cuda.syncthreads()
    _bitonic_desc(comp, kk)
    if T <= 0:
        if t == 0:
            out[b] = _comp_id(comp[0])
        return
    # -- filter_probs over the sorted candidates: e = exp(z - z0), cumulative sums --
    z0 = float64(logits[b, _comp_id(comp[0])]) / T
    w = 0.0
    for i in range(t * EPK, t * EPK + EPK):
        e = 0.0
        if i < kk:
            e = math.exp(float64(logits[b, _comp_id(comp[i])]) / T - z0)
        ex[i] = e
        w += e
    acc = _scan(w, buf)[0]
    for i in range(t * EPK, t * EPK + EPK):
        acc += ex[i]
        cum[i] = acc
    full = top_k <= 0 and kk < V
    if full:  # the whole row's softmax sum, from the chunks' (max z, sum)
        w = 0.0
        for c in range(t, C, NT):
            w += stats[b, c, 1] * math.exp(stats[b, c, 0] - z0)
        S = _scan(w, buf)[2]
    else:
        cuda.syncthreads()
        S = cum[kk - 1]
    # -- top-p: the cumulative probabilities below top_p; min-p: probabilities >= min_p * first --
    n_below = 0
    n_minp = 0
    for i in range(t * EPK, min(kk, t * EPK + EPK)):
        if cum[i] / S < top_p:
            n_below += 1
        if ex[i] / S >= min_p * (1.0 / S):
            n_minp += 1
    n_below = np.int64(_scan(float64(n_below), buf)[2])
    n_minp = np.int64(_scan(float64(n_minp), buf)[2])
    n_keep = min(min(n_below + 1, kk) if top_p < 1 else kk, n_minp)
    u = _uniform(np.int64(params[b, 5]), np.int64(params[b, 6]), b, _row_step(step, b))
    if not full or (top_p < 1 and n_below < kk) or n_minp < kk:
        target = u * cum[n_keep - 1]
        n_le = 0
        for i in range(t * EPK, min(n_keep, t * EPK + EPK)):
            if cum[i] <= target:
                n_le += 1
        pick = min(np.int64(_scan(float64(n_le), buf)[2]), n_keep - 1)
        if t == 0:
            out[b] = _comp_id(comp[pick])
    else:
        tok = _full_vocab_pick(logits, bits, b, T, z0, S, top_p, min_p, u,
                               hist_m, hist_c, hist_v, buf, state)
        if t == 0:
            out[b] = tok


# ---------------------------------------------------------------- launchers

@dataclass(frozen=True)
class SampleScratch:
    """Device buffers of `sample`, allocated once by sample_scratch (C = ceil(V / CHUNK) chunks)."""
    cand_bits: object  # (B, C, KMAX) int32: each chunk's best logits (their bits), in id order
    cand_idx: object   # (B, C, KMAX) int32: their token ids
    stats: object      # (B, C, 2) float64: (max z, sum exp(z - max z)) per chunk, top-k off rows


def sample_scratch(B: int, V: int) -> SampleScratch:
    C = -(-V // CHUNK)
    return SampleScratch(cuda.device_array((B, C, KMAX), np.int32),
                         cuda.device_array((B, C, KMAX), np.int32),
                         cuda.device_array((B, C, 2), np.float64))


def _check_logits(logits):
    assert logits.ndim == 2 and logits.dtype == np.float32 and logits.is_c_contiguous(), \
        "logits: (B, V) contiguous float32"
    assert logits.shape[1] < 2**31


def _check_rows(name, a, dtype, shape):
    assert a.dtype == dtype and a.shape == shape and a.is_c_contiguous(), f"{name}: {shape} {dtype}"


def repeat_penalty(logits, history, params, stream):
    """In place: logits (B, V) float32 penalized by the ids in history (B, H) int32 (-1 = empty)
    with params[:, 4]; rows whose penalty is 1 are untouched."""
    _check_logits(logits)
    B = logits.shape[0]
    assert history.dtype == np.int32 and history.ndim == 2 and history.shape[0] == B
    assert history.is_c_contiguous()
    _check_rows("params", params, np.float64, (B, NPARAM))
    launch(_penalty_kernel, B, NT, stream, logits, history, params)


def push_history(ids, step, history, stream):
    """history[b, step % H] = ids[b]: ids (B,) int32, step int32 (1,) or (B,), history (B, H)."""
    B = ids.shape[0]
    _check_rows("ids", ids, np.int32, (B,))
    assert step.dtype == np.int32 and step.shape in ((1,), (B,))
    _check_rows("history", history, np.int32, (B, history.shape[1]))
    launch(_push_kernel, (B + 31) // 32, 32, stream, ids, step, history)


def sample(logits, params, step, out_ids, scratch: SampleScratch, stream):
    """out_ids (B,) int32: one token per row of logits (B, V) float32, by params (B, NPARAM)
    float64 (greedy where temperature is 0), the draw at counter step (int32 (1,) or (B,))."""
    _check_logits(logits)
    B, V = logits.shape
    C = -(-V // CHUNK)
    _check_rows("params", params, np.float64, (B, NPARAM))
    assert step.dtype == np.int32 and step.shape in ((1,), (B,))
    _check_rows("out_ids", out_ids, np.int32, (B,))
    assert scratch.cand_idx.shape[0] >= B and scratch.cand_idx.shape[1:] == (C, KMAX), \
        "scratch: sample_scratch(B, V)"
    bits = logits.view(np.int32)
    launch(_chunks_kernel, (C, B), NT, stream, logits, bits, params, scratch.cand_bits,
           scratch.cand_idx, scratch.stats)
    launch(_pick_kernel, B, NT, stream, logits, bits, params, step, scratch.cand_bits,
           scratch.cand_idx, scratch.stats, out_ids)


_f32_2d, _i32_2d, _f64_2d = float32[:, ::1], int32[:, ::1], float64[:, ::1]
_i32_3d, _f64_3d = int32[:, :, ::1], float64[:, :, ::1]

BUILD_SIGNATURES = [
    (_penalty_kernel, void(_f32_2d, _i32_2d, _f64_2d), {}),
    (_push_kernel, void(int32[::1], int32[::1], _i32_2d), {}),
    (_chunks_kernel, void(_f32_2d, _i32_2d, _f64_2d, _i32_3d, _i32_3d, _f64_3d),
     {"max_registers": 128}),
    (_pick_kernel, void(_f32_2d, _i32_2d, _f64_2d, int32[::1], _i32_3d, _i32_3d, _f64_3d,
                        int32[::1]), {"max_registers": 128}),
]
