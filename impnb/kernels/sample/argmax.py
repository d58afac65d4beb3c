"""Greedy decoding on the GPU: the argmax of each logits row, ties to the lowest id, one kernel.

Blocks of a row each reduce CHUNK logits to a composite key << 31 | (2^31 - 1 - id) (larger
composite: larger logit, then lower id) and fold it into best[b] with an atomic max; the row's
last block to finish (a counter) writes the id and resets best and the counter for the next
launch, so a captured graph replays it as is. Numpy twin: np.argmax.
"""

from dataclasses import dataclass

import numpy as np
from numba import cuda, int64, types

from impnb.kernels.common import ptx
from impnb.kernels.sample.sample_select import SIMULATOR, comp_id, sort_key
from impnb.launch import launch

NT = 32 if SIMULATOR else 256       # threads per block
CHUNK = 64 if SIMULATOR else 4096   # logits per block


@dataclass(frozen=True)
class ArgmaxScratch:
    best: object   # (B,) int64: running best composite per row, -1 between launches
    done: object   # (B,) int32: blocks of the row finished, 0 between launches


def argmax_scratch(B: int) -> ArgmaxScratch:
    return ArgmaxScratch(cuda.to_device(np.full(B, -1, np.int64)), cuda.to_device(np.zeros(B, np.int32)))


@cuda.jit
def _argmax_kernel(bits, best, done, out):
    """grid (ceil(V / CHUNK), B), block NT; bits: the logits' int32 bits.
    shared: red int64[NT] (a tree reduction of the block's composites), last i32[1]."""
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    c = cuda.blockIdx.x
    b = cuda.blockIdx.y
    t = cuda.threadIdx.x
    V = bits.shape[1]
    red = cuda.shared.array(NT, int64)
    last = cuda.shared.array(1, types.int32)
    mine = int64(-1)
    for i in range(c * CHUNK + t, min(V, (c + 1) * CHUNK), NT):
        comp = (sort_key(bits[b, i]) << 31) | (0x7FFFFFFF - i)
        if comp > mine:
            mine = comp
    red[t] = mine
    cuda.syncthreads()
    h = NT // 2
    while h > 0:
        if t < h and red[t + h] > red[t]:
            red[t] = red[t + h]
        cuda.syncthreads()
        h //= 2
    if t == 0:
        cuda.atomic.max(best, b, red[0])
        cuda.threadfence()
        last[0] = cuda.atomic.add(done, b, 1) == cuda.gridDim.x - 1
    cuda.syncthreads()
    if last[0] and t == 0:  # every block's max is in best[b]
        cuda.threadfence()
        comp = cuda.atomic.max(best, b, int64(-1))
        out[b] = comp_id(comp)
        best[b] = -1
        done[b] = 0


def argmax(logits, out_ids, scratch: ArgmaxScratch, stream):
    """out_ids (B,) int32 = argmax of each row of logits (B, V) float32, ties to the lowest id."""
    assert logits.ndim == 2 and logits.dtype == np.float32 and logits.is_c_contiguous()
    B, V = logits.shape
    assert out_ids.dtype == np.int32 and out_ids.shape == (B,)
    assert scratch.best.shape[0] >= B and V < 2**31
    grid = (-(-V // CHUNK), B)
    launch(_argmax_kernel, grid, NT, stream, logits.view(np.int32), scratch.best, scratch.done,
           out_ids)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [(_argmax_kernel, types.void(types.int32[:, ::1], types.int64[::1],
                                                    types.int32[::1], types.int32[::1]),
                         {"max_registers": 40})]
