"""Routed slots made local to a rank that holds experts [e0, e0 + n_local) (expert parallelism):
a slot routed to one of them takes its local index, any other slot local expert 0 with weight 0,
so the experts' kernels run unchanged on the rank's stacked experts and the slots of other ranks'
experts add nothing (their sum over the ranks, the all-reduce, is the whole layer's).

Legend: T tokens, k experts per token, S = T * k slots.
"""

import numpy as np
from numba import cuda, float32, int32

from impnb.launch import launch

THREADS = 256


def localize_ref(experts: np.ndarray, weights: np.ndarray, e0: int, n_local: int) -> tuple[np.ndarray, np.ndarray]:
    """(experts, weights) (T, k) -> the rank's local (experts, weights)."""
    mine = (experts >= e0) & (experts < e0 + n_local)
    return (np.where(mine, experts - e0, 0).astype(np.int32),
            np.where(mine, weights, np.float32(0)).astype(np.float32))


# grid (1,), block THREADS: thread i owns slots i, i + THREADS, ... (S is at most a prompt
# chunk's T * k); in place.
@cuda.jit
def _localize_kernel(experts, weights, e0, n_local):
    S = experts.shape[0]
    for s in range(cuda.threadIdx.x, S, THREADS):
        e = experts[s] - e0
        if e >= 0 and e < n_local:
            experts[s] = e
        else:
            experts[s] = 0
            weights[s] = float32(0)


def localize(experts, weights, e0: int, n_local: int, stream) -> None:
    """experts (T, k) int32, weights (T, k) float32, in place: localize_ref's."""
    assert experts.shape == weights.shape and experts.dtype == np.int32 and weights.dtype == np.float32
    assert experts.is_c_contiguous() and weights.is_c_contiguous() and 0 < n_local
    S = experts.shape[0] * experts.shape[1]
    launch(_localize_kernel, 1, THREADS, stream, experts.reshape(S), weights.reshape(S),
           np.int32(e0), np.int32(n_local))


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_localize_kernel, (int32[::1], float32[::1], int32, int32), {"max_registers": 32}),
    ]
