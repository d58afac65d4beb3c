"""Whether the CUDA path can run: a usable GPU and driver here, and the architectures it runs.

A leaf below both the device chooser (devices.py) and the GPU path (gpu/), which read it.
"""

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
