"""Load-time repack of GGUF weight blocks into the split, 16-byte-aligned layout the kernels read.

A (rows, cols) tensor of type t becomes a few *parts*, each a flat array over all rows, so one
chunk of 32 weights reads its quants with 16-byte loads (quant_blocks32.py and quant_blocks_k.py
decode them). Parts live in one buffer at 256-byte-aligned offsets; nothing is converted (but
MXFP4's nibble order within a chunk), so `unpack` rebuilds the GGUF bytes exactly. Layouts (per
row, blocks in order; bytes as in the GGUF block):

  Q8_0  qs int8 (cols)      | d f16 (cols/32)
  Q4_0  qs (cols/2)         | d f16 (cols/32)
  Q4_1  qs (cols/2)         | dm u32 (cols/32): d | m << 16
  Q5_0  qs (cols/2)         | qh u32 (cols/32)         | d f16 (cols/32)
  Q4_K  qs (cols/2)         | hdr 16 B per 256: d, dmin, 12 scale bytes
  Q5_K  qs (cols/2)         | qh (cols/8)              | hdr 16 B per 256
  Q6_K  ql (cols/2)         | qh (cols/4)              | scales int8 (cols/16) | d f16 (cols/256)
  MXFP4 qs (cols/2)         | e u8 (cols/32); qs in NVFP4's nibble order (mxfp4_chunk_order)
  NVFP4 qs (cols/2)         | d u16 (cols/32): the two UE4M3 bytes of a chunk's sub-blocks
  F16   values (u32 pairs)  ;  F32 values (u32 bits)
"""

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

ALIGN = 256

# type -> [(part name, first byte in block, end byte in block, dtype the kernel reads)]
LAYOUTS = {
    T.Q8_0: [("qs", 2, 34, np.uint32), ("d", 0, 2, np.float16)],
    T.Q4_0: [("qs", 2, 18, np.uint32), ("d", 0, 2, np.float16)],
    T.Q4_1: [("qs", 4, 20, np.uint32), ("dm", 0, 4, np.uint32)],
    T.Q5_0: [("qs", 6, 22, np.uint32), ("qh", 2, 6, np.uint32), ("d", 0, 2, np.float16)],
    T.Q4_K: [("qs", 16, 144, np.uint32), ("hdr", 0, 16, np.uint32)],
    T.Q5_K: [("qs", 48, 176, np.uint32), ("qh", 16, 48, np.uint32), ("hdr", 0, 16, np.uint32)],
    T.Q6_K: [("ql", 0, 128, np.uint32), ("qh", 128, 192, np.uint32),
             ("scales", 192, 208, np.int8), ("d", 208, 210, np.float16)],
    T.MXFP4: [("qs", 1, 17, np.uint32), ("e", 0, 1, np.uint8)],
    T.NVFP4: [("qs", 4, 36, np.uint32), ("d", 0, 4, np.uint16)],
    T.F16: [("v", 0, 2, np.uint32)],
    T.F32: [("v", 0, 4, np.uint32)],
}
PACKED_TYPES = tuple(LAYOUTS)
LO4, HI4 = np.uint32(0x0F0F0F0F), np.uint32(0xF0F0F0F0)


# MXFP4's 16 quant bytes a chunk in NVFP4's nibble order: byte b of word 2h + i holds weights
# 16h + 4i + b (low nibble) and 16h + 8 + 4i + b (high), where the file's byte j holds j and
# j + 16; both types then share their decoders (kernels/common/quant_blocks_fp4.py), whose
# dp4a words meet x̂ in one 16-column group each. Words of a chunk: (n, 4) uint32 -> (n, 4).
def mxfp4_chunk_order(w: np.ndarray) -> np.ndarray:
    lo, hi = w[:, 0:2], w[:, 2:4]  # file words 0, 1: weights 0..7 | 16..23; 2, 3: 8..15 | 24..31
    return np.concatenate([(lo & LO4) | ((hi & LO4) << np.uint32(4)),
                           ((lo >> np.uint32(4)) & LO4) | (hi & HI4)], axis=1)


def mxfp4_file_order(w: np.ndarray) -> np.ndarray:
    """mxfp4_chunk_order undone."""
    a, b = w[:, 0:2], w[:, 2:4]
    return np.concatenate([(a & LO4) | ((b & LO4) << np.uint32(4)),
                           ((a >> np.uint32(4)) & LO4) | (b & HI4)], axis=1)


REORDERED = {T.MXFP4: (mxfp4_chunk_order, mxfp4_file_order)}  # type -> its first part's (to, from)


@dataclass(frozen=True)
class PackedWeight:
    """A repacked (rows, cols) weight: `parts` are flat views of `buffer` (host or device)."""

    ggml_type: T
    rows: int
    cols: int
    buffer: object
    parts: tuple

    @property
    def nbytes(self) -> int:
        """Bytes the kernels read: the GGUF size of the tensor."""
        block, size = GGML_QUANT_SIZES[self.ggml_type]
        return self.rows * self.cols // block * size

    def to_device(self, stream=0) -> "PackedWeight":
        """One device allocation holding every part (load time only)."""
        from numba import cuda

        dbuf = cuda.to_device(self.buffer, stream=stream)
        parts = tuple(dbuf[off:off + p.nbytes].view(p.dtype)
                      for off, p in zip(_offsets(self.parts), self.parts))
        return PackedWeight(self.ggml_type, self.rows, self.cols, dbuf, parts)


def rows_aligned(ggml_type: T, cols: int, row: int) -> bool:
    """Whether row `row` of a weight of ggml_type and cols columns starts 16-byte aligned in every
    part (the kernels' vector loads; rows_of)."""
    block = GGML_QUANT_SIZES[ggml_type][0]
    return all(row * (cols // block) * (end - start) % 16 == 0 for _, start, end, _ in LAYOUTS[ggml_type])


def rows_of(w: PackedWeight, start: int, stop: int) -> PackedWeight:
    """Rows start..stop of w, its parts' slices (no copy: a part holds the rows one after another);
    row `start` must be rows_aligned."""
    assert 0 <= start < stop <= w.rows and rows_aligned(w.ggml_type, w.cols, start), (start, stop, w.rows)
    parts = tuple(p[start * (p.shape[0] // w.rows):stop * (p.shape[0] // w.rows)] for p in w.parts)
    return PackedWeight(w.ggml_type, stop - start, w.cols, w.buffer, parts)


def _offsets(parts):
    offs, pos = [], 0
    for p in parts:
        offs.append(pos)
        pos += -(-p.nbytes // ALIGN) * ALIGN
    return offs


def blocks_of(data: np.ndarray, ggml_type: T):
    """Raw tensor bytes -> (rows, cols, (n_blocks, type_size) uint8 view)."""
    block, size = GGML_QUANT_SIZES[ggml_type]
    raw = np.ascontiguousarray(data).view(np.uint8)
    raw = raw.reshape(-1, raw.shape[-1])
    rows, row_bytes = raw.shape
    if row_bytes % size:
        raise ValueError(f"{ggml_type.name}: row of {row_bytes} bytes is not whole blocks")
    cols = row_bytes // size * block
    if cols % 32:
        raise ValueError(f"{ggml_type.name}: {cols} columns is not a multiple of 32")
    return rows, cols, raw.reshape(-1, size)


def repack(data: np.ndarray, ggml_type: T) -> PackedWeight:
    """GGUF tensor bytes (rows, row_bytes), or an F16/F32 array (rows, cols) -> PackedWeight."""
    ggml_type = T(ggml_type)
    if ggml_type not in LAYOUTS:
        raise ValueError(f"no packed layout for {ggml_type.name}")
    rows, cols, blocks = blocks_of(data, ggml_type)
    n_blocks = blocks.shape[0]
    offsets, total = part_offsets(ggml_type, n_blocks)
    buffer = np.zeros(total, np.uint8)
    parts = []
    for (_, start, end, dtype), off in zip(LAYOUTS[ggml_type], offsets):
        section = buffer[off:off + n_blocks * (end - start)]
        section.reshape(n_blocks, end - start)[:] = blocks[:, start:end]
        parts.append(section.view(dtype))
    if ggml_type in REORDERED:
        words = parts[0].reshape(-1, 4)
        words[:] = REORDERED[ggml_type][0](words)
    return PackedWeight(ggml_type, rows, cols, buffer, tuple(parts))


def part_offsets(ggml_type: T, n_blocks: int) -> tuple[list[int], int]:
    """Each part's byte offset in the buffer of n_blocks blocks of ggml_type, and the buffer's size."""
    offsets, pos = [], 0
    for _, start, end, _ in LAYOUTS[ggml_type]:
        offsets.append(pos)
        pos += -(-n_blocks * (end - start) // ALIGN) * ALIGN
    return offsets, max(pos, ALIGN)


def unpack(packed: PackedWeight) -> np.ndarray:
    """The GGUF bytes (rows, row_bytes) uint8 back from a host PackedWeight."""
    block, size = GGML_QUANT_SIZES[packed.ggml_type]
    n_blocks = packed.rows * packed.cols // block
    out = np.empty((n_blocks, size), np.uint8)
    for i, ((_, start, end, _), part) in enumerate(zip(LAYOUTS[packed.ggml_type], packed.parts)):
        part = np.asarray(part)
        if i == 0 and packed.ggml_type in REORDERED:
            part = REORDERED[packed.ggml_type][1](part.reshape(-1, 4))
        out[:, start:end] = part.view(np.uint8).reshape(n_blocks, end - start)
    return out.reshape(packed.rows, -1)
