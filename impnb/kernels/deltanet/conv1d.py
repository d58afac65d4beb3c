"""Gated DeltaNet's causal depthwise conv1d (width 4) and SiLU over a step's rows, each sequence's
rolling state of its last 3 inputs read from and written back to its slot of a fixed buffer.

The forward's use (gpu/deltanet.py): after the GEMV that gives qkv (R, C) of a gated_deltanet layer,
    conv1d(qkv, conv_w, conv_state[il], slots, qkv, stream)           # in place
for a decode step (B sequences, one row each, slots (B,) their state slots, -1 for a padded row)
and for a prompt chunk (one sequence, T rows, slots (1,); lengths (1,) where the chunk is padded
to a graph's bucket). A chunk continues from the state the previous chunk left. conv_state
(n_slots, C, 3) float32 a layer, zeroed for a new sequence; conv_w the file's ssm_conv1d (C, 4)
as float32. The gdn kernels read the output.
With pos (the rows' positions), a sequence's state is a pair of slots, slots[b] and slots[b] + 1:
a step at positions p0 .. p0 + n - 1 reads the slot of p0's parity and writes the slot of
p0 + n's, so the state before the step survives it (a step queued ahead and then dropped by
the engine leaves the state it started from).
"""

import math

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.kernels.deltanet.reference import conv1d_ref  # noqa: F401  (the numpy twin)
from impnb.kernels.deltanet.slots import prompt_rows, sequence_slots
from impnb.launch import launch

WIDTH = 4      # the conv's kernel width (ssm.conv_kernel of Qwen3-Next / Qwen3.5)
CHANNELS = 32  # channels a block owns: a warp's lanes
WARPS = 8      # warps a block: each takes every WARPS-th row of a tile
TILE = 64      # rows a tile: loaded into shared memory whole before any is written
XS_ROWS = TILE + WIDTH - 1
_ZERO = np.float32(0)
_ONE = np.float32(1)


# grid (ceil(C / CHANNELS), B), block (32 WARPS): channels c0 .. c0 + 31 of sequence b (rows
# b T .. b T + T - 1, T = R / B); lane l owns channel c0 + l, warp w rows w, w + WARPS, .. of each
# tile. A tile's rows go to shared memory whole (barrier) before any output is written, so out
# may be x; out[t] = silu(w0 x[t-3] + w1 x[t-2] + w2 x[t-1] + w3 x[t]), the inputs before the
# chunk from the state. Then warp 0 keeps the tile's last 3 inputs in rows 0-2 for the next tile,
# and at the end writes them to the state. Rows at and past the sequence's length (use_lengths)
# and every row of a padded sequence (slot < 0) output zeros and leave the state alone.
# Before griddepcontrol.wait: the weights, the slot, its length and its state (the conv state is
# written by this layer's conv of an earlier step, kernels ago).
# shared: xs f32[TILE + 3, CHANNELS]: rows 0-2 the 3 inputs before the tile, then the tile's.
@cuda.jit
def _conv1d_kernel(x, weight, state, slots, lengths, use_lengths, pos, use_pos, out):
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    c = cuda.blockIdx.x * CHANNELS + lane
    b = cuda.blockIdx.y
    C = x.shape[1]
    T = x.shape[0] // slots.shape[0]
    slot, n, src, dst = sequence_slots(slots, lengths, use_lengths, pos, use_pos, b, T)
    live = c < C
    xs = cuda.shared.array((XS_ROWS, CHANNELS), types.float32)
    w0 = w1 = w2 = w3 = _ZERO
    if live:
        w0 = weight[c, 0]
        w1 = weight[c, 1]
        w2 = weight[c, 2]
        w3 = weight[c, 3]
        if warp == 0 and slot >= 0:
            for i in range(WIDTH - 1):
                xs[i, lane] = state[src, c, i]
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    row0 = b * T
    for t0 in range(0, n, TILE):
        m = min(TILE, n - t0)
        # -- load the tile --
        for i in range(warp, m, WARPS):
            xs[WIDTH - 1 + i, lane] = x[row0 + t0 + i, c] if live else _ZERO
        cuda.syncthreads()
        # -- outputs --
        if live:
            for i in range(warp, m, WARPS):
                y = (w0 * xs[i, lane] + w1 * xs[i + 1, lane] + w2 * xs[i + 2, lane]
                     + w3 * xs[i + 3, lane])
                out[row0 + t0 + i, c] = y / (_ONE + math.exp(-y))
        cuda.syncthreads()
        # -- rows m .. m + 2 (the last 3 inputs) to rows 0-2, in order: read before overwritten --
        if warp == 0:
            for i in range(WIDTH - 1):
                xs[i, lane] = xs[m + i, lane]
        cuda.syncthreads()
    if live:
        for t in range(n + warp, T, WARPS):
            out[row0 + t, c] = _ZERO
        if warp == 0 and slot >= 0:
            for i in range(WIDTH - 1):
                state[dst, c, i] = xs[i, lane]


def conv1d(x, weight, state, slots, out, stream, lengths=None, pos=None) -> None:
    """x (R, C) float32, R rows of B sequences (T = R / B each, sequence by sequence); weight
    (C, WIDTH) float32; state (n_slots, C, WIDTH - 1) float32 updated in place at slots (B,) int32
    (-1: a padded sequence) -> out (R, C) (may be x), silu(conv). lengths (B,) int32: the real rows
    of each sequence, the rest padding (None: all T). pos (R,) int32: the rows' positions, each
    sequence's state then a pair of slots read and written by parity (see above)."""
    R, C = x.shape
    B = slots.shape[0]
    for a, name in ((x, "x"), (out, "out")):
        assert a.dtype == np.float32 and a.ndim == 2 and a.is_c_contiguous(), f"{name}: (R, C) float32"
    assert out.shape == (R, C) and weight.shape == (C, WIDTH) and weight.dtype == np.float32
    assert weight.is_c_contiguous() and state.is_c_contiguous()
    assert state.dtype == np.float32 and state.ndim == 3 and state.shape[1:] == (C, WIDTH - 1)
    assert slots.dtype == np.int32 and slots.shape == (B,) and B and R % B == 0, \
        f"{R} rows are not a whole number a sequence of {B}"
    lengths, use_lengths, pos, use_pos = prompt_rows(slots, B, R // B, lengths, pos)
    if R:
        launch(_conv1d_kernel, ((C + CHANNELS - 1) // CHANNELS, B), 32 * WARPS, stream, x, weight, state,
               slots, lengths, use_lengths, pos, use_pos, out)


_F2 = types.float32[:, ::1]
_I1 = types.int32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_conv1d_kernel, (_F2, _F2, types.float32[:, :, ::1], _I1, _I1, types.int32, _I1, types.int32, _F2),
         {"max_registers": 64}),
    ]
