"""Compile a numba.cuda kernel for sm_90 without a GPU and read its registers and spills.

`compile_ptx` gives PTX; nvJitLink assembles it as ptxas would and its verbose log names
the register count and spill bytes. `runtime_info` reads the same from the LTO cubin the
launcher loads, which CI asserts for every @cuda.jit kernel; `runtime_and_ptx_info` adds the
PTX of that same compile, for the kernels whose PTX is checked.
"""

import re
from dataclasses import dataclass

from numba import cuda

CC = (9, 0, "a")  # sm_90a, as impnb.launch builds for an H100 (wgmma needs the "a")


@dataclass(frozen=True)
class BuildInfo:
    ptx: str
    registers: int
    spill_bytes: int  # spill stores + loads
    stack_bytes: int  # the stack frame: local arrays left in memory (not registerized) and spills
    log: str


def link_ptx(ptx: str, arch: str = "sm_90", max_registers: int | None = None) -> str:
    """Assemble PTX with nvJitLink (registers capped at max_registers, as the kernel's
    max_registers option caps them at launch); returns its verbose info log."""
    from cuda.bindings import nvjitlink

    cap = [f"-maxrregcount={max_registers}"] if max_registers else []
    handle = nvjitlink.create(2 + len(cap), [f"-arch={arch}", "-verbose", *cap])
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
        nvjitlink.complete(handle)
        size = nvjitlink.get_info_log_size(handle)
        log = bytearray(size)
        nvjitlink.get_info_log(handle, log)
        return log.decode(errors="replace").rstrip("\x00")
    finally:
        nvjitlink.destroy(handle)


def build_info(fn, sig, cc=CC) -> BuildInfo:
    """PTX, registers and spill bytes of `fn` (a @cuda.jit kernel or its Python function)."""
    ptx, _ = cuda.compile_ptx(getattr(fn, "py_func", fn), sig, cc=cc)
    opts = getattr(fn, "targetoptions", {})
    return _parsed(ptx, link_ptx(ptx, "sm_%d%d%s" % (cc + ("",))[:3], opts.get("max_registers")))


def runtime_info(kernel, sig, cc=CC) -> BuildInfo:
    """Registers and spills of the cubin impnb.launch loads for this @cuda.jit kernel: built through
    LTO (numba's default), whose counts can differ from build_info's (no PTX kept)."""
    return runtime_and_ptx_info(kernel, sig, cc, ptx=False)[0]


def runtime_and_ptx_info(kernel, sig, cc=CC, ptx: bool = True) -> tuple[BuildInfo, BuildInfo | None]:
    """runtime_info, and with ptx the PTX of the same compile (no second numba compile, whose
    Python front end is most of a build): nvJitLink's PTX of the LTO-IR after link-time
    optimization (or numba's PTX where the kernel is not LTO), and its registers and spills as
    build_info reads them."""
    from impnb.launch.cubin import compile_code, link_cubin

    args = tuple(getattr(sig, "args", sig))  # a Signature, or the argument types
    code = compile_code(kernel, args, cc)
    runtime = _parsed("", link_cubin(kernel, args, cc, verbose=True, code=code)[1])
    if not ptx:
        return runtime, None
    arch = "sm_%d%d%s" % cc
    cap = kernel.targetoptions.get("max_registers")
    text = lto_ptx(code[0], arch, cap) if code[1] else code[0]
    return runtime, _parsed(text, link_ptx(text, arch, cap))


def lto_ptx(ltoir: bytes, arch: str = "sm_90a", max_registers: int | None = None) -> str:
    """The PTX nvJitLink makes of LTO-IR (link-time optimized, as it is before ptxas)."""
    from cuda.bindings import nvjitlink

    options = [f"-arch={arch}", "-lto", "-ptx"] + ([f"-maxrregcount={max_registers}"] if max_registers else [])
    handle = nvjitlink.create(len(options), options)
    try:
        nvjitlink.add_data(handle, nvjitlink.InputType.LTOIR, ltoir, len(ltoir), "kernel.ltoir")
        nvjitlink.complete(handle)
        text = bytearray(nvjitlink.get_linked_ptx_size(handle))
        nvjitlink.get_linked_ptx(handle, text)
        return text.decode(errors="replace").rstrip("\x00")
    finally:
        nvjitlink.destroy(handle)


def _parsed(ptx: str, log: str) -> BuildInfo:
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", log)]
    spills = [int(a) + int(b) for a, b in
              re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    stack = [int(m) for m in re.findall(r"(\d+) bytes stack frame", log)]
    return BuildInfo(ptx, max(regs, default=0), sum(spills), max(stack, default=0), log)
