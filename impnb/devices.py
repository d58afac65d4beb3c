"""Choose where a model runs: the CUDA path when a usable GPU is present, else the CPU reference."""

import sys
from dataclasses import dataclass

from impnb.engine_cpu import CpuEngine
from impnb.errors import DeviceError


@dataclass(frozen=True)
class Device:
    name: str
    engine: type


def cuda_unavailable_reason() -> str | None:
    """None when a CUDA GPU and driver are usable, else why not (one line)."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        return f"cuda-python is not installed ({e})"
    try:
        err, = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"no CUDA driver or GPU ({err.name})"
        err, count = driver.cuDeviceGetCount()
    except RuntimeError:  # libcuda.so missing
        return "no CUDA driver found"
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        return "no CUDA GPU found"
    return None


def select_device(name: str) -> Device:
    """`cpu`, `cuda` (DeviceError without a GPU) or `auto`."""
    if name == "cpu":
        return Device("cpu", CpuEngine)
    reason = cuda_unavailable_reason()
    if reason is None:
        reason = "the CUDA path is not built yet"
    if name == "cuda":
        raise DeviceError(f"--device cuda: {reason}")
    print(f"impnb: {reason}; running the CPU reference", file=sys.stderr)
    return Device("cpu", CpuEngine)
