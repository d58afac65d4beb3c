"""A thin ctypes binding of libnccl (as vLLM's pynccl): the calls tensor parallelism makes, on
buffers given as device pointers and streams given as raw CUDA stream handles (a capturing
stream records them into its graph).

Importing this module loads nothing; `library()` finds and loads libnccl.so.2 at first use, from
$IMPNB_NCCL_LIBRARY, the nvidia-nccl wheel's lib/ folder, cuda-pathfinder, then the loader's path.
NVLink multicast (NVLS) is kept off in every process that loads it (NCCL_NVLS_ENABLE=0).
"""

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from impnb.errors import ParallelError

SONAME = "libnccl.so.2"
UNIQUE_ID_BYTES = 128
IN_PROGRESS = 7  # ncclInProgress: a non-blocking call still running

# ncclDataType_t and ncclRedOp_t (nccl.h)
DTYPES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2, np.dtype(np.uint32): 3,
          np.dtype(np.int64): 4, np.dtype(np.uint64): 5, np.dtype(np.float16): 6, np.dtype(np.float32): 7,
          np.dtype(np.float64): 8}
SUM, PROD, MAX, MIN = 0, 1, 2, 3


class UniqueId(ctypes.Structure):
    """ncclUniqueId: 128 opaque bytes made by rank 0, passed by value to every rank's init."""

    _fields_ = [("internal", ctypes.c_byte * UNIQUE_ID_BYTES)]

    def to_bytes(self) -> bytes:
        return bytes(bytearray(self.internal))

    @classmethod
    def from_bytes(cls, raw: bytes) -> "UniqueId":
        if len(raw) != UNIQUE_ID_BYTES:
            raise ParallelError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got {len(raw)}")
        uid = cls()
        ctypes.memmove(uid.internal, raw, UNIQUE_ID_BYTES)
        return uid


_p, _i, _size, _res = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int
# name: (argument types); every call returns ncclResult_t except ncclGetErrorString
SIGNATURES = {
    "ncclGetVersion": (ctypes.POINTER(_i),),
    "ncclGetUniqueId": (ctypes.POINTER(UniqueId),),
    "ncclCommInitRank": (ctypes.POINTER(_p), _i, UniqueId, _i),
    "ncclCommDestroy": (_p,),
    "ncclCommAbort": (_p,),
    "ncclCommGetAsyncError": (_p, ctypes.POINTER(_res)),
    "ncclAllReduce": (_p, _p, _size, _i, _i, _p, _p),
    "ncclAllGather": (_p, _p, _size, _i, _p, _p),
    "ncclBroadcast": (_p, _p, _size, _i, _i, _p, _p),
    "ncclGroupStart": (),
    "ncclGroupEnd": (),
}


def candidates() -> list[str]:
    """Where libnccl may be, in the order tried."""
    out = []
    env = os.environ.get("IMPNB_NCCL_LIBRARY")
    if env:
        out.append(env)
    try:
        import nvidia.nccl

        out += [str(Path(p) / "lib" / SONAME) for p in nvidia.nccl.__path__]
    except ImportError:
        pass
    out.append(SONAME)
    return out


@dataclass(frozen=True)
class Nccl:
    """libnccl's functions with their argument types set; `check` raises on an error result."""

    lib: ctypes.CDLL
    path: str

    def __post_init__(self):
        for name, argtypes in SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = list(argtypes), _res
        self.lib.ncclGetErrorString.argtypes, self.lib.ncclGetErrorString.restype = [_res], ctypes.c_char_p

    def error_string(self, result: int) -> str:
        return self.lib.ncclGetErrorString(result).decode(errors="replace")

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise ParallelError(f"{what} failed: NCCL error {result} ({self.error_string(result)})")

    def version(self) -> int:
        v = _i()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        return v.value

    def unique_id(self) -> UniqueId:
        uid = UniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return uid


_loaded: Nccl | None = None


def library() -> Nccl:
    """libnccl, loaded once; ParallelError with one line where it cannot be found."""
    global _loaded
    if _loaded is None:
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # the hosts' rule: NVLink multicast stays off
        tried = []
        for path in candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(path)
                continue
            try:
                _loaded = Nccl(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path)
                break
            except OSError as e:
                tried.append(f"{path} ({e})")
        else:
            raise ParallelError(f"tensor parallelism needs NCCL ({SONAME}), not found: install "
                                f"nvidia-nccl-cu13 or set IMPNB_NCCL_LIBRARY (tried {'; '.join(tried)})")
    return _loaded


def collective_args(send, recv, dtype) -> tuple[int, int, int, int]:
    """(send pointer, recv pointer, element count, ncclDataType_t) of two device arrays (anything
    with __cuda_array_interface__) of one dtype and size; ParallelError on a mismatch."""
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise ParallelError(f"NCCL collectives take {sorted(str(d) for d in DTYPES)}, not {dtype}")
    ptrs = []
    for a in (send, recv):
        cai = a.__cuda_array_interface__
        if np.dtype(cai["typestr"]) != dtype:
            raise ParallelError(f"buffer of {np.dtype(cai['typestr'])} where {dtype} was asked")
        if cai.get("strides") is not None and cai["strides"] != _c_strides(cai["shape"], dtype):
            raise ParallelError("NCCL collectives need contiguous buffers")
        ptrs.append(cai["data"][0])
    return ptrs[0], ptrs[1], int(np.prod(send.__cuda_array_interface__["shape"], dtype=np.int64)), DTYPES[dtype]


def _c_strides(shape, dtype) -> tuple:
    strides, step = [], dtype.itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
