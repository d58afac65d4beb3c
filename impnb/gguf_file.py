"""Open a GGUF file memory-mapped, validating every count, length, offset and size first.

The header is parsed here in one bounds-checked pass with the `gguf` package's value and
tensor types (its `GGUFReader` builds a numpy view per string and takes 9 s on Gemma3's
262k-token vocabulary; tests check this parser against it). A truncated or hostile file
fails with a GGUFError, never a huge allocation or a traceback. Tensors stay in the mmap.
"""

import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from impnb.errors import GGUFError, UnsupportedError
from impnb.gguf_strings import MAX_STRING, read_strings
from impnb.quants import QuantFormat, TypeId, dequantize, quant_format

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4
MAX_DIM = 1 << 40

# Metadata value types (gguf's GGUFValueType ids): the fixed-size ones' struct formats.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Tensor:
    """One tensor: `shape` in numpy order (rows, cols), `data` the raw bytes in the mmap."""

    name: str
    fmt: QuantFormat
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def ggml_type(self):
        """gguf's GGMLQuantizationType member."""
        return self.fmt.ggml_type

    def dequantize(self) -> np.ndarray:
        """float32 values of shape `shape` (numpy reference)."""
        return dequantize(self.data, self.ggml_type).reshape(self.shape)


class HeaderWalker:
    """Bounds-checked little-endian reads over the header bytes."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = memoryview(buf), size, 0

    def take(self, n: int) -> int:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"truncated header: needs {n} bytes at offset {self.pos}, "
                            f"file has {self.size}")
        start = self.pos
        self.pos += n
        return start

    def scalar(self, fmt: str):
        n = struct.calcsize("<" + fmt)
        return struct.unpack_from("<" + fmt, self.buf, self.take(n))[0]

    def string(self) -> str:
        n = self.scalar("Q")
        if n > MAX_STRING:
            raise GGUFError(f"string of {n} bytes at offset {self.pos}")
        start = self.take(n)
        try:
            return str(self.buf[start:start + n], "utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"string at offset {start} is not UTF-8") from None

    def strings(self, count: int) -> list[str]:
        """`count` strings (gguf_strings.read_strings: numpy over the bytes, checked as strictly)."""
        out, self.pos = read_strings(self.buf, self.pos, self.size, count)
        return out

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise GGUFError(f"metadata value type {vtype} is not valid")
        etype, count = self.scalar("I"), self.scalar("Q")
        if etype in _SCALARS:
            fmt = "<" + _SCALARS[etype]
            start = self.take(count * struct.calcsize(fmt))
            return np.frombuffer(self.buf, np.dtype(fmt), count, start).tolist()
        if etype == _STRING:
            return self.strings(count)
        raise GGUFError(f"array element type {etype} is not valid")


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length
    fmt: QuantFormat
    offset: int  # from the start of the data section


def _parse_header(buf, size: int):
    """Magic, version, key/values and tensor infos -> (metadata, infos, data_start)."""
    w = HeaderWalker(buf, size)
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise GGUFError(f"not a GGUF file (magic {bytes(buf[:4])!r})")
    w.pos = 4
    version = w.scalar("I")
    if version not in (2, 3):
        raise GGUFError(f"GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = w.scalar("Q"), w.scalar("Q")
    # A key/value takes at least 13 bytes and a tensor info at least 29.
    if n_kv * 13 + n_tensors * 29 > size:
        raise GGUFError(f"header claims {n_tensors} tensors and {n_kv} keys, "
                        f"more than {size} bytes can hold")
    metadata = {}
    for _ in range(n_kv):
        key = w.string()
        if key in metadata:
            raise GGUFError(f"metadata key {key} appears twice")
        metadata[key] = w.value(w.scalar("I"))
    infos = []
    for _ in range(n_tensors):
        name = w.string()
        n_dims = w.scalar("I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"tensor {name} has {n_dims} dimensions")
        dims = tuple(w.scalar("Q") for _ in range(n_dims))
        if any(d < 1 or d > MAX_DIM for d in dims):
            raise GGUFError(f"tensor {name} has dimensions {list(dims)}")
        fmt = quant_format(w.scalar("I"), name)
        infos.append(_TensorInfo(name, dims, fmt, w.scalar("Q")))
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or align < 1 or align & (align - 1):
        raise GGUFError(f"general.alignment {align!r} is not a power of two")
    for info in infos:
        if info.offset % align:
            raise GGUFError(f"tensor {info.name} data offset {info.offset} is not aligned to {align}")
    return metadata, infos, -(-w.pos // align) * align


class ModelFile:
    """A validated GGUF: metadata as Python values and tensors by GGUF name."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GGUFError(f"{self.path}: no such file")
        size = os.path.getsize(self.path)
        if size == 0:
            raise GGUFError(f"{self.path}: empty file")
        self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        try:
            self.metadata, infos, data_start = _parse_header(self._mmap, size)
        except GGUFError as e:
            raise GGUFError(f"{self.path}: {e}") from None
        try:
            check_layout(infos, data_start, size, self.metadata.get("general.alignment", 32))
        except GGUFError as e:
            raise GGUFError(f"{self.path}: {e}") from None
        self.tensors = self._tensors(infos, data_start, size)
        self.arch = self.metadata.get("general.architecture")
        if not isinstance(self.arch, str):
            raise GGUFError(f"{self.path}: general.architecture is missing")
        self.checks_passed: set[str] = set()  # models/validate.py's checks this file passed (run once)

    def _tensors(self, infos, data_start: int, size: int) -> dict[str, Tensor]:
        out = {}
        for info in infos:
            fmt, shape = info.fmt, tuple(reversed(info.dims))
            if shape[-1] % fmt.block_size:
                raise GGUFError(f"{self.path}: tensor {info.name} row of {shape[-1]} is not a "
                                f"multiple of the {fmt.name} block ({fmt.block_size})")
            row_bytes = fmt.row_bytes(shape[-1])
            n_rows = math.prod(shape[:-1])  # Python ints: four 2**40 dims must not wrap
            start = data_start + info.offset
            if start + n_rows * row_bytes > size:
                raise GGUFError(f"{self.path}: tensor {info.name} ({n_rows * row_bytes} bytes at "
                                f"offset {start}) lies past the end of the file ({size} bytes)")
            if info.name in out:
                raise GGUFError(f"{self.path}: tensor {info.name} appears twice")
            raw = self._mmap[start:start + n_rows * row_bytes].reshape(*shape[:-1], row_bytes)
            out[info.name] = Tensor(info.name, fmt, shape, _typed(raw, fmt))
        return out

    def get(self, key: str, default=None):
        """Metadata value by full key."""
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default=None):
        """Metadata value under the architecture's prefix, e.g. `block_count`."""
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    def require(self, suffix: str):
        """Architecture metadata that must be present."""
        key = f"{self.arch}.{suffix}"
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata {key} is missing")
        return self.metadata[key]

    def tensor(self, name: str) -> Tensor:
        """Tensor by GGUF name (`blk.0.attn_q` or `blk.0.attn_q.weight`); GGUFError if absent."""
        for key in (name + ".weight", name):
            if key in self.tensors:
                return self.tensors[key]
        raise GGUFError(f"{self.path}: tensor {name} is missing")

    def has(self, name: str) -> bool:
        return name + ".weight" in self.tensors or name in self.tensors

    def n_params(self) -> int:
        return sum(int(np.prod(t.shape)) for t in self.tensors.values())


def tensor_nbytes(info: _TensorInfo) -> int:
    """Bytes a tensor's type and shape take (Python ints: four large dims must not wrap)."""
    return math.prod(info.dims[1:]) * info.fmt.row_bytes(info.dims[0])


def check_layout(infos, data_start: int, size: int, align: int) -> None:
    """Tensor data packed as GGUF writers lay it out: in the data section, each tensor where the
    one before it ends (rounded up to the alignment), none overlapping, the last inside the file
    and the file ending with it.

    A gap or an overlap means an offset, a type or a shape was changed: bytes read as a tensor
    that were written as something else.
    """
    for info in infos:
        if info.dims[0] % info.fmt.block_size:
            raise GGUFError(f"tensor {info.name} row of {info.dims[0]} is not a multiple of the "
                            f"{info.fmt.name} block ({info.fmt.block_size})")
    expected, before = 0, None
    for info in sorted(infos, key=lambda i: i.offset):
        nbytes = tensor_nbytes(info)
        end = data_start + info.offset + nbytes
        if end > size:
            raise GGUFError(f"tensor {info.name} ({nbytes} bytes at offset "
                            f"{data_start + info.offset}) lies past the end of the file ({size} bytes)")
        if info.offset != expected:
            where = (f"the tensor before it ({before.name}) ends at {expected}" if before
                     else "the data section starts at 0")
            raise GGUFError(f"tensor {info.name} data starts at offset {info.offset}; {where} "
                            f"(overlapping or unaccounted bytes)")
        expected, before = -(-(info.offset + nbytes) // align) * align, info
    if infos and size > data_start + expected:
        raise GGUFError(f"{size - data_start - expected} bytes follow the last tensor's data "
                        f"({before.name}, ending at offset {data_start + expected})")


_PLAIN_DTYPES = {TypeId.F32: np.float32, TypeId.F16: np.float16}


def _typed(raw: np.ndarray, fmt: QuantFormat) -> np.ndarray:
    """F32/F16 rows viewed as their dtype (as GGUFReader gives them); blocks stay uint8."""
    dtype = _PLAIN_DTYPES.get(fmt.type_id)
    return raw if dtype is None else raw.view(dtype)


def open_model_file(path) -> ModelFile:
    """Open and validate a GGUF; raise GGUFError or UnsupportedError."""
    try:
        return ModelFile(path)
    except (GGUFError, UnsupportedError):
        raise
    except (OSError, ValueError) as e:
        raise GGUFError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
