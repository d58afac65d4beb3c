"""One CUDA context and stream (cuda.core) shared by numba kernels and cuBLAS."""

import numpy as np

from impnb.cuda_support import cuda_unavailable_reason
from impnb.errors import DeviceError

CUDA_ERROR_OUT_OF_MEMORY = 2


class GpuContext:
    """The primary context of GPU device_id, one non-blocking stream, and numba's view of it."""

    def __init__(self, device_id: int = 0):
        from numba import cuda
        from numba.cuda import config as cuda_config

        self.cuda = cuda
        self.simulator = bool(cuda_config.ENABLE_CUDASIM)
        if self.simulator:  # numba's CUDA simulator: tests of the engine's wiring on the CPU
            self.stream, self.handle, self.nb_stream = None, 0, cuda.stream()
            return
        reason = cuda_unavailable_reason()
        if reason:
            raise DeviceError(reason)
        from cuda.core import Device

        try:
            self.device = Device(device_id)
            self.device.set_current()
        except Exception as e:  # cuda.core's error for an id past the GPUs present, or a busy GPU
            raise DeviceError(f"GPU {device_id} cannot be used: {e}") from None
        self.stream = self.device.create_stream()
        self.handle = int(self.stream.handle)
        self.nb_stream = cuda.external_stream(self.handle)  # numba launches go here
        from cuda.bindings import driver

        self._driver, self._custream = driver, driver.CUstream(self.handle)

    def mem_free(self) -> tuple[int, int]:
        """(free, total) bytes on the device."""
        if self.simulator:
            return 1 << 40, 1 << 40
        return self.cuda.current_context().get_memory_info()

    def check_fits(self, need: int, what: str) -> None:
        """DeviceError naming what was needed and what is free when `need` bytes do not fit."""
        free, total = self.mem_free()
        if need > free:
            raise DeviceError(f"out of GPU memory: {what} needs {need / 2**20:.0f} MiB, "
                              f"{free / 2**20:.0f} MiB of {total / 2**20:.0f} MiB are free")

    def empty(self, shape, dtype):
        """An uninitialised device array (at load, or a step's buffers at its first run)."""
        dtype = np.dtype(dtype)
        try:
            return self.cuda.device_array(shape, dtype=dtype, stream=self.nb_stream)
        except Exception as e:
            raise self._no_room(e, int(np.prod(shape)) * dtype.itemsize) from None

    def upload(self, array: np.ndarray):
        array = np.ascontiguousarray(array)
        try:
            return self.cuda.to_device(array, stream=self.nb_stream)
        except Exception as e:
            raise self._no_room(e, array.nbytes) from None

    def _no_room(self, error: Exception, nbytes: int) -> Exception:
        """DeviceError for an allocation the GPU had no room for (numba's CudaAPIError of
        CUDA_ERROR_OUT_OF_MEMORY), else the error itself."""
        code = getattr(error, "code", error.args[0] if error.args else None)
        try:
            if int(code) != CUDA_ERROR_OUT_OF_MEMORY:
                return error
        except (TypeError, ValueError):
            return error
        free, total = self.mem_free()
        return DeviceError(f"out of GPU memory: {nbytes / 2**20:.0f} MiB more did not fit ({free / 2**20:.0f} "
                           f"MiB of {total / 2**20:.0f} MiB free); a shorter context (--ctx) needs less")

    def h2d(self, dst, src: np.ndarray, rows: int | None = None) -> None:
        """Host src's first `rows` rows (all by default) into device dst's first rows, on the
        stream: one driver call, without the checks and slicing numba spends tens of µs on a
        copy (a step's staging makes several; asynchronous where src is pinned)."""
        rows = src.shape[0] if rows is None else rows
        if self.simulator:
            dst[:rows].copy_to_device(src[:rows], stream=self.nb_stream)
            return
        assert (src.dtype == dst.dtype and src.shape[1:] == dst.shape[1:] and rows <= min(src.shape[0], dst.shape[0])
                and src.flags.c_contiguous and dst.is_c_contiguous()), "h2d: rows of equal layout"
        nbytes = rows * (src.itemsize * int(np.prod(src.shape[1:], dtype=np.int64)))
        self._checked(self._driver.cuMemcpyHtoDAsync(dst.device_ctypes_pointer.value, src.ctypes.data, nbytes,
                                                     self._custream), "cuMemcpyHtoDAsync")

    def d2h(self, dst: np.ndarray, src, rows: int | None = None) -> None:
        """Device src's first `rows` rows (all by default) into host dst's first rows, as h2d."""
        rows = src.shape[0] if rows is None else rows
        if self.simulator:
            src[:rows].copy_to_host(dst[:rows], stream=self.nb_stream)
            return
        assert (src.dtype == dst.dtype and src.shape[1:] == dst.shape[1:] and rows <= min(src.shape[0], dst.shape[0])
                and dst.flags.c_contiguous and src.is_c_contiguous()), "d2h: rows of equal layout"
        nbytes = rows * (src.dtype.itemsize * int(np.prod(src.shape[1:], dtype=np.int64)))
        self._checked(self._driver.cuMemcpyDtoHAsync(dst.ctypes.data, src.device_ctypes_pointer.value, nbytes,
                                                     self._custream), "cuMemcpyDtoHAsync")

    def _checked(self, result, what: str) -> None:
        err = result[0]
        if err != self._driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{what} failed: {err}")

    def sync(self) -> None:
        self.nb_stream.synchronize() if self.simulator else self.stream.sync()
