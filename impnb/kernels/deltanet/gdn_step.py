"""Device functions of one Gated DeltaNet token for one (sequence, V head) block, shared by the
decode kernel (gdn_decode.py) and the prompt-chunk kernel (gdn_prefill.py), and their launch check.

The block's layout (both kernels): ROW_GROUPS * dv threads; thread tid owns column j = tid % dv of
the head's state S (dk, dv) over rows g R .. g R + R - 1, g = tid // dv its row group and
R = dk / ROW_GROUPS (at most ROWS), those R floats in registers (S: a local array of ROWS, every
index a constant once the loops unroll). A warp is 32 columns of one row group, so its loads and
stores of a row of S are 128 contiguous bytes.
Shared memory: qs, ks f32[MAX_DK] (q, k of the token, normalised); gates f32[2] (exp(g), beta);
part_k, part_q f32[ROW_GROUPS, MAX_DV] (row groups' partial Sᵀk and Sᵀq); red f32[32].
"""

import math

import numpy as np
from numba import cuda, types

from impnb.kernels.common.warp import SIMULATOR, warp_sum
from impnb.models.deltanet import L2_EPS

MAX_DK = 128
MAX_DV = 128
ROW_GROUPS = 4             # row groups a column of S is split over: 4 dv threads a block (512 at dv 128)
ROWS = MAX_DK // ROW_GROUPS  # rows of S a thread holds, at most
QK_LANE = MAX_DK // 32     # elements of q (k) a lane of warp 0 (1) normalises
MAX_REGISTERS = 65536 // (ROW_GROUPS * MAX_DV)  # a block of ROW_GROUPS * MAX_DV threads must fit an SM
_ZERO = np.float32(0)
_ONE = np.float32(1)
_L2_EPS = np.float32(L2_EPS)


def block_kernel(fn):
    """cuda.jit with the register cap the largest block needs (the simulator takes no cap)."""
    return cuda.jit(fn) if SIMULATOR else cuda.jit(fn, max_registers=MAX_REGISTERS)


@cuda.jit(device=True, inline=True)
def softplus(x):
    """log(1 + exp(x)) without overflow."""
    return max(x, _ZERO) + math.log1p(math.exp(-abs(x)))


@cuda.jit(device=True, inline=True)
def silu(x):
    return x / (_ONE + math.exp(-x))


@cuda.jit(device=True, inline=True)
def load_state(S, state, slot, h, r0, rows, j):
    """S[m] = state[slot, h, r0 + m, j] for m < rows."""
    for m in range(ROWS):
        if m < rows:
            S[m] = state[slot, h, r0 + m, j]


@cuda.jit(device=True, inline=True)
def store_state(S, state, slot, h, r0, rows, j):
    for m in range(ROWS):
        if m < rows:
            state[slot, h, r0 + m, j] = S[m]


@cuda.jit(device=True, inline=True)
def raw_channel(qkv, r, ch, conv_w, conv_state, src, dst, write):
    """qkv[r, ch] as it is (the conv already applied): a channel reader of inputs_of."""
    return qkv[r, ch]


def inputs_of(channel):
    """token_inputs over the channels that channel(qkv, r, ch, conv_w, conv_state, src, dst,
    write) reads (raw_channel; gdn_decode.conv_channel: the conv applied on the way, its state
    moved on where write)."""
    @cuda.jit(device=True, inline=True)
    def inputs(qkv, b, a, r, h, kh, n_qk, dk, A, dt_bias_h, q_scale, qs, ks, gates, conv_w, conv_state,
               src, dst, write_qk):
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        if warp < 2:
            base = kh * dk + warp * n_qk
            vals = cuda.local.array(QK_LANE, types.float32)
            ss = _ZERO
            for m in range(QK_LANE):
                i = lane + 32 * m
                x = channel(qkv, r, base + i, conv_w, conv_state, src, dst, write_qk) if i < dk else _ZERO
                vals[m] = x
                ss += x * x
            inv = _ONE / math.sqrt(warp_sum(ss) + _L2_EPS)
            if warp == 0:
                inv *= q_scale
            for m in range(QK_LANE):
                i = lane + 32 * m
                if i < dk:
                    if warp == 0:
                        qs[i] = vals[m] * inv
                    else:
                        ks[i] = vals[m] * inv
        elif warp == 2 and lane == 0:
            gates[0] = math.exp(A * softplus(a[r, h] + dt_bias_h))
            gates[1] = _ONE / (_ONE + math.exp(-b[r, h]))
    return inputs


_raw_inputs = inputs_of(raw_channel)


@cuda.jit(device=True, inline=True)
def token_inputs(qkv, b, a, r, h, kh, n_qk, dk, A, dt_bias_h, q_scale, qs, ks, gates):
    """Warp 0: q of row r, QK head kh, L2-normalised and times q_scale, into qs; warp 1: k
    normalised into ks; warp 2's lane 0: exp(g) and beta of V head h into gates. No barrier."""
    _raw_inputs(qkv, b, a, r, h, kh, n_qk, dk, A, dt_bias_h, q_scale, qs, ks, gates, qkv, qkv, 0, 0, False)


@cuda.jit(device=True, inline=True)
def token_update(S, r0, rows, g, j, v_j, qs, ks, gates, part_k, part_q):
    """After token_inputs and a barrier: S *= exp(g); delta = (v - Sᵀk) beta; S += k deltaᵀ on the
    thread's part of column j -> o_j = (Sᵀq)_j, in every thread of the column. Two barriers."""
    decay = gates[0]
    beta = gates[1]
    acc = _ZERO
    for m in range(ROWS):
        if m < rows:
            S[m] *= decay
            acc += S[m] * ks[r0 + m]
    part_k[g, j] = acc
    cuda.syncthreads()
    kv = _ZERO
    for p in range(ROW_GROUPS):
        kv += part_k[p, j]
    delta = (v_j - kv) * beta
    acc = _ZERO
    for m in range(ROWS):
        if m < rows:
            S[m] += ks[r0 + m] * delta
            acc += S[m] * qs[r0 + m]
    part_q[g, j] = acc
    cuda.syncthreads()
    o = _ZERO
    for p in range(ROW_GROUPS):
        o += part_q[p, j]
    return o


@cuda.jit(device=True, inline=True)
def gated_norm(o, z_j, w_j, eps, dv, g, red):
    """rms_norm(o) * w * silu(z) over the head's dv columns, in row group 0's threads (the
    others get 0). One barrier; red is free again once every thread has passed the next one."""
    tid = cuda.threadIdx.x
    if g == 0:
        ss = warp_sum(o * o)
        if tid % 32 == 0:
            red[tid // 32] = ss
    cuda.syncthreads()
    y = _ZERO
    if g == 0:
        total = _ZERO
        for w in range(MAX_DV // 32):
            if w < dv // 32:
                total += red[w]
        y = o / math.sqrt(total / np.float32(dv) + eps) * w_j * silu(z_j)
    return y


def check_gdn_args(qkv, z, b, a, ssm_a, dt_bias, norm_w, state, slots, n_k_heads: int, out):
    """The launchers' shape checks -> (B, T, Hv, dk, dv)."""
    R, C = qkv.shape
    n_slots, Hv, dk, dv = state.shape
    B = slots.shape[0]
    for x, name in ((qkv, "qkv"), (z, "z"), (b, "b"), (a, "a"), (out, "out")):
        assert x.dtype == np.float32 and x.ndim == 2 and x.is_c_contiguous(), f"{name}: (R, n) float32"
    assert state.dtype == np.float32 and state.is_c_contiguous()
    assert dk <= MAX_DK and dk % ROW_GROUPS == 0 and dv <= MAX_DV and dv % 32 == 0, (dk, dv)
    assert Hv % n_k_heads == 0 and C == 2 * n_k_heads * dk + Hv * dv, (C, n_k_heads, Hv, dk, dv)
    assert z.shape == out.shape == (R, Hv * dv) and b.shape == a.shape == (R, Hv)
    assert ssm_a.shape == dt_bias.shape == (Hv,) and norm_w.shape == (dv,)
    assert all(x.dtype == np.float32 for x in (ssm_a, dt_bias, norm_w))
    assert slots.dtype == np.int32 and slots.ndim == 1 and B and R % B == 0, \
        f"{R} rows are not a whole number a sequence of {B}"
    return B, R // B, Hv, dk, dv

