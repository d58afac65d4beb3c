"""One decode step of a Gated DeltaNet layer after its conv, one kernel: q/k L2 norm and q scale,
exp(g) and beta from a and b, the delta rule on each sequence's state in place (read once, written
once), o = Sᵀq and the gated RMSNorm with silu(z).

The forward's use (gpu/deltanet.py), per gated_deltanet layer il of a decode step of B sequences:
    GEMV h -> qkv (B, C), z (B, Hv dv), b, a (B, Hv)     # attn_qkv, attn_gate, ssm_beta, ssm_alpha
    conv1d(qkv, conv_w, conv_state[il], slots, qkv, s)    # conv1d.py
    gdn_decode(qkv, z, b, a, ssm_a, dt_bias, ssm_norm, eps, ssm_state[il], slots, Hk, v_tiled, y, s)
    GEMV ssm_out(y) added into the residual
ssm_state (n_slots, Hv, dk, dv) float32 a layer (zeroed for a new sequence), slots (B,) the rows'
slots (-1: a padded row), all device buffers of fixed address, so a CUDA graph captures the step.
With pos (the rows' positions) a row's state is the slot pair slots[r], slots[r] + 1: read at
pos's parity, written at pos + 1's (conv1d.py says why).
ssm_a is the file's ssm_a (-exp(A_log)), dt_bias its ssm_dt.bias, ssm_norm (dv,) its ssm_norm.
"""

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.kernels.deltanet.gdn_step import (MAX_DK, MAX_DV, ROW_GROUPS, ROWS, block_kernel,
                                             check_gdn_args, gated_norm, load_state, store_state,
                                             token_inputs, token_update)
from impnb.kernels.deltanet.reference import gdn_ref  # noqa: F401  (the numpy twin, lengths None)
from impnb.launch import launch

_ZERO = np.float32(0)


# grid (Hv, B), block ROW_GROUPS * dv: V head h of row r (sequence r, its state slot slots[r]),
# the layout of gdn_step.py (thread: column j, row group g, R rows of S in registers). The V
# head reads QK head h % Hk (v_tiled) or h // (Hv / Hk).
# -- before griddepcontrol.wait: the slot (and position), the head's A, dt_bias, the norm weight,
#    and the thread's part of S (written by this layer's kernel in an earlier step, kernels ago) --
# -- q, k normalised, gates (warps 0-2); v, z of the column -- barrier
# -- decay, Sᵀk partials -- barrier -- update, Sᵀq partials -- barrier -- S stored --
# -- gated norm (row group 0) -- barrier -- out written by row group 0.
# A padded row (slot < 0) touches no state and outputs zeros. S moves once each way: Hv dk dv 4
# bytes a sequence; one sequence fills only Hv SMs (the gated norm's sum keeps a head in a block).
# shared: gdn_step.py's qs, ks, gates, part_k, part_q, red (about 5 KB).
@block_kernel
def _gdn_decode_kernel(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps, q_scale, n_k_heads, v_tiled,
                       state, slots, pos, use_pos, out):
    h = cuda.blockIdx.x
    r = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    Hv = state.shape[1]
    dk = state.shape[2]
    dv = state.shape[3]
    j = tid % dv
    g = tid // dv
    rows = dk // ROW_GROUPS
    r0 = g * rows
    slot = slots[r]
    src = slot
    dst = slot
    if use_pos and slot >= 0:
        src = slot + pos[r] % 2
        dst = slot + (pos[r] + 1) % 2
    S = cuda.local.array(ROWS, types.float32)
    if slot >= 0:
        load_state(S, state, src, h, r0, rows, j)
    A = ssm_a[h]
    bias = dt_bias[h]
    w_j = norm_w[j]
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    col = h * dv + j
    if slot < 0:
        if g == 0:
            out[r, col] = _ZERO
        return
    qs = cuda.shared.array(MAX_DK, types.float32)
    ks = cuda.shared.array(MAX_DK, types.float32)
    gates = cuda.shared.array(2, types.float32)
    part_k = cuda.shared.array((ROW_GROUPS, MAX_DV), types.float32)
    part_q = cuda.shared.array((ROW_GROUPS, MAX_DV), types.float32)
    red = cuda.shared.array(32, types.float32)
    n_qk = n_k_heads * dk
    kh = h % n_k_heads if v_tiled else h // (Hv // n_k_heads)
    token_inputs(qkv, b, a, r, h, kh, n_qk, dk, A, bias, q_scale, qs, ks, gates)
    v_j = qkv[r, 2 * n_qk + col]
    z_j = z[r, col]
    cuda.syncthreads()
    o = token_update(S, r0, rows, g, j, v_j, qs, ks, gates, part_k, part_q)
    store_state(S, state, dst, h, r0, rows, j)
    y = gated_norm(o, z_j, w_j, eps, dv, g, red)
    if g == 0:
        out[r, col] = y


def gdn_decode(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps: float, state, slots, n_k_heads: int,
               v_tiled: bool, out, stream, pos=None) -> None:
    """One token of B sequences: qkv (B, C) the conv's output ([q (Hk dk), k (Hk dk), v (Hv dv)]
    a row), z (B, Hv dv), b, a (B, Hv), ssm_a, dt_bias (Hv,), norm_w (dv,), all float32; state
    (n_slots, Hv, dk, dv) float32 updated in place at slots (B,) int32 (-1: padding) ->
    out (B, Hv dv) = rms_norm(o) * norm_w * silu(z) per head. pos (B,) int32: the rows' positions,
    each row's state then a slot pair (see above)."""
    B, T, Hv, dk, dv = check_gdn_args(qkv, z, b, a, ssm_a, dt_bias, norm_w, state, slots, n_k_heads, out)
    assert T == 1, f"{qkv.shape[0]} rows for {B} sequences: decode is one row a sequence"
    use_pos = pos is not None
    if use_pos:
        assert pos.dtype == np.int32 and pos.shape == (B,) and pos.is_c_contiguous(), "pos: int32 (B,)"
    else:
        pos = slots  # unread
    launch(_gdn_decode_kernel, (Hv, B), ROW_GROUPS * dv, stream, qkv, z, b, a, ssm_a, dt_bias, norm_w,
           np.float32(eps), np.float32(dk ** -0.5), np.int32(n_k_heads), np.int32(bool(v_tiled)),
           state, slots, pos, np.int32(use_pos), out)


_F2 = types.float32[:, ::1]
_F1 = types.float32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_gdn_decode_kernel, (_F2, _F2, _F2, _F2, _F1, _F1, _F1, types.float32, types.float32, types.int32,
                              types.int32, types.float32[:, :, :, ::1], types.int32[::1], types.int32[::1],
                              types.int32, _F2),
         {"max_registers": 96}),
    ]
