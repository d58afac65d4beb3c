"""The padded tile layout of the MoE prefill's cuBLAS fallback: routed token rows gathered per
tile, and the pointer arrays of one cublasGemmBatchedEx written on the device; numpy references
beside each (gather_ref, pointers_ref).

Tile i of moe.moe_group's tiles (e, r0, n) owns padded rows i * BM .. i * BM + BM - 1 of every
buffer: its n grouped rows r0 .. r0 + n - 1 first, then zeros. A batched GEMM then runs a fixed
max_tiles entries of BM rows each, so its shape never depends on the routing.
Legend: T tokens, K row width, k experts per token, S = T * k slots, P = max_tiles * BM padded rows.
"""

import numpy as np
from numba import cuda, int32, int64, uint64

from impnb.kernels.common import ptx
from impnb.kernels.moe.gemm_grouped import BM
from impnb.launch import launch

GATHER_THREADS = 256
POINTER_THREADS = 128
ZERO = np.uint64(0)


def gather_ref(x: np.ndarray, order: np.ndarray, tiles: np.ndarray, k: int):
    """x (T, K) rows of the tiles (n_tiles, 3) -> (xg (n_tiles * BM, K), tiles_pad (n_tiles, 3),
    slot_row (S,)): xg row i * BM + j = x[order[r0 + j] // k] for j < n, else 0; tiles_pad[i] =
    (e, i * BM, n); slot_row[order[r0 + j]] = i * BM + j."""
    xg = np.zeros((len(tiles) * BM, x.shape[1]), x.dtype)
    tiles_pad = np.array([(e, i * BM, n) for i, (e, _, n) in enumerate(tiles)], np.int32).reshape(-1, 3)
    slot_row = np.full(order.shape, -1, np.int32)
    for i, (_, r0, n) in enumerate(tiles):
        slots = order[r0:r0 + n]
        xg[i * BM:i * BM + n] = x[slots // k]
        slot_row[slots] = i * BM + np.arange(n)
    return xg, tiles_pad, slot_row


def pointers_ref(experts: np.ndarray, n_max: int, w: int, w_step: int, a: int, a_step: int,
                 c: int, c_step: int, a_scratch: int, c_scratch: int) -> np.ndarray:
    """(3, n_max) int64 batch entries (weight, activation, output) for tiles of these experts
    (n_tiles,): tile i -> (w + e * w_step, a + i * a_step, c + i * c_step); entries past
    n_tiles -> (w, a_scratch, c_scratch)."""
    ptrs = np.empty((3, n_max), np.int64)
    ptrs[:] = np.array([w, a_scratch, c_scratch], np.int64)[:, None]
    i = np.arange(len(experts), dtype=np.int64)
    ptrs[:, :len(experts)] = [w + experts.astype(np.int64) * w_step, a + i * a_step, c + i * c_step]
    return ptrs


# grid (max_tiles,), block 256: block i owns padded rows i * BM .. i * BM + BM - 1 of xg (if
# i < n_tiles), x and xg viewed as uint64 words (4 fp16 each); per row, thread j copies words j,
# j + 256, ... of the row's token (zeros past the tile's n rows). Thread j < n also writes slot_row
# of its row's slot, thread 0 the padded tile.
@cuda.jit
def _gather_kernel(x, order, tiles, n_tiles, k, xg, tiles_pad, slot_row):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    i = cuda.blockIdx.x
    if i >= n_tiles[0]:
        return
    tid = cuda.threadIdx.x
    r0 = tiles[i, 1]
    n = tiles[i, 2]
    p0 = i * BM
    if tid < n:
        slot_row[order[r0 + tid]] = p0 + tid
    if tid == 0:
        tiles_pad[i, 0] = tiles[i, 0]
        tiles_pad[i, 1] = p0
        tiles_pad[i, 2] = n
    W = xg.shape[1]
    for j in range(BM):
        if j < n:
            src = order[r0 + j] // k
            for c in range(tid, W, GATHER_THREADS):
                xg[p0 + j, c] = x[src, c]
        else:
            for c in range(tid, W, GATHER_THREADS):
                xg[p0 + j, c] = ZERO


def moe_gather(x, order, tiles, n_tiles, k: int, xg, tiles_pad, slot_row, stream) -> None:
    """xg (P, K) fp16, tiles_pad (max_tiles, 3), slot_row (S,) int32 as gather_ref, for the
    tiles, n_tiles, order (S,) that moe.moe_group wrote over x (T, K) fp16's k slots per token.
    Rows of tiles past n_tiles are left as they were."""
    n_max, K = tiles.shape[0], x.shape[1]
    assert x.dtype == xg.dtype == np.float16 and xg.shape == (n_max * BM, K) and K % 4 == 0
    assert tiles_pad.shape == tiles.shape and slot_row.shape == order.shape
    for a in (x, xg, order, tiles, n_tiles, tiles_pad, slot_row):
        assert a.is_c_contiguous()
    launch(_gather_kernel, n_max, GATHER_THREADS, stream, x.view(np.uint64), order, tiles, n_tiles,
           np.int32(k), xg.view(np.uint64), tiles_pad, slot_row)


# grid (ceil(max_tiles / 128),), block 128: thread i writes batch entry i of the three pointer
# rows (weight, activation, output): tile i's expert weight and its padded rows, or past n_tiles
# the scratch tile (expert 0's weight, a zero activation tile, a scratch output tile).
@cuda.jit
def _pointers_kernel(tiles, n_tiles, w, w_step, a, a_step, c, c_step, a_scratch, c_scratch, ptrs):
    ptx.grid_dep_wait()  # programmatic launch: the previous kernel has finished
    ptx.grid_dep_launch()
    i = cuda.grid(1)
    if i >= ptrs.shape[1]:
        return
    if i < n_tiles[0]:
        ptrs[0, i] = w + tiles[i, 0] * w_step
        ptrs[1, i] = a + i * a_step
        ptrs[2, i] = c + i * c_step
    else:
        ptrs[0, i] = w
        ptrs[1, i] = a_scratch
        ptrs[2, i] = c_scratch


def batch_bases(w16, a, c, a_scratch, c_scratch) -> tuple:
    """The bases and steps pointers_ref takes, in bytes: expert e of w16 (E * N, K) fp16, tile i's
    BM rows of a (P, K) and c (P, N), then the scratch tiles a_scratch (BM, K), c_scratch (BM, N)."""
    (P, K), N = a.shape, c.shape[1]
    assert P % BM == 0 and c.shape[0] == P and w16.shape[1] == K and w16.shape[0] % N == 0
    assert a_scratch.shape == (BM, K) and c_scratch.shape == (BM, N) and a_scratch.dtype == a.dtype
    for x in (w16, a, c, a_scratch, c_scratch):
        assert x.is_c_contiguous()
    return (_addr(w16), N * K * w16.dtype.itemsize, _addr(a), BM * K * a.dtype.itemsize,
            _addr(c), BM * N * c.dtype.itemsize, _addr(a_scratch), _addr(c_scratch))


def moe_pointers(tiles, n_tiles, bases: tuple, ptrs, stream) -> None:
    """ptrs (3, max_tiles) int64 = the device addresses (weight, activation, output) of each batch
    entry, pointers_ref of the tiles' experts with bases = (w, w_step, a, a_step, c, c_step,
    a_scratch, c_scratch) (batch_bases)."""
    n_max = tiles.shape[0]
    assert ptrs.shape == (3, n_max) and ptrs.dtype == np.int64 and ptrs.is_c_contiguous()
    launch(_pointers_kernel, -(-n_max // POINTER_THREADS), POINTER_THREADS, stream, tiles, n_tiles,
           *(np.int64(b) for b in bases), ptrs)


def _addr(array) -> int:
    return array.device_ctypes_pointer.value


_I32_1D = int32[::1]
_I32_2D = int32[:, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_gather_kernel, (uint64[:, ::1], _I32_1D, _I32_2D, _I32_1D, int32, uint64[:, ::1], _I32_2D, _I32_1D),
         {"max_registers": 64}),
        (_pointers_kernel, (_I32_2D, _I32_1D) + (int64,) * 8 + (int64[:, ::1],), {"max_registers": 32}),
    ]
