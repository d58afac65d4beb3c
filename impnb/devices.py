"""Choose where a model runs: the CUDA path when a usable GPU is present, else the CPU reference."""

import sys

from impnb.errors import DeviceError

GPU_ARCHS = ("llama", "qwen3", "gemma3", "qwen3moe")


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


def engine_class(device: str, arch: str):
    """The engine for `cpu`, `cuda` (DeviceError without a GPU) or `auto`, for architecture arch."""
    if device == "cpu":
        from impnb.engine_cpu import CpuEngine

        return CpuEngine
    reason = cuda_unavailable_reason()
    if reason is None and arch not in GPU_ARCHS:
        reason = f"architecture {arch} has no GPU path yet"
    if reason is None:
        from impnb.engine_cuda import CudaEngine

        return CudaEngine
    if device == "cuda":
        raise DeviceError(f"--device cuda: {reason}")
    print(f"impnb: {reason}; running the CPU reference", file=sys.stderr)
    from impnb.engine_cpu import CpuEngine

    return CpuEngine
