"""The decode graph's last kernel: the sampled token becomes the next step's input on the device.

After it, replaying the graph again runs the following step with no host copy in between, so
the host can queue step n + 1 before it reads token n. Numpy twin: `advance_ref`.
"""

import numpy as np
from numba import cuda, types

from impnb.kernels.common import ptx
from impnb.launch import launch


def advance_ref(out_ids: np.ndarray, ids: np.ndarray, pos: np.ndarray, step: np.ndarray) -> None:
    ids[0] = out_ids[0]
    pos[0] += 1
    step[0] += 1


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


_I1 = types.int32[::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(_advance_kernel, types.void(_I1, _I1, _I1, _I1), {"max_registers": 16})]
