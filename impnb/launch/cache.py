"""Compiled kernels cached on disk, so a second start compiles nothing.

One file per key in $IMPNB_CACHE_DIR (default ~/.cache/impnb/kernels): MAGIC, the SHA-256 of
the cubin, the cubin. The key covers everything the code could depend on: the kernel's
module.qualname, the values its closure captures (factory kernels differ only there), the
signature, its @cuda.jit options, the source of impnb/kernels/*.py and of the kernel's own file,
the numba / numba-cuda / nvJitLink versions and the target. Files are written atomically (temp
file + os.replace); an unreadable or corrupt file is rebuilt; a cache dir that cannot be written
only costs the compile.
"""

import enum
import hashlib
import logging
import os
import types as pytypes
from collections import Counter
from concurrent.futures import wait
from functools import lru_cache
from pathlib import Path

import numpy as np
from numba.cuda import types

from impnb import checked_file
from impnb.launch.cubin import compile_cubin

log = logging.getLogger("impnb.launch")

MAGIC = b"impnb-cubin-1\n"
KERNELS_DIR = Path(__file__).parents[1] / "kernels"
stats = Counter()  # "compiled", "disk", "memory": where this process found each cubin
_memory: dict[str, bytes] = {}
pending: dict = {}  # key -> Future of a worker compiling it (precompile.Background): waited for, not redone


class UnstableValue(TypeError):
    """A closure value with no repr that is the same in every process."""


def cache_dir() -> Path:
    return Path(os.environ.get("IMPNB_CACHE_DIR") or Path.home() / ".cache" / "impnb" / "kernels")


def stable_repr(v, within: frozenset = frozenset()) -> str:
    """A repr of `v` equal across processes: scalars, tuples, dtypes, numba types, enums, modules,
    and functions, dispatchers and intrinsics (module.qualname and, recursively, their closure;
    one made from a string, as gemm_mmq's kernels are, by its bytecode and the globals it reads).
    within: the ids of the lists, dicts and functions being expanded; reaching one again is a
    cycle, which has no such repr."""
    if isinstance(v, enum.Enum):
        return f"{type(v).__module__}.{type(v).__qualname__}.{v.name}"
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return repr(v)
    if isinstance(v, np.generic):
        return f"np.{type(v).__name__}({v.item()!r})"
    if isinstance(v, (np.dtype, types.Type)):
        return f"{type(v).__name__}({v})"
    if isinstance(v, pytypes.ModuleType):
        return f"module {v.__name__}"
    if id(v) in within:
        raise UnstableValue(f"a {type(v).__name__} that holds itself")
    inner = within | {id(v)}
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(stable_repr(x, inner) for x in v) + ")"
    if isinstance(v, dict):
        return stable_repr(sorted(v.items()), inner)
    fn = getattr(v, "py_func", None) or getattr(v, "_defn", v)  # a dispatcher's or @intrinsic's
    if isinstance(fn, pytypes.FunctionType):
        if not os.path.isfile(fn.__code__.co_filename):  # made from a string (exec): no file names it
            return (f"<{fn.__qualname__} {_code_repr(fn.__code__)} {stable_repr(_named_globals(fn), inner)}"
                    f"{stable_repr(_closure(fn), inner)}>")
        return f"{fn.__module__}.{fn.__qualname__}{stable_repr(_closure(fn), inner)}"
    raise UnstableValue(f"no stable repr for a {type(v).__name__}")


def _code_repr(code: pytypes.CodeType) -> str:
    """The bytecode of a code object and of those it holds, with its constants and names."""
    consts = []
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            consts.append(_code_repr(c))
        elif isinstance(c, frozenset):
            consts.append(repr(sorted(map(repr, c))))
        else:
            consts.append(repr(c))
    return repr((code.co_code.hex(), tuple(consts), code.co_names, code.co_varnames, code.co_argcount,
                 code.co_freevars))


def _code_names(code: pytypes.CodeType) -> set:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            names |= _code_names(c)
    return names


def _named_globals(fn) -> tuple:
    """(name, value) of the globals a function made from a string reads: what its file would hold."""
    return tuple((n, fn.__globals__[n]) for n in sorted(_code_names(fn.__code__)) if n in fn.__globals__)


def _closure(fn) -> tuple:
    values = []
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            values.append("<empty cell>")
    return tuple(values)


@lru_cache(maxsize=None)
def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@lru_cache(maxsize=None)
def _kernel_files() -> tuple[str, ...]:
    """impnb/kernels' source files, listed once a process (a start computes ~100 kernels' keys)."""
    return tuple(sorted(str(p) for p in KERNELS_DIR.rglob("*.py")))


def sources_digest(py_func) -> str:
    files = set(_kernel_files())
    if os.path.isfile(py_func.__code__.co_filename):
        files.add(py_func.__code__.co_filename)
    return hashlib.sha256(" ".join(_file_digest(f) for f in sorted(files)).encode()).hexdigest()


@lru_cache(maxsize=None)
def toolchain() -> str:
    from importlib.metadata import version

    import numba
    from cuda.bindings import nvjitlink

    return (f"numba {numba.__version__} numba-cuda {version('numba-cuda')} "
            f"nvjitlink {nvjitlink.version()}")


def cache_key(kernel, sig: tuple, cc: tuple) -> str | None:
    """The hex key of (kernel, sig, cc); None when its closure has no stable repr."""
    fn = kernel.py_func
    try:
        parts = [stable_repr(fn), str(sig),
                 stable_repr(kernel.targetoptions), sources_digest(fn), toolchain(), str(cc)]
    except UnstableValue as e:
        log.info("not caching %s on disk: %s", fn.__qualname__, e)
        return None
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _read(path: Path) -> bytes | None:
    return checked_file.read(path, MAGIC, log, "kernel cache")


def _write(path: Path, cubin: bytes) -> None:
    checked_file.write(path, MAGIC, cubin, log, "kernel cache")


def cubin_path(kernel, key: str) -> Path:
    """Where the cubin of cache key `key` of `kernel` lives on disk."""
    return cache_dir() / f"{kernel.py_func.__name__}-{key[:32]}.cubin"


def kernels_digest() -> str:
    """SHA-256 of every kernel source file (what a model's set of kernels is built from)."""
    return hashlib.sha256(" ".join(_file_digest(f) for f in _kernel_files()).encode()).hexdigest()


def get_cubin(kernel, sig: tuple, cc: tuple) -> bytes:
    """The cubin of (kernel, sig) for target cc: from memory, from disk, else compiled and stored."""
    key = cache_key(kernel, sig, cc)
    if key is None:
        stats["compiled"] += 1
        return compile_cubin(kernel, sig, cc)
    if key in _memory:
        stats["memory"] += 1
        return _memory[key]
    path = cubin_path(kernel, key)
    future = pending.pop(key, None)
    if future is not None:  # a worker is writing it: wait (a failure there is compiled here below)
        wait([future])
    cubin = _read(path)
    if cubin is None:
        cubin = compile_cubin(kernel, sig, cc)
        stats["compiled"] += 1
        _write(path, cubin)
    else:
        stats["disk"] += 1
    _memory[key] = cubin
    return cubin
