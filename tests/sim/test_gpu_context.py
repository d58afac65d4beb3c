"""GpuContext's allocations: a GPU without room for a buffer gives DeviceError naming the size,
not numba's CUDA error; any other failure passes through as it is."""

import numpy as np
import pytest
from numba.cuda.cudadrv.driver import CudaAPIError

from impnb.errors import DeviceError
from impnb.gpu.context import CUDA_ERROR_OUT_OF_MEMORY, GpuContext


def failing(code):
    def allocate(*args, **kwargs):
        raise CudaAPIError(code, "Call to cuMemAlloc results in an error")
    return allocate


@pytest.mark.parametrize("how", ["empty", "upload"])
def test_out_of_memory_is_a_device_error(monkeypatch, how):
    ctx = GpuContext()
    monkeypatch.setattr(ctx.cuda, "device_array", failing(CUDA_ERROR_OUT_OF_MEMORY))
    monkeypatch.setattr(ctx.cuda, "to_device", failing(CUDA_ERROR_OUT_OF_MEMORY))
    with pytest.raises(DeviceError, match=r"out of GPU memory: 3 MiB more did not fit"):
        if how == "empty":
            ctx.empty((768, 1024), np.float32)
        else:
            ctx.upload(np.ones((768, 1024), np.float32))


def test_other_errors_pass_through(monkeypatch):
    ctx = GpuContext()
    monkeypatch.setattr(ctx.cuda, "device_array", failing(1))  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaAPIError):
        ctx.empty((4,), np.float32)
