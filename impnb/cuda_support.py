"""Whether the CUDA path can run: a usable GPU and driver here, and the architectures it runs.

A leaf below both the device chooser (devices.py) and the GPU path (gpu/), which read it.
"""

import threading

GPU_ARCHS = ("llama", "qwen3", "gemma3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "gemma4")
# whose GPU layer loop takes head dims past the tiled attention kernels' (gpu/forward_gemma4.py)
WIDE_HEAD_ARCHS = ("gemma4",)
# The kernels use Hopper's programmatic dependent launch (griddepcontrol) and build for sm_90 and
# newer; on an older GPU their first build would fail deep inside the JIT linker.
MIN_COMPUTE_CAPABILITY = (9, 0)


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
    return _capability_reason(driver)


def _capability_reason(driver) -> str | None:
    """Why device 0 cannot run the kernels (compute capability below MIN_COMPUTE_CAPABILITY),
    else None."""
    attr = driver.CUdevice_attribute
    err, dev = driver.cuDeviceGet(0)
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"the CUDA GPU could not be opened ({err.name})"
    cc = []
    for a in (attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR):
        err, v = driver.cuDeviceGetAttribute(a, dev)
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"the CUDA GPU's compute capability could not be read ({err.name})"
        cc.append(v)
    if tuple(cc) < MIN_COMPUTE_CAPABILITY:
        err, name = driver.cuDeviceGetName(64, dev)
        name = name.split(b"\0", 1)[0].decode(errors="replace") if err == driver.CUresult.CUDA_SUCCESS else "the GPU"
        need = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
        return (f"{name} has compute capability {cc[0]}.{cc[1]}; impnb's kernels need {need} "
                f"(Hopper) or newer")
    return None


def open_driver_early(device_id: int = 0) -> None:
    """Initialise the CUDA driver and make GPU device_id's primary context in a daemon thread, so
    that the fraction of a second it takes (the driver's calls release the GIL) overlaps the GGUF
    parse and the tokenizer build; the engine's own retain then finds the context made. Any
    failure is left for cuda_unavailable_reason to report."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return
    threading.Thread(target=_retain_primary_context, args=(driver, device_id), name="impnb-cuda-init",
                     daemon=True).start()


def _retain_primary_context(driver, device_id: int) -> None:
    ok = driver.CUresult.CUDA_SUCCESS
    try:
        err, = driver.cuInit(0)
        if err != ok:
            return
        err, dev = driver.cuDeviceGet(device_id)
        if err == ok:
            driver.cuDevicePrimaryCtxRetain(dev)  # held for the process's life, as the engine's is
    except RuntimeError:  # libcuda.so missing
        pass
