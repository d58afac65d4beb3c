"""Mutations of a GGUF, each with the outcome impnb owes it: must fail, must pass, or either.

A file is parsed once into its key/values (raw bytes kept), tensor infos and data section;
a mutation edits those pieces and `Mutant.write` lays the file out again (the data section is
copied from the source with byte patches, so a 250 MB model costs one copy). Each mutation
says, per command, what impnb must do: FAIL (exit 2, one line), PASS (exit 0: the bytes it
touched are unused) or ANY (exit 0 or 2: the file stays valid and no reader could tell, e.g.
a flipped weight bit).
"""

import math
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFValueType as V

from impnb.gguf_file import HeaderWalker
from impnb.quants import FORMATS

FAIL, PASS, ANY = "fail", "pass", "any"
HUGE = (2**32 - 1, 2**63, 2**64 - 1)
# Byte offset of the f16 scale d inside one block, for the types whose blocks have one.
SCALE_OFFSET = {T.Q4_0: 0, T.Q4_1: 0, T.Q5_0: 0, T.Q5_1: 0, T.Q8_0: 0, T.Q4_K: 0, T.Q5_K: 0,
                T.Q2_K: 80, T.Q3_K: 108, T.Q6_K: 208}


def _u32(v): return struct.pack("<I", v)
def _u64(v): return struct.pack("<Q", v)
def _str(s: str) -> bytes: return _u64(len(s.encode())) + s.encode()


@dataclass(frozen=True)
class KV:
    key: str
    vtype: int
    raw: bytes  # the encoded value, after its type id
    value: object


@dataclass(frozen=True)
class Info:
    name: str
    dims: tuple[int, ...]  # GGUF order
    type_id: int
    offset: int

    def raw(self) -> bytes:
        return (_str(self.name) + _u32(len(self.dims)) + b"".join(_u64(d) for d in self.dims)
                + _u32(self.type_id) + _u64(self.offset))

    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[T(self.type_id)]
        return math.prod(self.dims[1:]) * self.dims[0] // block * size


@dataclass
class Mutant:
    """A source file's pieces, edited: write() lays them out as a GGUF."""

    source: Path
    kvs: list
    infos: list
    data_start: int
    data_size: int
    align: int
    n_kv: int | None = None        # header counts that differ from the lists (huge counts)
    n_tensors: int | None = None
    patches: list = field(default_factory=list)  # (offset in the data section, bytes)
    truncate: int | None = None    # final file length
    tail: bytes = b""              # bytes appended after the data section
    header_patch: tuple | None = None  # (offset, bytes) into the laid-out header

    def header(self) -> bytes:
        h = (b"GGUF" + _u32(3) + _u64(len(self.infos) if self.n_tensors is None else self.n_tensors)
             + _u64(len(self.kvs) if self.n_kv is None else self.n_kv)
             + b"".join(_str(kv.key) + _u32(kv.vtype) + kv.raw for kv in self.kvs)
             + b"".join(i.raw() for i in self.infos))
        h += bytes(-len(h) % self.align)
        if self.header_patch:
            at, b = self.header_patch
            h = h[:at] + b + h[at + len(b):]
        return h

    def write(self, path) -> Path:
        path = Path(path)
        with open(self.source, "rb") as src, open(path, "wb") as out:
            out.write(self.header())
            src.seek(self.data_start)
            data = bytearray(src.read(self.data_size))
            for at, b in self.patches:
                data[at:at + len(b)] = b
            out.write(data)
            out.write(self.tail)
        if self.truncate is not None:
            with open(path, "r+b") as f:
                f.truncate(self.truncate)
        return path


def parse(path) -> Mutant:
    """A GGUF's pieces (it must be one impnb opens)."""
    path = Path(path)
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    w = HeaderWalker(buf, buf.size)
    w.pos = 8
    n_tensors, n_kv = w.scalar("Q"), w.scalar("Q")
    kvs = []
    for _ in range(n_kv):
        key, vtype = w.string(), w.scalar("I")
        start = w.pos
        value = w.value(vtype)
        kvs.append(KV(key, vtype, bytes(buf[start:w.pos]), value))
    infos = []
    for _ in range(n_tensors):
        name = w.string()
        dims = tuple(w.scalar("Q") for _ in range(w.scalar("I")))
        infos.append(Info(name, dims, w.scalar("I"), w.scalar("Q")))
    align = next((kv.value for kv in kvs if kv.key == "general.alignment"), 32)
    data_start = -(-w.pos // align) * align
    return Mutant(path, kvs, infos, data_start, buf.size - data_start, align)


def copy(m: Mutant, **changes) -> Mutant:
    fresh = dict(kvs=list(m.kvs), infos=list(m.infos), patches=list(m.patches))
    return replace(m, **{**fresh, **changes})


def arch_of(m: Mutant) -> str:
    return next(kv.value for kv in m.kvs if kv.key == "general.architecture")


def encode(value, vtype: int) -> bytes:
    """A value's bytes under `vtype` (scalars and strings)."""
    fmt = {V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i",
           V.FLOAT32: "f", V.BOOL: "?", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d"}
    return _str(value) if vtype == V.STRING else struct.pack("<" + fmt[vtype], value)


def set_kv(m: Mutant, key: str, value, vtype: int) -> Mutant:
    """m with `key` set to `value` of `vtype` (added when absent); a list value is an array of UINT32."""
    if isinstance(value, list):
        raw = _u32(V.UINT32) + _u64(len(value)) + b"".join(_u32(v) for v in value)
    else:
        raw = encode(value, vtype)
    out = copy(m)
    new = KV(key, vtype, raw, value)
    idx = next((i for i, kv in enumerate(out.kvs) if kv.key == key), None)
    if idx is None:
        out.kvs.append(new)
    else:
        out.kvs[idx] = new
    return out


def set_info(m: Mutant, tensor: str, **changes) -> Mutant:
    out = copy(m)
    out.infos = [replace(i, **changes) if i.name == tensor else i for i in m.infos]
    return out


def other_size_types(type_id: int, row: int) -> list[int]:
    """Supported types whose block divides `row` and whose row takes a different number of bytes."""
    block, size = GGML_QUANT_SIZES[T(type_id)]
    want = row // block * size
    return [int(t) for t, f in FORMATS.items() if row % f.block_size == 0 and f.row_bytes(row) != want]


def same_size_types(type_id: int, row: int) -> list[int]:
    block, size = GGML_QUANT_SIZES[T(type_id)]
    want = row // block * size
    return [int(t) for t, f in FORMATS.items()
            if t != type_id and row % f.block_size == 0 and f.row_bytes(row) == want]
