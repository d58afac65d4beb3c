"""Choose where a model runs: the CUDA path when a usable GPU is present, else the CPU reference."""

import sys

from impnb.cuda_support import GPU_ARCHS, cuda_unavailable_reason  # noqa: F401 (callers read them here)
from impnb.errors import DeviceError

def engine_class(device: str, arch: str, cfg=None):
    """The engine for `cpu`, `cuda` (DeviceError without a GPU) or `auto`, for architecture arch;
    with the model's config, `auto` also takes the CPU where the GPU kernels take none of its
    head dims (`cuda` then fails at the load, naming them)."""
    if device == "cpu":
        from impnb.engine_cpu import CpuEngine

        return CpuEngine
    reason = cuda_unavailable_reason()
    if reason is None:  # the GPU path's kernels import numba next
        from impnb.numba_import import import_numba

        import_numba()
    if reason is None and arch not in GPU_ARCHS:
        reason = f"architecture {arch} has no GPU path yet"
    if reason is None and cfg is not None and device == "auto":
        from impnb.errors import UnsupportedError
        from impnb.models.validate import check_gpu_shapes

        try:
            check_gpu_shapes(cfg)
        except UnsupportedError as e:
            reason = str(e).removesuffix("; use --device cpu")
    if reason is None:
        from impnb.engine_cuda import CudaEngine

        return CudaEngine
    if device == "cuda":
        raise DeviceError(f"--device cuda: {reason}")
    print(f"impnb: {reason}; running the CPU reference", file=sys.stderr)
    from impnb.engine_cpu import CpuEngine

    return CpuEngine
