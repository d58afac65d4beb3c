"""Gated DeltaNet's causal depthwise conv1d (width 4) and SiLU over a step's rows, each sequence's
rolling state of its last 3 inputs read from and written back to its slot of a fixed buffer.

The forward's use (not wired yet): after the GEMV that gives qkv (R, C) of a gated_deltanet layer,
    conv1d(qkv, conv_w, conv_state[il], slots, qkv, stream)           # in place
for a decode step (B sequences, one row each, slots (B,) their state slots, -1 for a padded row)
and for a prompt chunk (one sequence, T rows, slots (1,); lengths (1,) where the chunk is padded
to a graph's bucket). A chunk continues from the state the previous chunk left. conv_state
(n_slots, C, 3) float32 a layer, zeroed for a new sequence; conv_w the file's ssm_conv1d (C, 4)
as float32. The gdn kernels read the output.
"""

import math

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.kernels.deltanet.reference import conv1d_ref  # noqa: F401  (the numpy twin)
from impnb.launch import launch

WIDTH = 4  # the conv's kernel width (ssm.conv_kernel of Qwen3-Next / Qwen3.5)
THREADS = 128
_ZERO = np.float32(0)
_ONE = np.float32(1)


# grid (ceil(C / THREADS), B), block THREADS: thread c owns channel c of sequence b, its rows
# b T .. b T + T - 1 in turn (T = R / B), the sequence's last 3 inputs in registers (s0 oldest);
# out[t] = silu(w0 s0 + w1 s1 + w2 s2 + w3 x[t]), then the window slides. Rows at and past the
# sequence's length (use_lengths) and every row of a padded sequence (slot < 0) output zeros and
# leave the state alone. out may be x: a thread reads x[t, c] before it writes out[t, c] and no
# other thread reads it. Before griddepcontrol.wait: the weights, the slot, its length and its
# state (the conv state is written by this layer's conv of an earlier step, kernels ago).
# No shared memory.
@cuda.jit
def _conv1d_kernel(x, weight, state, slots, lengths, use_lengths, out):
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    b = cuda.blockIdx.y
    C = x.shape[1]
    T = x.shape[0] // slots.shape[0]
    slot = slots[b]
    n = min(lengths[b], T) if use_lengths else T
    live = c < C and slot >= 0
    w0 = w1 = w2 = w3 = s0 = s1 = s2 = _ZERO
    if live:
        w0 = weight[c, 0]
        w1 = weight[c, 1]
        w2 = weight[c, 2]
        w3 = weight[c, 3]
        s0 = state[slot, c, 0]
        s1 = state[slot, c, 1]
        s2 = state[slot, c, 2]
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    if c >= C:
        return
    for t in range(T):
        r = b * T + t
        if live and t < n:
            xt = x[r, c]
            y = w0 * s0 + w1 * s1 + w2 * s2 + w3 * xt
            out[r, c] = y / (_ONE + math.exp(-y))
            s0 = s1
            s1 = s2
            s2 = xt
        else:
            out[r, c] = _ZERO
    if live:
        state[slot, c, 0] = s0
        state[slot, c, 1] = s1
        state[slot, c, 2] = s2


def conv1d(x, weight, state, slots, out, stream, lengths=None) -> None:
    """x (R, C) float32, R rows of B sequences (T = R / B each, sequence by sequence); weight
    (C, WIDTH) float32; state (n_slots, C, WIDTH - 1) float32 updated in place at slots (B,) int32
    (-1: a padded sequence) -> out (R, C) (may be x), silu(conv). lengths (B,) int32: the real rows
    of each sequence, the rest padding (None: all T)."""
    R, C = x.shape
    B = slots.shape[0]
    for a, name in ((x, "x"), (out, "out")):
        assert a.dtype == np.float32 and a.ndim == 2 and a.is_c_contiguous(), f"{name}: (R, C) float32"
    assert out.shape == (R, C) and weight.shape == (C, WIDTH) and weight.dtype == np.float32
    assert state.dtype == np.float32 and state.ndim == 3 and state.shape[1:] == (C, WIDTH - 1)
    assert slots.dtype == np.int32 and slots.shape == (B,) and B and R % B == 0, \
        f"{R} rows are not a whole number a sequence of {B}"
    use_lengths = lengths is not None
    if use_lengths:
        assert lengths.dtype == np.int32 and lengths.shape == (B,)
    else:
        lengths = slots  # unread
    if R:
        launch(_conv1d_kernel, ((C + THREADS - 1) // THREADS, B), THREADS, stream, x, weight, state,
               slots, lengths, np.int32(use_lengths), out)


_F2 = types.float32[:, ::1]
_I1 = types.int32[::1]
BUILD_SIGNATURES = [
    (_conv1d_kernel, (_F2, _F2, types.float32[:, :, ::1], _I1, _I1, types.int32, _F2),
     {"max_registers": 40}),
]
