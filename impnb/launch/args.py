"""Kernel arguments as numba's kernel ABI takes them: a cheap per-call signature key, the flat
parameter values, and the packing format of a signature.

numba flattens each argument (numba_cuda dispatcher.py `_Kernel._prepare_args`):
  array (ndim n)  meminfo u64 = 0, parent u64 = 0, nitems i64, itemsize i64, data u64,
                  shape i64[n], strides i64[n] (bytes): 5 + 2n parameters
  tuple           its elements, flattened in order
  scalar          one parameter of its C type (bool one byte, float16 its 16 bits)
The PTX `.entry` of a kernel lists exactly these, nothing else: with debug off numba adds no
hidden parameter (exception state lives in module globals only when debug=True, which launch
refuses). tests/test_launch.py checks this against the PTX of real kernels.
"""

import struct

from numba.cuda import types
from numba.cuda.cudadrv.devicearray import DeviceNDArray
from numba.cuda.typing.typeof import Purpose, typeof

_SCALAR_CODES = {types.boolean: "?", types.float16: "e", types.float32: "f", types.float64: "d"}
_INT_CODES = {8: "b", 16: "h", 32: "i", 64: "q"}


def _layout(a) -> str:
    """numba's layout letter for a device array, as DeviceNDArrayBase._numba_type_ decides it."""
    if a.size and 0 in a.strides:  # broadcast: strides cannot be hard-coded
        return "A"
    flags = a._dummy.flags
    return "C" if flags["C_CONTIGUOUS"] else "F" if flags["F_CONTIGUOUS"] else "A"


def flatten(args, key: list, values: list) -> None:
    """Append each argument's signature key to `key` and its kernel parameters to `values`."""
    for a in args:
        cls = type(a)
        if cls is DeviceNDArray:
            key.append((a.dtype, a.ndim, _layout(a)))
            values += (0, 0, a.size, a.dtype.itemsize, int(a.gpu_data.device_pointer), *a.shape,
                       *a.strides)
        elif cls is tuple:
            key.append((tuple, len(a)))
            flatten(a, key, values)
        else:
            key.append(cls)
            values.append(a)


def signature(args) -> tuple:
    """numba's argument types for `args` (the slow path, once per kernel and key)."""
    sig = tuple(typeof(a, Purpose.argument) for a in args)
    for a, ty in zip(_leaves(args), _leaves(sig)):
        if isinstance(ty, types.Array) and type(a) is not DeviceNDArray:
            raise TypeError(f"launch: {type(a).__name__} argument; pass numba device arrays")
    return sig


def _leaves(xs):
    for x in xs:
        if isinstance(x, (tuple, types.BaseTuple)):
            yield from _leaves(x)
        else:
            yield x


def param_codes(sig) -> list[str]:
    """One struct code per kernel parameter of the signature, in order."""
    codes = []
    for ty in _leaves(sig):
        if isinstance(ty, types.Array):
            codes += ["Q", "Q", "q", "q", "Q"] + ["q"] * (2 * ty.ndim)
        elif isinstance(ty, types.Integer):
            code = _INT_CODES[ty.bitwidth]
            codes.append(code if ty.signed else code.upper())
        elif ty in _SCALAR_CODES:
            codes.append(_SCALAR_CODES[ty])
        else:
            raise NotImplementedError(f"launch: {ty} arguments are not supported")
    return codes


def param_layout(codes: list[str]) -> tuple[str, list[int], int]:
    """(struct format, byte offset of each parameter, total bytes): each parameter aligned to
    its size, as in the kernel's parameter space."""
    fmt, offsets, end = "=", [], 0
    for code in codes:
        size = struct.calcsize("=" + code)
        pad = -end % size
        fmt += "x" * pad + code
        offsets.append(end + pad)
        end += pad + size
    return fmt, offsets, end
