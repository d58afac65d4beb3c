"""Activations to int8 for the dp4a GEMV (gemv_dp4a.py): x (T, K) float32 (or RMSNorm(x) * w, the
layer's pre-norm fused) in groups of 16 columns, each group q = rint(x * 127 / amax) in int8 with
its scale d = amax / 127 and the sum of its dequantized values s = d * sum(q) (what a weight's
constant term multiplies). Numpy reference: `quantize_x_ref`, bit-equal to the plain kernel (the
normed one rounds its norm in another order: within amax/254 of RMSNorm(x) * w a column).

    QuantX: q (T, K/4) uint32, 4 int8 a word in column order; d, s (T, K/16) float32
"""

import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, types, uint32

from impnb.kernels.common import ptx
from impnb.kernels.common import quant_intrinsics as qi
from impnb.kernels.common.warp import shfl_xor
from impnb.launch import launch

GROUP = 16  # columns a scale
WORDS = 4  # int8 words a group
THREADS = 128
WARPS = 4  # THREADS / 32


class QuantX(NamedTuple):
    q: object  # (T, K/4) uint32
    d: object  # (T, K/16) float32
    s: object  # (T, K/16) float32


def quantize_groups_ref(x: np.ndarray, group: int) -> tuple:
    """x (T, K) float32 in int8 groups of `group` columns as the kernels compute them: (q (T, K/4)
    uint32, 4 int8 a word in column order; d, s (T, K/group) float32)."""
    x = np.asarray(x, np.float32)
    n_tok, K = x.shape
    g = x.reshape(n_tok, K // group, group)
    amax = np.abs(g).max(axis=2)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(g * inv[:, :, None]).astype(np.int32)
    s = d * q.sum(axis=2).astype(np.float32)
    words = q.astype(np.int8).view(np.uint8).reshape(n_tok, K // 4, 4).copy().view(np.uint32)
    return words.reshape(n_tok, K // 4), d.astype(np.float32), s.astype(np.float32)


def quantize_x_ref(x: np.ndarray) -> tuple:
    """x (T, K) float32 -> (q (T, K/4) uint32, d (T, K/16), s (T, K/16)) as the kernel computes them."""
    return quantize_groups_ref(x, GROUP)


def dequantize_x_ref(q: np.ndarray, d: np.ndarray, group: int = GROUP) -> np.ndarray:
    """The values the dp4a GEMV multiplies: q * d, (T, K) float64 (of quantize_groups_ref's groups
    of `group` columns)."""
    n_tok = q.shape[0]
    vals = q.view(np.int8).reshape(n_tok, -1, group).astype(np.float64)
    return (vals * d.astype(np.float64)[:, :, None]).reshape(n_tok, -1)


@cuda.jit(device=True, inline=True)
def rms_scale(x, t, wn, eps):
    # -- 1 / sqrt(mean of x[t]² + eps): the block sums the whole row (it is in L2) --
    K = x.shape[1]
    sq = float32(0.0)
    for i in range(4 * cuda.threadIdx.x, K, 4 * THREADS):
        v0, v1, v2, v3 = qi.ldg_f32x4(x, t * K + i)
        sq += (v0 * v0 + v1 * v1) + (v2 * v2 + v3 * v3)
    red = cuda.shared.array(WARPS, float32)
    scratch = cuda.shared.array(THREADS, float32)
    sq = qi.warp_sum(sq, scratch)
    if cuda.threadIdx.x % 32 == 0:
        red[cuda.threadIdx.x // 32] = sq
    cuda.syncthreads()
    total = float32(0.0)
    for i in range(WARPS):
        total += red[i]
    return float32(1.0) / math.sqrt(total / float32(K) + eps)


def make_quantize_words(n: int):
    """quantize(v, words): the n floats of local array v in int8, round(v * 127 / amax) ties to
    even, into words[0 .. n/4) (4 int8 a word in column order); returns (the scale amax / 127,
    the scale times the int8 values' sum)."""
    n_words = n // 4

    @cuda.jit(device=True, inline=True)
    def quantize(v, words):
        amax = float32(0.0)
        for j in range(n):
            amax = max(amax, abs(v[j]))
        inv = float32(127.0) / amax if amax > float32(0.0) else float32(0.0)
        total = int32(0)
        for j in range(n_words):
            w = uint32(0)
            for b in range(4):
                k = qi.rint_s32(v[4 * j + b] * inv)
                total += k
                w |= uint32(k & 0xFF) << uint32(8 * b)
            words[j] = w
        scale = amax / float32(127.0)
        return scale, scale * float32(total)

    return quantize


_quantize_words16 = make_quantize_words(GROUP)


@cuda.jit(device=True, inline=True)
def quantize16(v):
    """The GROUP floats of local array v in int8: (4 words of 4 int8 each, round(v * 127 / amax)
    ties to even; the scale amax / 127; the scale times the int8 values' sum)."""
    words = cuda.local.array(WORDS, uint32)
    scale, total = _quantize_words16(v, words)
    return words[0], words[1], words[2], words[3], scale, total


@cuda.jit(device=True, inline=True)
def scale4(v, j, rms, wn, k):
    """v[4 j .. 4 j + 3] times rms and wn[k .. k + 3] (the pre-norm of four columns)."""
    w0, w1, w2, w3 = qi.ldg_f32x4(wn, k)
    v[4 * j] = v[4 * j] * rms * w0
    v[4 * j + 1] = v[4 * j + 1] * rms * w1
    v[4 * j + 2] = v[4 * j + 2] * rms * w2
    v[4 * j + 3] = v[4 * j + 3] * rms * w3


@cuda.jit(device=True, inline=True)
def store_group(v, q, d, s, t, g):
    """Group g of row t: the GROUP floats of local array v in int8 (quantize16) into q, d, s."""
    w0, w1, w2, w3, scale, total = quantize16(v)
    qi.stg_x4(q, t * q.shape[1] + 4 * g, w0, w1, w2, w3)
    d[t, g] = scale
    s[t, g] = total


@cuda.jit(device=True, inline=True)
def store_group_lanes(v, live, q, d, s, t, g0):
    """Every lane of a warp, each 16-lane half a group: lane j of half h holds column j of group
    g0 + h of row t (v; 0 and live False past the row's groups), written in int8 into q, d, s as
    store_group writes them, bit for bit (the same amax, rounding and integer sum, by shuffles)."""
    lane = cuda.threadIdx.x & 31
    j = lane & 15
    amax = abs(v)
    for off in (8, 4, 2, 1):
        amax = max(amax, shfl_xor(amax, off))
    inv = float32(127.0) / amax if amax > float32(0.0) else float32(0.0)
    k = qi.rint_s32(v * inv)
    byte = k & 0xFF
    if j & 3 == 3:
        byte = (byte ^ 0x80) - 0x80  # the top byte signed: the word's bits as an int32 (shuffles take no uint32)
    word = int32(byte << (8 * (j & 3)))
    word = int32(word | shfl_xor(word, 1))
    word = int32(word | shfl_xor(word, 2))
    total = int32(k)
    for off in (8, 4, 2, 1):
        total = int32(total + shfl_xor(total, off))
    g = g0 + (lane >> 4)
    if live and j & 3 == 0:
        q[t, 4 * g + (j >> 2)] = uint32(word)
    if live and j == 0:
        scale = amax / float32(127.0)
        d[t, g] = scale
        s[t, g] = scale * float32(total)


def make_quantize_block(normed):
    """quantize_block(x, wn, eps, q, d, s, bx, t): the 128 threads of a block write groups
    128 bx .. 128 bx + 127 of token t (normed: of RMSNorm(x[t]) * wn, the row's scale summed by
    the block); every thread of the block must call it (it synchronizes)."""
    @cuda.jit(device=True, inline=True)
    def quantize_block(x, wn, eps, q, d, s, bx, t):
        g = bx * THREADS + cuda.threadIdx.x
        rms = rms_scale(x, t, wn, eps) if normed else float32(1.0)
        if g >= d.shape[1]:
            return
        v = cuda.local.array(GROUP, float32)
        for j in range(WORDS):
            k = GROUP * g + 4 * j
            v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3] = qi.ldg_f32x4(x, t * x.shape[1] + k)
            if normed:
                scale4(v, j, rms, wn, k)
        store_group(v, q, d, s, t, g)

    return quantize_block


def _make_quantize_x(normed):
    # grid (ceil(K/16 / 128), T), block 128: a thread a group of 16 columns of token t = blockIdx.y
    quantize_block = make_quantize_block(normed)

    @cuda.jit
    def _quantize_x_kernel(x, wn, eps, q, d, s):
        ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
        ptx.grid_dep_launch()
        quantize_block(x, wn, eps, q, d, s, cuda.blockIdx.x, cuda.blockIdx.y)

    return _quantize_x_kernel


_quantize_x_kernel = _make_quantize_x(False)
_quantize_x_norm_kernel = _make_quantize_x(True)


@cuda.jit
def _quantize_x_norm_row_kernel(x, wn, eps, q, d, s):
    # grid (1, T), block 128, rows of at most THREADS groups (K <= 2048): thread g holds group g of
    # token t = blockIdx.y in registers, its wn before the wait, the row's squares summed from them;
    # one round trip to L2 after the wait where rms_scale's pass and the groups' wn take three
    tid = cuda.threadIdx.x
    t = cuda.blockIdx.y
    K = x.shape[1]
    G = K // GROUP
    g = min(tid, G - 1)
    w = cuda.local.array(GROUP, float32)
    v = cuda.local.array(GROUP, float32)
    for j in range(WORDS):  # (no kernel writes wn)
        w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3] = qi.ldg_f32x4(wn, GROUP * g + 4 * j)
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished (x)
    ptx.grid_dep_launch()
    for j in range(WORDS):
        v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3] = qi.ldg_f32x4(x, t * K + GROUP * g + 4 * j)
    sq = float32(0.0)
    if tid < G:
        for j in range(WORDS):
            sq += (v[4 * j] * v[4 * j] + v[4 * j + 1] * v[4 * j + 1]) + (v[4 * j + 2] * v[4 * j + 2]
                                                                         + v[4 * j + 3] * v[4 * j + 3])
    red = cuda.shared.array(WARPS, float32)
    scratch = cuda.shared.array(THREADS, float32)
    sq = qi.warp_sum(sq, scratch)
    if tid % 32 == 0:
        red[tid // 32] = sq
    cuda.syncthreads()
    total = float32(0.0)
    for i in range(WARPS):
        total += red[i]
    rms = float32(1.0) / math.sqrt(total / float32(K) + eps)
    if tid >= G:
        return
    for i in range(GROUP):
        v[i] = v[i] * rms * w[i]
    store_group(v, q, d, s, t, g)


def quant_x_buffers(n_tok: int, K: int) -> QuantX:
    """Device buffers for the int8 form of a (T, K) activation (allocation plan: load time)."""
    return QuantX(cuda.device_array((n_tok, K // 4), np.uint32), cuda.device_array((n_tok, K // GROUP), np.float32),
                  cuda.device_array((n_tok, K // GROUP), np.float32))


def arena_buffers(arena, n_tok: int, K: int, name: str = "xq") -> QuantX:
    """quant_x_buffers' from an Arena (gpu/buffers.py), under name, name_d, name_s."""
    return QuantX(arena.get(name, (n_tok, K // 4), np.uint32), arena.get(name + "_d", (n_tok, K // GROUP)),
                  arena.get(name + "_s", (n_tok, K // GROUP)))


def quantize_x(x, out: QuantX, stream, norm: tuple | None = None) -> None:
    """out = the int8 form of x (T, K) float32, K a multiple of 16, or with norm (wn (K,) float32,
    eps) of RMSNorm(x) * wn; out's rows: the first T."""
    n_tok, K = x.shape
    assert x.dtype == np.float32 and x.is_c_contiguous() and K % GROUP == 0
    assert out.q.shape[1] == K // 4 and out.d.shape[1] == K // GROUP and out.q.shape[0] >= n_tok
    q, d, s = (a[:n_tok] for a in out)
    grid = ((K // GROUP + THREADS - 1) // THREADS, n_tok)
    if norm is None:
        launch(_quantize_x_kernel, grid, THREADS, stream, x, x[0], np.float32(0), q, d, s)
        return
    wn, eps = norm
    assert wn.dtype == np.float32 and wn.shape == (K,)
    row = K // GROUP <= THREADS  # a block holds the row: its squares summed from the groups it quantizes
    launch(_quantize_x_norm_row_kernel if row else _quantize_x_norm_kernel, grid, THREADS, stream, x, wn,
           np.float32(eps), q, d, s)


F32_2D = types.Array(types.float32, 2, "C")
_SIG = types.void(F32_2D, types.Array(types.float32, 1, "C"), types.float32, types.Array(types.uint32, 2, "C"),
                  F32_2D, F32_2D)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(_quantize_x_kernel, _SIG, {"max_registers": 64}), (_quantize_x_norm_kernel, _SIG, {"max_registers": 64}),
            (_quantize_x_norm_row_kernel, _SIG, {"max_registers": 64})]
