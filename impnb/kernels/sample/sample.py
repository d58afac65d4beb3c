"""Sampling on the GPU so a decode step copies only the token ids back: seeded top-k / top-p /
min-p / temperature sampling with llama.cpp's order and impnb.sampling.filter_probs' numbers
(float64 probabilities, ties to the lowest id).

  params = cuda.to_device(sample_params([SamplingParams, ...]))   # (B, 8) float64, once
  scratch = sample_scratch(B, V)                                  # once per (B, V)
  sample_penalty.repeat_penalty(logits, history, params, stream)  # optional, in place
  sample(logits, params, step, out_ids, scratch, stream)  # greedy rows: argmax.py is faster
  sample_penalty.push_history(out_ids, step, history, stream)     # optional

params row: temperature (0 = greedy), top_k (0 = off, <= KMAX), top_p, min_p, repeat_penalty,
seed bits 0-31, seed bits 32-63, presence_penalty, frequency_penalty (those two as float32 values). step: int32 (1,) or (B,) on the device, read by the
kernels. The draw is one uniform from Philox4x32-10 (philox.py), key = seed, counter =
(step, 0, 0, 0): a row's draw depends on its own seed and step, not on its place in a batch. Top-k is a 3-level radix select on orderable keys (sample_select.py);
sample_full_vocab.py handles rows the best KMAX do not settle. sample_ref is the numpy twin.
"""

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, float64, int32, int64, void

from impnb.errors import ParameterError
from impnb.kernels.sample.philox import MASK32, philox_uniform, uniform_ref
from impnb.kernels.sample.sample_full_vocab import full_vocab_pick
from impnb.kernels.sample.sample_select import (KMAX, NBINS, NBINS_LAST, NT, SIMULATOR, bitonic_desc,
                                         check_logits, check_rows, comp_id, entry_key, row_k,
                                         row_step, thread_run, block_scan, select_top)
from impnb.launch import launch
from impnb.sampling import SamplingParams, apply_penalties, filter_probs

CHUNK = 512 if SIMULATOR else 4096       # logits per candidate block (the simulator's is small)
EPT = CHUNK // NT                        # logits per thread, contiguous (16 on the GPU)
EPK = KMAX // NT                         # sorted candidates per thread, contiguous
EPT_PAD = EPT + 1                        # shared row stride of the chunk kernel
NPARAM = 9


def sample_ref(logits: np.ndarray, history, p: SamplingParams, step: int) -> int:
    """The kernels' pick on the host: penalty over the ring (-1 = empty), filter_probs, then the
    inverse CDF (candidates in filter_probs' order) at the kernel's uniform."""
    seen = [int(h) for h in history if 0 <= h < len(logits)]
    x = apply_penalties(logits, seen, p)
    if p.greedy:
        return int(np.argmax(x))
    ids, probs = filter_probs(x, p)
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf / cdf[-1], uniform_ref(p.seed, 0, step), side="right"))
    return int(ids[min(i, len(ids) - 1)])


def sample_params(params: list[SamplingParams]) -> np.ndarray:
    """(B, NPARAM) float64 rows for the kernels (upload once; all values are exact in float64)."""
    rows = np.zeros((len(params), NPARAM), np.float64)
    for row, p in zip(rows, params):
        p.validate()
        if p.top_k > KMAX:
            raise ParameterError(f"the GPU sampler keeps at most top-k {KMAX} (0 = off), "
                                 f"got {p.top_k}")
        row[:] = (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty,
                  p.seed & MASK32, (p.seed >> 32) & MASK32, np.float32(p.presence_penalty),
                  np.float32(p.frequency_penalty))
    return rows


# ---------------------------------------------------------------- sampling, 1: chunk candidates

@cuda.jit
def _chunks_kernel(logits, bits, params, cand_bits, cand_idx, stats):
    """grid (C, B), block NT. Block (c, b) owns logits[b, c*CHUNK : (c+1)*CHUNK]; thread t the
    EPT contiguous ones from t*EPT. Writes the chunk's best k = min(row_k, len) logits (bits and
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
    k = min(row_k(T, top_k), n)
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
    tau, r, pos, seen = select_top(sbits, EPT, n, EPT, CHUNK, n, k, hist, buf, state)
    for j in range(t * EPT, t * EPT + EPT):
        key = entry_key(sbits, j, EPT, n, EPT)
        keep = key > tau
        if key == tau and key >= 0:
            keep = seen < r
            seen += 1
        if keep:
            cand_bits[b, c, pos] = sbits[t, j - t * EPT]
            cand_idx[b, c, pos] = base + j
            pos += 1


# ---------------------------------------------------------------- sampling, 2: the pick

@cuda.jit
def _pick_kernel(logits, bits, params, step, cand_bits, cand_idx, stats, out):
    """grid (B,), block NT. Row b: the best kk = min(row_k, V) of the chunks' candidates
    (thread t owns a contiguous run of them) by radix select, a bitonic sort (value down, id up),
    filter_probs' float64 numbers over them (thread t owns sorted EPK from t*EPK), the draw;
    rows with top-k off that the best KMAX do not settle go to full_vocab_pick.
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
    k = row_k(T, top_k)
    kk = min(k, V)
    # -- the kk best candidates (chunk c's at cand_*[b, c, :min(k, V - c*CHUNK)]), in id order --
    src = cand_bits[b]
    L = C * k
    n = (C - 1) * k + min(k, V - (C - 1) * CHUNK)
    tau, r, pos, seen = select_top(src, k, V, CHUNK, L, n, kk, hist_c, buf, state)
    lo, hi = thread_run(L)
    for j in range(lo, hi):
        key = entry_key(src, j, k, V, CHUNK)
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
    bitonic_desc(comp, kk)
    if T <= 0:
        if t == 0:
            out[b] = comp_id(comp[0])
        return
    # -- filter_probs over the sorted candidates: e = exp(z - z0), cumulative sums --
    z0 = float64(logits[b, comp_id(comp[0])]) / T
    w = 0.0
    for i in range(t * EPK, t * EPK + EPK):
        e = 0.0
        if i < kk:
            e = math.exp(float64(logits[b, comp_id(comp[i])]) / T - z0)
        ex[i] = e
        w += e
    acc = block_scan(w, buf)[0]
    for i in range(t * EPK, t * EPK + EPK):
        acc += ex[i]
        cum[i] = acc
    full = top_k <= 0 and kk < V
    if full:  # the whole row's softmax sum, from the chunks' (max z, sum)
        w = 0.0
        for c in range(t, C, NT):
            w += stats[b, c, 1] * math.exp(stats[b, c, 0] - z0)
        S = block_scan(w, buf)[2]
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
    n_below = np.int64(block_scan(float64(n_below), buf)[2])
    n_minp = np.int64(block_scan(float64(n_minp), buf)[2])
    n_keep = min(min(n_below + 1, kk) if top_p < 1 else kk, n_minp)
    u = philox_uniform(np.int64(params[b, 5]), np.int64(params[b, 6]), 0, row_step(step, b))
    if not full or (top_p < 1 and n_below < kk) or n_minp < kk:
        target = u * cum[n_keep - 1]
        n_le = 0
        for i in range(t * EPK, min(n_keep, t * EPK + EPK)):
            if cum[i] <= target:
                n_le += 1
        pick = min(np.int64(block_scan(float64(n_le), buf)[2]), n_keep - 1)
        if t == 0:
            out[b] = comp_id(comp[pick])
    else:
        tok = full_vocab_pick(logits, bits, b, T, z0, S, top_p, min_p, u,
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


def sample(logits, params, step, out_ids, scratch: SampleScratch, stream):
    """out_ids (B,) int32: one token per row of logits (B, V) float32, by params (B, NPARAM)
    float64 (greedy where temperature is 0), the draw at counter step (int32 (1,) or (B,))."""
    check_logits(logits)
    B, V = logits.shape
    C = -(-V // CHUNK)
    check_rows("params", params, np.float64, (B, NPARAM))
    assert step.dtype == np.int32 and step.shape in ((1,), (B,))
    check_rows("out_ids", out_ids, np.int32, (B,))
    assert scratch.cand_idx.shape[0] >= B and scratch.cand_idx.shape[1:] == (C, KMAX), \
        "scratch: sample_scratch(B, V)"
    bits = logits.view(np.int32)
    launch(_chunks_kernel, (C, B), NT, stream, logits, bits, params, scratch.cand_bits,
           scratch.cand_idx, scratch.stats)
    launch(_pick_kernel, B, NT, stream, logits, bits, params, step, scratch.cand_bits,
           scratch.cand_idx, scratch.stats, out_ids)


_f32_2d, _i32_2d, _f64_2d = float32[:, ::1], int32[:, ::1], float64[:, ::1]
_i32_3d, _f64_3d = int32[:, :, ::1], float64[:, :, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_chunks_kernel, void(_f32_2d, _i32_2d, _f64_2d, _i32_3d, _i32_3d, _f64_3d),
         {"max_registers": 128}),
        (_pick_kernel, void(_f32_2d, _i32_2d, _f64_2d, int32[::1], _i32_3d, _i32_3d, _f64_3d,
                            int32[::1]), {"max_registers": 128}),
    ]
