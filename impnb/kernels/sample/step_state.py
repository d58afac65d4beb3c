"""The decode graph's last kernel: the sampled token becomes the next step's input on the device.

After it, replaying the graph again runs the following step with no host copy in between, so
the host can queue step n + 1 before it reads token n. One sequence: `advance`; the batched
engine's B rows: `advance_rows` (its padding rows, step counter -1, stay as staged). Numpy
twins: `advance_ref`, `advance_rows_ref`.
"""

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.launch import launch


def advance_ref(out_ids: np.ndarray, ids: np.ndarray, pos: np.ndarray, step: np.ndarray) -> None:
    ids[0] = out_ids[0]
    pos[0] += 1
    step[0] += 1


def advance_rows_ref(outs: np.ndarray, ids: np.ndarray, pos: np.ndarray, steps: np.ndarray) -> None:
    live = np.flatnonzero(steps[:len(outs)] >= 0)
    ids[live] = outs[live]
    pos[live] += 1
    steps[live] += 1


@cuda.jit
def _advance_kernel(out_ids, ids, pos, step):
    """grid 1, block 1: ids[0] = out_ids[0]; pos[0] += 1; step[0] += 1."""
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    ids[0] = out_ids[0]
    pos[0] += 1
    step[0] += 1


def advance(out_ids, ids, pos, step, stream) -> None:
    """One sequence: its next input id, position and sampler step, all int32 on the device."""
    for a in (out_ids, ids, pos, step):
        assert a.dtype == np.int32 and a.ndim == 1 and a.shape[0] >= 1
    launch(_advance_kernel, 1, 1, stream, out_ids, ids, pos, step)


@cuda.jit
def _advance_rows_kernel(outs, ids, pos, steps):
    """grid 1, block ROWS_BLOCK: thread b < len(outs) of a live row (steps[b] >= 0; a padding
    row's is -1): ids[b] = outs[b]; pos[b] += 1; steps[b] += 1."""
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    b = cuda.threadIdx.x
    if b < outs.shape[0] and steps[b] >= 0:
        ids[b] = outs[b]
        pos[b] += 1
        steps[b] += 1


ROWS_BLOCK = 256  # rows advance_rows takes at most (the batched engine's largest bucket)


def advance_rows(outs, ids, pos, steps, stream) -> None:
    """A batched step's rows (int32 on the device, steps -1 on padding rows, which stay as
    staged): each live row's next input id, position and sampler step."""
    for a in (outs, ids, pos, steps):
        assert a.dtype == np.int32 and a.ndim == 1 and a.shape[0] == outs.shape[0]
    assert outs.shape[0] <= ROWS_BLOCK
    launch(_advance_rows_kernel, 1, ROWS_BLOCK, stream, outs, ids, pos, steps)


_I1 = types.int32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(_advance_kernel, types.void(_I1, _I1, _I1, _I1), {"max_registers": 16}),
            (_advance_rows_kernel, types.void(_I1, _I1, _I1, _I1), {"max_registers": 16})]
