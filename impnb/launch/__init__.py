"""Kernel launches through cuLaunchKernel on cubins cached on disk, not numba's dispatcher
(44 µs of host time per launch on the H100). Under numba's CUDA simulator, the dispatcher.

    launch(kernel, grid, block, stream, *args, shared_bytes=0, cluster=None, programmatic=True)
"""

from numba.cuda.core import config as _cuda_config

from impnb.launch import signatures as _signatures

_signatures.install()  # before the kernel modules' decorators run (impnb/kernels/common imports this)

if _cuda_config.ENABLE_CUDASIM:
    recorder = None  # precompile.record()'s, as launcher.recorder on a GPU

    def launch(kernel, grid, block, stream, *args, shared_bytes: int = 0, cluster=None,
               programmatic: bool = True) -> None:
        """kernel[grid, block, stream, shared_bytes](*args) in the simulator (no clusters: it runs
        one block at a time; programmatic launches do not exist there)."""
        if recorder is not None:
            recorder(kernel, args)
            return
        assert cluster is None, "the simulator has no thread-block clusters"
        kernel[grid, block, stream, shared_bytes](*args)
else:
    from impnb.launch.launcher import launch

__all__ = ["launch"]
