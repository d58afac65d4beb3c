"""One Python signature per code object for numba's CUDA dispatchers.

numba reads a @cuda.jit function's signature (inspect.signature) twice as it makes its dispatcher;
impnb's kernel files make thousands of device-function variants at import from a few code objects,
and inspect was most of the GPU path's import time. A plain function's signature (no defaults,
annotations, __wrapped__ or __signature__) follows from its code alone, so those share one; any
other function gets inspect's.
"""

import inspect
import types

_memo: dict[types.CodeType, inspect.Signature] = {}


def pysignature(fn) -> inspect.Signature:
    if (type(fn) is types.FunctionType and fn.__defaults__ is None and fn.__kwdefaults__ is None
            and not fn.__annotations__ and "__wrapped__" not in fn.__dict__
            and "__signature__" not in fn.__dict__):
        sig = _memo.get(fn.__code__)
        if sig is None:
            sig = _memo[fn.__code__] = inspect.signature(fn)
        return sig
    return inspect.signature(fn)


def install() -> None:
    """numba's CUDA dispatchers read signatures through pysignature from here on."""
    try:
        from numba.cuda import dispatcher
    except ImportError:  # a numba-cuda laid out otherwise: inspect's signatures, as before
        return
    if hasattr(dispatcher, "utils") and hasattr(dispatcher.utils, "pysignature"):
        dispatcher.utils.pysignature = pysignature
