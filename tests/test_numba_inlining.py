"""impnb/launch/inlining.py: kernels compiled without the inliner's spare copies are the ones numba
compiles as it is (PTX equal but for the per-process ids in mangled names)."""

import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda, float32, int32, types

from impnb.kernels.elementwise import embedding
from impnb.launch.inlining import applies, without_spare_copies

pytestmark = pytest.mark.skipif(not applies(), reason="numba-cuda's inliner is not the one impnb/launch/inlining.py "
                                                      "was read from: kernel builds run without its saving")


def make_kernel(scale):
    """Nested inline device functions of several blocks, one inlined twice, closing over a value."""
    @cuda.jit(device=True, inline=True)
    def clamp(v):
        if v > float32(4.0):
            return float32(4.0)
        return v

    @cuda.jit(device=True, inline=True)
    def partial(x, i, n):
        s = float32(0.0)
        for j in range(i, n, 32):
            s += clamp(x[j] * float32(scale))
        return s

    @cuda.jit
    def kernel(x, out, n):
        i = cuda.threadIdx.x
        a = partial(x, i, n)
        b = partial(x, i + 1, n) if i < 31 else float32(0.0)
        out[i] = a - b

    return kernel


SIG = (types.float32[::1], types.float32[::1], int32)


def ptx_of(kernel, sig) -> str:
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    return re.sub(r"//[^\n]*", "", re.sub(r"_Z\w+", "NAME", ptx))


@pytest.mark.parametrize("name", ["nested", "embedding_q4_k"])
def test_the_same_ptx_without_the_copies(name):
    kernel, sig = {"nested": (make_kernel(1.5), SIG),
                   "embedding_q4_k": (embedding.embedding_kernel(T.Q4_K), embedding.build_signatures()[1][1].args)}[name]
    plain = ptx_of(kernel, sig)
    with without_spare_copies() as applied:
        fast = ptx_of(kernel, sig)
    assert applied
    assert fast == plain
    assert "NAME" in plain and len(plain) > 1000


def test_the_copies_are_left_to_other_callers():
    """Outside the block numba's inliner and its copy module are its own again, and a deepcopy
    through the patched module still copies."""
    from numba.cuda.core import inline_closurecall as icc

    before = icc.InlineWorker.inline_ir, icc.InlineWorker.inline_function, icc.copy
    with without_spare_copies():
        a = np.arange(5)
        assert icc.copy.deepcopy(a) is not a
    assert (icc.InlineWorker.inline_ir, icc.InlineWorker.inline_function, icc.copy) == before


def test_labels_grow_by_the_blocks_inlined():
    """numba's inliner moves a callee's labels past the process's largest, so a callee that inlined
    callees of its own doubles it: ten builds of a kernel inlining such a callee twice multiply it
    some 2**28 times. Within the patch they add a few hundred labels."""
    from numba.cuda.core import ir_utils

    kernel = make_kernel(2.5)
    start = ir_utils._the_max_label._value
    with without_spare_copies():
        for _ in range(10):
            cuda.compile_ptx(kernel.py_func, SIG, cc=(9, 0))
    assert ir_utils._the_max_label._value - start < 10 * 200


def test_ranked_labels_keep_the_order_and_the_jumps():
    from numba.cuda.core import ir

    from impnb.launch.inlining import ranked_labels

    loc = ir.Loc("f", 1)
    scope = ir.Scope(None, loc)
    blocks = {label: ir.Block(scope, loc) for label in (7, 300, 12, 40)}
    cond = ir.Var(scope, "c", loc)
    blocks[7].append(ir.Branch(cond, 12, 300, loc))
    blocks[12].append(ir.Jump(40, loc))
    blocks[40].append(ir.Jump(300, loc))
    blocks[300].append(ir.Return(cond, loc))
    ranked = ranked_labels(blocks)
    assert sorted(ranked) == [0, 1, 2, 3]
    assert [ranked[i] for i in range(4)] == [blocks[7], blocks[12], blocks[40], blocks[300]]
    assert (ranked[0].body[-1].truebr, ranked[0].body[-1].falsebr) == (1, 3)
    assert ranked[1].body[-1].target == 2 and ranked[2].body[-1].target == 3
