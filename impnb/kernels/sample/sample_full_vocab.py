"""The sampler's whole-row path: when top-k is off and the best KMAX candidates do not settle
top-p / min-p, radix selects over the row's probability mass find the top-p cut and the draw.
Device functions of sample._pick_kernel (one block of NT threads per row).
"""

import math

import numpy as np
from numba import cuda, float64

from impnb.kernels.sample.sample_select import NT, radix_digit, sort_key, pick_bin, block_scan


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
        shift, nbits = radix_digit(lvl)
        nb = 1 << nbits
        for q in range(cuda.threadIdx.x, nb, NT):
            hist_m[q] = 0.0
            hist_c[q] = 0
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, logits.shape[1], NT):
            key = sort_key(bits[b, i])
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
        d, a, cnt = pick_bin(hist_m, hist_c, nb, target - above, strict, buf, state)
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
            if sort_key(bits[b, i]) == tau:
                state[0] = i
    else:  # thread t owns a contiguous range; count its ties, scan, walk
        per = (V + NT - 1) // NT
        lo = t * per
        hi = min(V, lo + per)
        n = 0
        for i in range(lo, hi):
            if sort_key(bits[b, i]) == tau:
                n += 1
        seen = np.int64(block_scan(float64(n), buf)[0])
        if seen <= j < seen + n:
            for i in range(lo, hi):
                if sort_key(bits[b, i]) == tau:
                    if seen == j:
                        state[0] = i
                    seen += 1
    cuda.syncthreads()
    return np.int32(state[0])


@cuda.jit(device=True, inline="always")
def full_vocab_pick(logits, bits, b, T, z0, S, top_p, min_p, u, hist_m, hist_c, hist_v, buf,
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
            if sort_key(bits[b, i]) > tau_p:
                e = math.exp(float64(logits[b, i]) / T - z0)
                if e / S >= min_p * (1.0 / S):
                    w += e
        kept = block_scan(w, buf)[2]
    # -- the draw --
    target = u * kept
    tau, above, cnt, x = _row_select(logits, bits, b, T, z0, S, tau_p, min_p, target, True,
                                     hist_m, hist_c, hist_v, buf, state)
    e = math.exp(float64(x) / T - z0)
    j = min(max(np.int64(math.floor((target - above) / e)), 0), cnt - 1)
    if tau == tau_p:
        j = min(j, r_p - 1)
    return _nth_tie(bits, b, tau, j, cnt, buf, state)
