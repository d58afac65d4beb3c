"""cuLaunchKernel on a kernel's cached cubin with a packing plan made once per (kernel, signature).

Per launch: the arguments' signature key and flat values (args.flatten), one dict lookup, one
struct.pack_into into the plan's parameter buffer, one cuLaunchKernel. The driver copies the
parameters at the call, so the buffer is reused; a lock keeps two threads from sharing it.
A launch on a capturing stream is captured like any other (impnb.graphs.capture.Graph), but
the first launch of a (kernel, signature) compiles and loads a module: warm up before capture.
Modules are loaded into the context current at that first launch (numba's primary context).

A kernel whose body, or a device function it calls, calls `ptx.grid_dep_wait()` (before it
writes memory, and before it reads what the kernel just before writes) is launched
with programmatic stream serialization (cuLaunchKernelEx): it may be scheduled while the kernel
before it runs and waits on the device, so the launch gap between graph nodes overlaps work.
IMPNB_PDL=0 turns this off, and a launch with programmatic=False (a kernel whose placement
beside the one before it costs more than the overlap saves) too. A launch with cluster dims goes
through cuLaunchKernelEx too.
The search for the wait looks into device functions: attention_decode_short waits inside one.
The shared-memory carveout is left to the driver: one preferred carveout for every kernel (so no
SM reconfigures between a kernel and the next) measured even (docs/EXPERIMENTS.md, 'Launch and
graphs').
"""

import ctypes
import os
import struct
import threading

from cuda.bindings import driver
from numba import cuda

from impnb.launch.args import flatten, param_codes, param_layout, signature
from impnb.launch.cache import get_cubin
from impnb.launch.cubin import arch_cc, entry_name

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_DEFAULT_SHARED = 48 * 1024  # bytes of static + dynamic shared memory allowed without opting in
_plans: dict[tuple, "Plan"] = {}
PROGRAMMATIC = os.environ.get("IMPNB_PDL", "1") != "0"
_build_lock = threading.Lock()
recorder = None  # set by precompile.record(): a dry run notes its launches instead of making them


def _check(result, what: str):
    err, *rest = result
    if err != _SUCCESS:
        raise RuntimeError(f"{what} failed: {err.name}")
    return rest[0] if rest else None


class Plan:
    """One (kernel, signature): its CUfunction and the parameter buffer numba's ABI lays out."""

    def __init__(self, kernel, args):
        sig = signature(args)
        self.fmt, offsets, size = param_layout(param_codes(sig))
        ctx = cuda.current_context()  # makes numba's context current on this thread
        cubin = get_cubin(kernel, sig, arch_cc(ctx.device.compute_capability))
        module = _check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.name = entry_name(cubin)
        self.func = _check(driver.cuModuleGetFunction(module, self.name.encode()), "cuModuleGetFunction")
        self.static_shared = _check(driver.cuFuncGetAttribute(
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.func),
            "cuFuncGetAttribute")
        self.dynamic_shared_max = _DEFAULT_SHARED - self.static_shared
        self.buf = (ctypes.c_char * max(size, 1))()
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(len(offsets), 1))(*(base + off for off in offsets))
        self.params = ctypes.addressof(self.ptrs)
        self.lock = threading.Lock()
        self.programmatic = PROGRAMMATIC and waits_on_grid(kernel)
        self.configs = {}  # (cluster dims or None, programmatic) -> CUlaunchConfig, or None for cuLaunchKernel

    def allow_shared(self, nbytes: int) -> None:
        """Opt in to nbytes of dynamic shared memory (past 48 KB with the static)."""
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check(driver.cuFuncSetAttribute(self.func, attr, nbytes), "cuFuncSetAttribute")
        self.dynamic_shared_max = nbytes

    def launch(self, grid, block, stream, values, shared_bytes: int, cluster=None, programmatic: bool = True) -> None:
        if shared_bytes > self.dynamic_shared_max:
            self.allow_shared(shared_bytes)
        with self.lock:
            struct.pack_into(self.fmt, self.buf, 0, *values)
            mode = (cluster, self.programmatic and programmatic)
            if mode not in self.configs:
                self.configs[mode] = _config(mode[1], cluster)
            c = self.configs[mode]
            if c is None:
                err, = driver.cuLaunchKernel(self.func, *grid, *block, shared_bytes, stream, self.params, 0)
            else:
                c.gridDimX, c.gridDimY, c.gridDimZ = grid
                c.blockDimX, c.blockDimY, c.blockDimZ = block
                c.sharedMemBytes, c.hStream = shared_bytes, stream
                err, = driver.cuLaunchKernelEx(c, self.func, self.params, 0)
        if err != _SUCCESS:
            raise RuntimeError(f"cuLaunchKernel({self.name[:80]}) failed: {err.name} ({self.fit(block, shared_bytes)})")

    def fit(self, block, shared_bytes: int) -> str:
        """What a failed launch asked of its build: the block's threads against the most this build
        takes (its registers a thread bound it), and its shared memory."""
        attr = driver.CUfunction_attribute
        regs, most = (_check(driver.cuFuncGetAttribute(a, self.func), "cuFuncGetAttribute")
                      for a in (attr.CU_FUNC_ATTRIBUTE_NUM_REGS, attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK))
        threads = block[0] * block[1] * block[2]
        return (f"a block of {threads} threads, this build {regs} registers a thread and at most {most} threads a "
                f"block; {self.static_shared} bytes of static shared memory and {shared_bytes} dynamic")


def waits_on_grid(kernel) -> bool:
    """Whether the kernel's body, or a device function it calls, calls ptx.grid_dep_wait (so it
    may start early)."""
    return _calls_wait(kernel.py_func, set())


def _calls_wait(fn, seen: set) -> bool:
    code = fn.__code__
    if "grid_dep_wait" in code.co_names:
        return True
    seen.add(code)
    scope = dict(fn.__globals__)
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            scope[name] = cell.cell_contents
        except ValueError:  # a cell not yet filled
            pass
    for name in code.co_names + code.co_freevars:
        callee = getattr(scope.get(name), "py_func", None)  # a @cuda.jit device function
        if callee is not None and callee.__code__ not in seen and _calls_wait(callee, seen):
            return True
    return False


def _config(programmatic: bool, cluster):
    """cuLaunchKernelEx's config for programmatic serialization and / or cluster dims, else None."""
    attrs = []
    if programmatic:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    if cluster is not None:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        attrs.append(attr)
    if not attrs:
        return None
    config = driver.CUlaunchConfig()
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config


def _dim3(d) -> tuple:
    if isinstance(d, tuple):
        return (*d, 1, 1)[:3]
    return d, 1, 1


def launch(kernel, grid, block, stream, *args, shared_bytes: int = 0, cluster: tuple | None = None,
           programmatic: bool = True) -> None:
    """kernel[grid, block, stream, shared_bytes](*args) without numba's dispatcher.

    kernel: a @cuda.jit dispatcher; grid, block: int or 1-3 tuple; stream: a numba stream
    (cuda.stream(), cuda.external_stream(handle)) or 0; args: numba device arrays (views
    included), numpy scalars, tuples of these; shared_bytes: dynamic shared memory per block;
    cluster: thread-block cluster dims (x, y, z) dividing the grid's (sm_90; 8 blocks at most);
    programmatic=False: launched after the kernel before it ends, even where it waits on the grid.
    """
    if recorder is not None:  # a dry run (impnb.launch.precompile.record): note it, launch nothing
        recorder(kernel, args)
        return
    key, values = [kernel], []
    flatten(args, key, values)
    key = tuple(key)
    plan = _plans.get(key)
    if plan is None:
        with _build_lock:
            plan = _plans.get(key) or _plans.setdefault(key, Plan(kernel, args))
    plan.launch(_dim3(grid), _dim3(block), getattr(stream, "handle", stream), values, shared_bytes,
                None if cluster is None else _dim3(cluster), programmatic)
