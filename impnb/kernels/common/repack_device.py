"""repack.py's layout made on the GPU: a tensor's GGUF bytes are copied to the device as they are
(straight from the mmap where no type change or stacking is needed) and split into the kernels'
parts there (MXFP4's quants then reordered in place), so the load does no strided host copies and
allocates no host buffer of the weight's size. Numpy reference: repack.repack (tests compare the
two byte for byte, padding included).
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda
from numba.core import types

from impnb.kernels.common.repack import HI4, LAYOUTS, LO4, PackedWeight, blocks_of, part_offsets
from impnb.kernels.common.warp import SIMULATOR
from impnb.launch import launch

THREADS = 256


# grid ceil(n_blocks * width / THREADS), block THREADS: thread i writes byte i of one part,
# byte start + i % width of GGUF block i // width
@cuda.jit
def _split_blocks_kernel(src, dst, n_blocks, block_bytes, start, width, dst_offset):
    i = cuda.grid(1)
    if i < n_blocks * width:
        b = i // width
        dst[dst_offset + i] = src[b * block_bytes + start + (i - b * width)]


def split_blocks(src, dst, n_blocks: int, block_bytes: int, start: int, width: int, dst_offset: int,
                 stream) -> None:
    """dst[dst_offset + b * width + j] = src[b * block_bytes + start + j] for every block b < n_blocks
    and j < width: one part of repack's layout from GGUF blocks on the device."""
    assert src.dtype == dst.dtype == np.uint8 and src.ndim == dst.ndim == 1
    assert 0 <= start and start + width <= block_bytes and src.size >= n_blocks * block_bytes
    assert dst.size >= dst_offset + n_blocks * width
    n = n_blocks * width
    if n == 0:
        return
    launch(_split_blocks_kernel, (n + THREADS - 1) // THREADS, THREADS, stream, src, dst, np.int64(n_blocks),
           np.int64(block_bytes), np.int64(start), np.int64(width), np.int64(dst_offset))


# grid ceil(n_chunks / THREADS), block THREADS: thread i reorders chunk i's four quant words in
# place, as repack.mxfp4_chunk_order
@cuda.jit
def _mxfp4_order_kernel(qs, n_chunks):
    i = cuda.grid(1)
    if i < n_chunks:
        lo0, lo1, hi0, hi1 = qs[4 * i], qs[4 * i + 1], qs[4 * i + 2], qs[4 * i + 3]
        qs[4 * i] = (lo0 & LO4) | ((hi0 & LO4) << 4)
        qs[4 * i + 1] = (lo1 & LO4) | ((hi1 & LO4) << 4)
        qs[4 * i + 2] = ((lo0 >> 4) & LO4) | (hi0 & HI4)
        qs[4 * i + 3] = ((lo1 >> 4) & LO4) | (hi1 & HI4)


def repack_on_device(data: np.ndarray, ggml_type: T, stream) -> PackedWeight:
    """repack.repack(data, ggml_type).to_device(stream), with the split made on the device: the
    GGUF bytes (rows, row_bytes) are copied once, the parts written by split_blocks, the padding
    between parts zeroed."""
    ggml_type = T(ggml_type)
    rows, cols, blocks = blocks_of(data, ggml_type)
    n_blocks, block_bytes = blocks.shape
    offsets, total = part_offsets(ggml_type, n_blocks)
    src = cuda.to_device(blocks.reshape(-1), stream=stream)
    dst = _zeros(total, stream)
    parts = []
    for (_, start, end, dtype), off in zip(LAYOUTS[ggml_type], offsets):
        split_blocks(src, dst, n_blocks, block_bytes, start, end - start, off, stream)
        parts.append(dst[off:off + n_blocks * (end - start)].view(dtype))
    if ggml_type == T.MXFP4 and n_blocks:
        launch(_mxfp4_order_kernel, (n_blocks + THREADS - 1) // THREADS, THREADS, stream, parts[0], np.int64(n_blocks))
    stream.synchronize()  # src is freed on return: no split may still be reading it
    return PackedWeight(ggml_type, rows, cols, dst, tuple(parts))


def _zeros(n: int, stream):
    """n zero bytes on the device, set there (the simulator's arrays are host arrays)."""
    if SIMULATOR:
        return cuda.to_device(np.zeros(n, np.uint8), stream=stream)
    dst = cuda.device_array(n, np.uint8, stream=stream)
    cuda.driver.device_memset(dst, 0, n, stream=stream)
    return dst


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    u8 = types.Array(types.uint8, 1, "C")
    return [(_split_blocks_kernel, types.void(u8, u8, *[types.int64] * 5), {"max_registers": 32}),
            (_mxfp4_order_kernel, types.void(types.Array(types.uint32, 1, "C"), types.int64), {"max_registers": 32})]
