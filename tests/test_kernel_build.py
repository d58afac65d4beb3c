"""Every kernel compiles for sm_90 as impnb.launch builds it (LTO-IR linked by nvJitLink; where
its PTX is checked, nvJitLink's PTX of the same LTO-IR, linked too) within its registers, with no
spills and no stack frame: a local array numba could not keep in registers (an index not known at
compile time, a loop left rolled) lands on the stack, runs from local memory and is no spill.

Kernel modules list what to build in `build_signatures()`: (kernel, signature, checks) where
checks is a dict with optional `max_registers`, `ptx_contains` (instruction substrings) and
`stack_bytes` (an allowance, commented where it is given). The cubin that runs has its wgmma
left asynchronous (no ptxas serialization warning).
"""

import importlib
import pkgutil

import pytest

import impnb.kernels
import tests.probes
from impnb.kernels.common.build_info import build_info, runtime_and_ptx_info


def _cases():
    for mod in [*pkgutil.walk_packages(impnb.kernels.__path__, "impnb.kernels."),
                *pkgutil.iter_modules(tests.probes.__path__, "tests.probes.")]:
        module = importlib.import_module(mod.name)
        # a module-level list would make every kernel in it at import, and go unchecked here
        assert not hasattr(module, "BUILD_SIGNATURES"), f"{mod.name}: make BUILD_SIGNATURES build_signatures()"
        for kernel, sig, checks in getattr(module, "build_signatures", list)():
            name = getattr(kernel, "__name__", None) or kernel.py_func.__name__
            yield pytest.param(kernel, sig, checks, id=f"{mod.name.removeprefix('impnb.kernels.')}.{name}[{sig}]")


CASES = list(_cases())

pytestmark = pytest.mark.usefixtures("numba_without_spare_copies")


def test_there_are_kernels_to_build():
    assert CASES


@pytest.mark.parametrize("kernel,sig,checks", CASES)
def test_kernel_builds_for_sm90(kernel, sig, checks):
    """A @cuda.jit kernel is checked in the cubin the launcher loads (LTO, whose registers can
    differ from compile_ptx + link's), and its PTX checks in the PTX of that same compile (one
    numba front end a kernel: most of a build's time); a bare function takes build_info's path."""
    runtime = hasattr(kernel, "targetoptions")
    ptx = None
    if runtime:
        info, ptx = runtime_and_ptx_info(kernel, sig, ptx=bool(checks.get("ptx_contains")))
        assert_within(info, checks, "runtime cubin")
        # ptxas serializes wgmma (a wait after each) where it cannot prove a warpgroup's path
        # uniform or sees an extern call; the kernels that run must keep them asynchronous
        assert "wgmma.mma_async instructions are serialized" not in info.log, info.log
    else:
        ptx = build_info(kernel, sig)
    if ptx is not None:
        assert_within(ptx, checks, "PTX")
        for needle in checks.get("ptx_contains", ()):
            assert needle in ptx.ptx, f"{needle} not in PTX"


def assert_within(info, checks, label):
    print(f"{label}: {info.registers} registers, {info.spill_bytes} spill bytes, {info.stack_bytes} stack bytes")
    assert info.registers > 0, info.log
    assert info.spill_bytes == 0, info.log
    assert info.stack_bytes <= checks.get("stack_bytes", 0), info.log
    assert info.registers <= checks.get("max_registers", 255), info.log


@pytest.mark.parametrize("every_type,in_turn", [("EVERY_TYPE", "IN_TURN"), ("ONE_STEP_EVERY_TYPE", "ONE_STEP_IN_TURN")])
def test_gemv_builds_take_every_level_with_every_type(every_type, in_turn):
    """gemv's build list is a covering, not the product of types and shapes: the shapes every type
    builds hold each token count, span and epilogue of all its shapes, and each other shape has a type."""
    from impnb.kernels.gemv import gemv

    every, turn = getattr(gemv, every_type), getattr(gemv, in_turn)
    for factor in range(3):
        assert {s[factor] for s in every} == {s[factor] for s in every + turn}
    assert max(s[0] for s in every) == gemv.MAX_T and len(gemv.DECODERS) - len(gemv.WIDE_LOADS) >= len(turn)
