"""The simulator's shared-array allocation is unlocked: two block threads can each miss the
first-allocation check and get private arrays, a rare false failure. Serialize it."""

import sys
import threading
import traceback

import numpy as np
from numba import config, types
from numba.np import numpy_support

if config.ENABLE_CUDASIM:
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    _lock = threading.Lock()
    _array = FakeCUDAShared.array

    def _locked_array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return _array(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = tuple(traceback.extract_stack(sys._getframe())[-2][0:2])  # the kernel's line
        with _lock:
            if caller not in self._allocations:
                self._allocations[caller] = np.empty(shape, dtype)
            return self._allocations[caller]

    FakeCUDAShared.array = _locked_array
