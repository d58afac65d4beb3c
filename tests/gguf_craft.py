"""Write GGUF files for tests: valid tiny ones through gguf.GGUFWriter, hostile ones byte by byte.

`build_gguf` lays out a GGUF v3 file from already-encoded key/values and tensor infos, so a
test can put any count, length, type id or offset into the header; `kv_*` and
`tensor_info` encode the pieces, `u32`/`u64`/`gguf_string` the primitives.
"""

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

MAGIC = b"GGUF"
ALIGNMENT = 32


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gguf_string(s: str, length: int | None = None) -> bytes:
    """A GGUF string; `length` overrides the declared byte count (the bytes stay `s`)."""
    raw = s.encode("utf-8")
    return u64(len(raw) if length is None else length) + raw


def kv_raw(key: str, vtype: int, payload: bytes) -> bytes:
    """One key/value with an arbitrary value type id and already-encoded value bytes."""
    return gguf_string(key) + u32(vtype) + payload


def kv_string(key: str, value: str) -> bytes:
    return kv_raw(key, GGUFValueType.STRING, gguf_string(value))


def kv_u32(key: str, value: int) -> bytes:
    return kv_raw(key, GGUFValueType.UINT32, u32(value))


def kv_array(key: str, etype: int, items: bytes, count: int) -> bytes:
    """An array of `count` elements of type `etype`, whose encoded elements are `items`."""
    return kv_raw(key, GGUFValueType.ARRAY, u32(etype) + u64(count) + items)


def tensor_info(name: str, dims, type_id: int, offset: int) -> bytes:
    """A tensor info; `dims` in ggml order (dims[0] is the row length)."""
    return gguf_string(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(type_id) + u64(offset)


@dataclass(frozen=True)
class Crafted:
    """A built file's bytes, where its header ends and where its tensor data starts."""

    data: bytes
    header_end: int
    data_start: int

    def write(self, path) -> Path:
        path = Path(path)
        path.write_bytes(self.data)
        return path


def build_gguf(kvs=(), infos=(), data: bytes = b"", *, version: int = 3, n_kv: int | None = None,
               n_tensors: int | None = None, alignment: int = ALIGNMENT) -> Crafted:
    """Magic, version, counts (default: the real ones), `kvs`, `infos`, padding, then `data`."""
    header = (MAGIC + u32(version) + u64(len(infos) if n_tensors is None else n_tensors)
              + u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos))
    pad = -len(header) % alignment
    return Crafted(header + bytes(pad) + data, len(header), len(header) + pad)


def tensor_bytes(type_id: int, dims) -> int:
    """Bytes a tensor of `dims` (ggml order) takes in `type_id`."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
    return rows * (dims[0] // block) * size


def one_tensor_gguf(name: str = "w", dims=(32, 2), type_id: int = GGMLQuantizationType.F32,
                    *, extra_kvs=(), arch: str | None = "llama", offset: int = 0,
                    data: bytes | None = None, seed: int = 0, **build) -> Crafted:
    """A file with `general.architecture`, `extra_kvs` and one tensor of random bytes."""
    kvs = ([kv_string("general.architecture", arch)] if arch is not None else []) + list(extra_kvs)
    if data is None:
        n = tensor_bytes(type_id, dims) if type_id in iter(GGMLQuantizationType) else 64
        data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    return build_gguf(kvs, [tensor_info(name, dims, type_id, offset)], data, **build)


def write_tiny_gguf(path, tensors, *, arch: str = "llama", metadata=None,
                    alignment: int | None = None) -> Path:
    """A valid GGUF via gguf.GGUFWriter.

    `tensors` maps name -> (array, ggml type): float32/float16 arrays for F32/F16, uint8 block
    bytes of shape (rows, row_bytes) for every other type. `metadata` maps key -> value
    (type inferred as gguf does: str, int32, float32, bool, list) or key -> (value, GGUFValueType).
    """
    path = Path(path)
    w = GGUFWriter(path, arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value in (metadata or {}).items():
        value, vtype = value if isinstance(value, tuple) else (value, GGUFValueType.get_type(value))
        sub_type = GGUFValueType.get_type(value[0]) if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, (array, qtype) in tensors.items():
        w.add_tensor(name, array, raw_dtype=GGMLQuantizationType(qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def truncated(src: Path, n: int, dst: Path) -> Path:
    """`dst` holds the first `n` bytes of `src`."""
    dst.write_bytes(src.read_bytes()[:n])
    return dst


def patched(src: Path, offset: int, raw: bytes, dst: Path) -> Path:
    """`dst` is `src` with `raw` written over the bytes at `offset`."""
    buf = bytearray(src.read_bytes())
    buf[offset:offset + len(raw)] = raw
    dst.write_bytes(bytes(buf))
    return dst
