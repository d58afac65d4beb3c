"""A prompt chunk of a Gated DeltaNet layer after its conv, one kernel: gdn_decode's token step run
token by token over the chunk's rows, each sequence's state held in registers across the chunk
(read once at its start, written once at its end), the gated RMSNorm fused.

This is the simple form: T dependent steps of four block barriers each, no tensor cores. The
chunked WY / UT form on the tensor cores, with the same arguments, is gdn_chunked.py; which one a
prompt chunk takes is tuning's GDN_CHUNKED_MIN_ROWS.

The forward's use (gpu/deltanet.py), per gated_deltanet layer il of a prompt chunk of T rows of one
sequence at state slot s (slots = [s]; lengths = [n] where the chunk is padded to a graph's
bucket, the padding leaving the state alone):
    GEMM h -> qkv (T, C), z (T, Hv dv), b, a (T, Hv)
    conv1d(qkv, conv_w, conv_state[il], slots, qkv, stream, lengths)
    gdn_prefill(qkv, z, b, a, ssm_a, dt_bias, ssm_norm, eps, ssm_state[il], slots, Hk, v_tiled, y,
                stream, lengths)
    GEMM ssm_out(y) added into the residual
A chunk continues from the state the previous one left; the next decode step from the last.
Several sequences of T rows each (B slots) go in one launch the same way. With pos (the rows'
positions) a sequence's state is the slot pair slots[s], slots[s] + 1: read at the chunk's first
position's parity, written at that of the position after its last real row (conv1d.py says why).
"""

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.kernels.deltanet.gdn_step import (MAX_DK, MAX_DV, ROW_GROUPS, ROWS, block_kernel,
                                             check_gdn_args, gated_norm, load_state, store_state,
                                             token_inputs, token_update)
from impnb.kernels.deltanet.slots import prompt_rows, sequence_slots
from impnb.kernels.deltanet.reference import gdn_ref  # noqa: F401  (the numpy twin)
from impnb.launch import launch

_ZERO = np.float32(0)


# grid (Hv, B), block ROW_GROUPS * dv: V head h of sequence s (rows s T .. s T + T - 1, its state
# slot slots[s]), the layout of gdn_step.py (thread: column j, row group g, R rows of S in
# registers across the chunk). The V head reads QK head h % Hk (v_tiled) or h // (Hv / Hk).
# -- before griddepcontrol.wait: the slot, its length (and position), A, dt_bias, the norm weight,
#    the thread's part of S (written by this layer's kernels of earlier chunks or steps) --
# -- per row t < n: q, k normalised, gates (warps 0-2); v, z of the column -- barrier
#    -- decay, Sᵀk partials -- barrier -- update, Sᵀq partials -- barrier -- gated norm --
#    barrier -- out written by row group 0; rows t >= n (padding) output zeros --
# -- S stored --
# A padded sequence (slot < 0) touches no state and outputs zeros.
# shared: gdn_step.py's qs, ks, gates, part_k, part_q, red (about 5 KB).
@block_kernel
def _gdn_prefill_kernel(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps, q_scale, n_k_heads, v_tiled,
                        state, slots, lengths, use_lengths, pos, use_pos, out):
    h = cuda.blockIdx.x
    s = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    Hv = state.shape[1]
    dk = state.shape[2]
    dv = state.shape[3]
    T = qkv.shape[0] // slots.shape[0]
    j = tid % dv
    g = tid // dv
    rows = dk // ROW_GROUPS
    r0 = g * rows
    slot, n, src, dst = sequence_slots(slots, lengths, use_lengths, pos, use_pos, s, T)
    S = cuda.local.array(ROWS, types.float32)
    if slot >= 0:
        load_state(S, state, src, h, r0, rows, j)
    A = ssm_a[h]
    bias = dt_bias[h]
    w_j = norm_w[j]
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    col = h * dv + j
    qs = cuda.shared.array(MAX_DK, types.float32)
    ks = cuda.shared.array(MAX_DK, types.float32)
    gates = cuda.shared.array(2, types.float32)
    part_k = cuda.shared.array((ROW_GROUPS, MAX_DV), types.float32)
    part_q = cuda.shared.array((ROW_GROUPS, MAX_DV), types.float32)
    red = cuda.shared.array(32, types.float32)
    n_qk = n_k_heads * dk
    kh = h % n_k_heads if v_tiled else h // (Hv // n_k_heads)
    for t in range(n):
        r = s * T + t
        token_inputs(qkv, b, a, r, h, kh, n_qk, dk, A, bias, q_scale, qs, ks, gates)
        v_j = qkv[r, 2 * n_qk + col]
        z_j = z[r, col]
        cuda.syncthreads()
        o = token_update(S, r0, rows, g, j, v_j, qs, ks, gates, part_k, part_q)
        y = gated_norm(o, z_j, w_j, eps, dv, g, red)
        if g == 0:
            out[r, col] = y
    if g == 0:
        for t in range(n, T):
            out[s * T + t, col] = _ZERO
    if slot >= 0:
        store_state(S, state, dst, h, r0, rows, j)


def gdn_prefill(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps: float, state, slots, n_k_heads: int,
                v_tiled: bool, out, stream, lengths=None, pos=None) -> None:
    """T rows of each of B sequences (R = B T, sequence by sequence): qkv (R, C) the conv's output
    ([q (Hk dk), k (Hk dk), v (Hv dv)] a row), z (R, Hv dv), b, a (R, Hv), ssm_a, dt_bias (Hv,),
    norm_w (dv,), all float32; state (n_slots, Hv, dk, dv) float32 carried in and out at slots
    (B,) int32 (-1: padding) -> out (R, Hv dv) = rms_norm(o) * norm_w * silu(z) per head.
    lengths (B,) int32: the real rows of each sequence, the rest padding (None: all T). pos (R,)
    int32: the rows' positions, each sequence's state then a slot pair (see above)."""
    B, T, Hv, dk, dv = check_gdn_args(qkv, z, b, a, ssm_a, dt_bias, norm_w, state, slots, n_k_heads, out)
    lengths, use_lengths, pos, use_pos = prompt_rows(slots, B, T, lengths, pos)
    launch(_gdn_prefill_kernel, (Hv, B), ROW_GROUPS * dv, stream, qkv, z, b, a, ssm_a, dt_bias, norm_w,
           np.float32(eps), np.float32(dk ** -0.5), np.int32(n_k_heads), np.int32(bool(v_tiled)),
           state, slots, lengths, use_lengths, pos, use_pos, out)


_F2 = types.float32[:, ::1]
_F1 = types.float32[::1]
_I1 = types.int32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_gdn_prefill_kernel, (_F2, _F2, _F2, _F2, _F1, _F1, _F1, types.float32, types.float32, types.int32,
                               types.int32, types.float32[:, :, :, ::1], _I1, _I1, types.int32, _I1, types.int32,
                               _F2),
         {"max_registers": 128}),
    ]
