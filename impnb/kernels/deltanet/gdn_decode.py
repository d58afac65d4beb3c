"""One decode step of a Gated DeltaNet layer after its conv, one kernel: q/k L2 norm and q scale,
exp(g) and beta from a and b, the delta rule on each sequence's state in place (read once, written
once), o = Sᵀq and the gated RMSNorm with silu(z). With `conv` the kernel takes the projection's
raw qkv and applies conv1d.py's conv and SiLU itself (one launch fewer a layer): each block
convolves the q, k and v channels it reads, and the channels' conv state moves on in one block
each (q and k: slice 0 of the first V head that reads the QK head; v: row group 0 of its column).

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

import math

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.kernels.common.warp import SIMULATOR, warp_sum
from impnb.kernels.deltanet.gdn_step import (MAX_DK, MAX_DV, MAX_REGISTERS, ROW_GROUPS, ROWS, block_kernel,
                                             check_gdn_args, gated_norm, inputs_of, load_state, silu,
                                             store_state, token_inputs, token_update)
from impnb.kernels.deltanet.conv1d import WIDTH
from impnb.kernels.deltanet.reference import gdn_ref  # noqa: F401  (the numpy twin, lengths None)
from impnb.launch import launch

_ZERO = np.float32(0)
_ONE = np.float32(1)


@cuda.jit(device=True, inline=True)
def conv_channel(qkv, r, ch, conv_w, conv_state, src, dst, write):
    """conv1d.py's output of channel ch at row r from its raw input and conv state (slot src):
    silu(w0 s0 + w1 s1 + w2 s2 + w3 x), the state moved on by x into slot dst when write."""
    x = qkv[r, ch]
    s0 = conv_state[src, ch, 0]
    s1 = conv_state[src, ch, 1]
    s2 = conv_state[src, ch, 2]
    y = conv_w[ch, 0] * s0 + conv_w[ch, 1] * s1 + conv_w[ch, 2] * s2 + conv_w[ch, 3] * x
    if write:
        conv_state[dst, ch, 0] = s1
        conv_state[dst, ch, 1] = s2
        conv_state[dst, ch, 2] = x
    return y / (_ONE + math.exp(-y))


token_inputs_conv = inputs_of(conv_channel)  # gdn_step.token_inputs on the conv's output of the raw qkv


# grid (Hv VS, B), block ROW_GROUPS * dv / VS: dv slice vs of V head h of row r (sequence r, its
# state slot slots[r]), with VS = dv / 32 slices a head on the GPU (a thread-block cluster of VS
# blocks: the gated norm's sum spans the head) and 1 in the simulator. The layout of gdn_step.py
# within a slice (thread: column j of the slice, row group g, R rows of S in registers). The V
# head reads QK head h % Hk (v_tiled) or h // (Hv / Hk).
# -- before griddepcontrol.wait: the slot (and position), the head's A, dt_bias, the norm weight,
#    and the thread's part of S (written by this layer's kernel in an earlier step, kernels ago) --
# -- q, k normalised, gates (warps 0-2); v, z of the column (with use_conv: q, k, v through the
#    conv first, its state read from conv_state's slot src, moved on into dst) -- barrier
# -- decay, Sᵀk partials -- barrier -- update, Sᵀq partials -- barrier -- S stored --
# -- gated norm: row group 0's squares, summed over the cluster's blocks through distributed
#    shared memory (two cluster barriers) -- out written by row group 0.
# A padded row (slot < 0) touches no state and outputs zeros (all of a cluster's blocks alike).
# S moves once each way: Hv dk dv 4 bytes a sequence, over Hv VS SMs.
# shared: gdn_step.py's qs, ks, gates, part_k, part_q, red (about 5 KB).
@block_kernel
def _gdn_decode_kernel(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps, q_scale, n_k_heads, v_tiled,
                       state, slots, pos, use_pos, conv_w, conv_state, use_conv, out):
    tid = cuda.threadIdx.x
    Hv = state.shape[1]
    dk = state.shape[2]
    dv = state.shape[3]
    cols = cuda.blockDim.x // ROW_GROUPS
    n_slices = dv // cols
    h = cuda.blockIdx.x // n_slices
    r = cuda.blockIdx.y
    jl = tid % cols
    j = (cuda.blockIdx.x % n_slices) * cols + jl
    g = tid // cols
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
    if use_conv:
        first_h = kh if v_tiled else kh * (Hv // n_k_heads)  # the first V head reading QK head kh
        write_qk = h == first_h and cuda.blockIdx.x % n_slices == 0
        token_inputs_conv(qkv, b, a, r, h, kh, n_qk, dk, A, bias, q_scale, qs, ks, gates, conv_w,
                          conv_state, src, dst, write_qk)
        v_j = conv_channel(qkv, r, 2 * n_qk + col, conv_w, conv_state, src, dst, g == 0)
    else:
        token_inputs(qkv, b, a, r, h, kh, n_qk, dk, A, bias, q_scale, qs, ks, gates)
        v_j = qkv[r, 2 * n_qk + col]
    z_j = z[r, col]
    cuda.syncthreads()
    o = token_update(S, r0, rows, g, jl, v_j, qs, ks, gates, part_k, part_q)
    store_state(S, state, dst, h, r0, rows, j)
    if n_slices == 1:
        y = gated_norm(o, z_j, w_j, eps, dv, g, red)
    else:
        y = _cluster_gated_norm(o, z_j, w_j, eps, dv, g, n_slices, red)
    if g == 0:
        out[r, col] = y


@cuda.jit(device=True, inline=True)
def _cluster_gated_norm(o, z_j, w_j, eps, dv, g, n_slices, red):
    """gdn_step.gated_norm over a head split into n_slices blocks of 32 columns (one warp a row
    group), a cluster: each block's row group 0 puts its squares' sum in red[0]; after a cluster
    barrier every block adds the cluster's sums; a second one keeps each red[0] alive until read."""
    if g == 0:
        ss = warp_sum(o * o)
        if cuda.threadIdx.x == 0:
            red[0] = ss
    ptx.cluster_sync()
    total = _ZERO
    if g == 0:
        for rank in range(MAX_DV // 32):
            if rank < n_slices:
                total += ptx.ld_cluster_f32(ptx.smem_addr(red, 0), rank)
    ptx.cluster_sync()
    return o / math.sqrt(total / np.float32(dv) + eps) * w_j * silu(z_j) if g == 0 else _ZERO


def gdn_decode(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps: float, state, slots, n_k_heads: int,
               v_tiled: bool, out, stream, pos=None, conv=None) -> None:
    """One token of B sequences: qkv (B, C) the conv's output ([q (Hk dk), k (Hk dk), v (Hv dv)]
    a row), z (B, Hv dv), b, a (B, Hv), ssm_a, dt_bias (Hv,), norm_w (dv,), all float32; state
    (n_slots, Hv, dk, dv) float32 updated in place at slots (B,) int32 (-1: padding) ->
    out (B, Hv dv) = rms_norm(o) * norm_w * silu(z) per head. pos (B,) int32: the rows' positions,
    each row's state then a slot pair (see above). conv (conv_w (C, WIDTH), conv_state (n_slots,
    C, WIDTH - 1)) float32: qkv is the projection's raw output and the conv is applied here, as
    conv1d.py would (its state a slot pair too: pos is then required, so that no block reads a
    slot another writes)."""
    B, T, Hv, dk, dv = check_gdn_args(qkv, z, b, a, ssm_a, dt_bias, norm_w, state, slots, n_k_heads, out)
    assert T == 1, f"{qkv.shape[0]} rows for {B} sequences: decode is one row a sequence"
    use_pos = pos is not None
    if use_pos:
        assert pos.dtype == np.int32 and pos.shape == (B,) and pos.is_c_contiguous(), "pos: int32 (B,)"
    else:
        pos = slots  # unread
    if conv is not None:
        conv_w, conv_state = conv
        C = qkv.shape[1]
        assert use_pos, "the fused conv reads and writes its state by position parity"
        assert conv_w.shape == (C, WIDTH) and conv_w.dtype == np.float32 and conv_w.is_c_contiguous()
        assert conv_state.dtype == np.float32 and conv_state.is_c_contiguous()
        assert conv_state.shape[1:] == (C, WIDTH - 1) and conv_state.shape[0] == state.shape[0]
    else:
        conv_w, conv_state = qkv, state.reshape(state.shape[0], Hv * dk, dv)  # unread
    n_slices = 1 if SIMULATOR else dv // 32
    launch(_gdn_decode_kernel, (Hv * n_slices, B), ROW_GROUPS * dv // n_slices, stream, qkv, z, b, a, ssm_a,
           dt_bias, norm_w, np.float32(eps), np.float32(dk ** -0.5), np.int32(n_k_heads),
           np.int32(bool(v_tiled)), state, slots, pos, np.int32(use_pos), conv_w, conv_state,
           np.int32(conv is not None), out,
           cluster=(n_slices, 1, 1) if n_slices > 1 else None)


_F2 = types.float32[:, ::1]
_F1 = types.float32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_gdn_decode_kernel, (_F2, _F2, _F2, _F2, _F1, _F1, _F1, types.float32, types.float32, types.int32,
                              types.int32, types.float32[:, :, :, ::1], types.int32[::1], types.int32[::1],
                              types.int32, _F2, types.float32[:, :, ::1], types.int32, _F2),
         {"max_registers": MAX_REGISTERS, "ptx_contains": ("barrier.cluster.arrive", "mapa.shared::cluster")}),
    ]
