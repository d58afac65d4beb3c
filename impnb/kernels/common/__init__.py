"""Shared device code: inline-PTX intrinsics and their simulator twins, quant-block decoders, the weights' kernel layout, build checks."""

import impnb.launch  # noqa: E402,F401  (numba's dispatchers made fast before any kernel module's decorators)
