"""Compile a @cuda.jit kernel for one signature to a cubin the way numba's dispatcher does, without
a GPU: the same NVVM options and output (LTO-IR when the kernel has lto=True, numba's default
with nvJitLink, else PTX), linked by cuda.core's Linker with the same arch and register cap;
numba's inliner without its spare IR copies (inlining.py)."""

import struct

from numba import cuda

from impnb.launch.inlining import without_spare_copies

# Options numba honours at launch or link time that this path does not reproduce.
UNSUPPORTED_OPTIONS = ("debug", "link", "extensions", "forceinline", "shared_memory_carveout")


def arch_cc(cc: tuple[int, int]) -> tuple[int, int, str]:
    """The target numba compiles for on a device of compute capability cc (sm_90a on an H100)."""
    return cc[0], cc[1], "a" if tuple(cc) >= (9, 0) else ""


def compile_cubin(kernel, sig: tuple, cc: tuple[int, int, str]) -> bytes:
    """The cubin of `kernel` (a @cuda.jit dispatcher) for argument types `sig` on target cc."""
    return link_cubin(kernel, sig, cc)[0]


def compile_code(kernel, sig: tuple, cc: tuple[int, int, str]) -> tuple[bytes | str, bool]:
    """numba's output for `kernel` as link_cubin links it: (LTO-IR, True) or (PTX, False)."""
    opts = kernel.targetoptions
    bad = [name for name in UNSUPPORTED_OPTIONS if opts.get(name)]
    if bad:
        raise NotImplementedError(f"launch: {kernel.__name__} is jitted with {bad}; "
                                  "launch it through numba's dispatcher")
    lto = bool(opts.get("lto"))
    with without_spare_copies():
        code, _ = cuda.compile(kernel.py_func, sig, device=False, abi="numba", cc=cc,
                               output="ltoir" if lto else "ptx", debug=False,
                               lineinfo=opts.get("lineinfo", False), fastmath=opts.get("fastmath", False),
                               opt=opts.get("opt"), launch_bounds=opts.get("launch_bounds"))
    return code, lto


def link_cubin(kernel, sig: tuple, cc: tuple[int, int, str], verbose: bool = False,
               code: tuple[bytes | str, bool] | None = None) -> tuple[bytes, str]:
    """compile_cubin's cubin and, with verbose, the linker's info log (ptxas's registers and spills).
    code: compile_code's output where the caller has it already."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    opts = kernel.targetoptions
    code, lto = code or compile_code(kernel, sig, cc)
    obj = ObjectCode.from_ltoir(code) if lto else ObjectCode.from_ptx(code)
    options = LinkerOptions(arch="sm_%d%d%s" % cc, max_register_count=opts.get("max_registers"),
                            link_time_optimization=True if lto else None, verbose=verbose or None)
    linker = Linker(obj, options=options)
    cubin = bytes(linker.link("cubin").code)
    return cubin, linker.get_info_log() if verbose else ""


def entry_name(cubin: bytes) -> str:
    """The mangled name of the one kernel in an ELF64 cubin: its FUNC symbol marked
    STO_CUDA_ENTRY (0x10) in st_other. numba's names carry a per-process counter, hence this."""
    if cubin[:5] != b"\x7fELF\x02":
        raise ValueError("not an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    # section header: name, type, flags, addr, offset, size, link, info, addralign, entsize
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _, sh_type, _, _, offset, size, link, _, _, _ in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for sym in range(offset, offset + size, 24):
            st_name, st_info, st_other = struct.unpack_from("<IBB", cubin, sym)
            if st_info & 0xF == 2 and st_other & 0x10:  # STT_FUNC, STO_CUDA_ENTRY
                names.append(cubin[strtab + st_name:cubin.index(b"\0", strtab + st_name)].decode())
    if len(names) != 1:
        raise ValueError(f"expected one kernel entry in the cubin, found {names}")
    return names[0]
