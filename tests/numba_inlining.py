"""Kernel builds without the copy numba throws away: numba-cuda's IR inliner (`inline=True`
device functions, most of a build's time) deep-copies each callee's IR twice, the second copy
returned to callers that all discard it; the first copy alone is what it inlines. Skipping the
second leaves the compiled code as it was (tests/test_kernel_build.py's outputs are the same
either way) and a build about a quarter shorter. Applied only to the numba-cuda whose inliner
this was read from; another version compiles as it is."""

import contextlib
import copy
import hashlib
import inspect

from numba.cuda.core import inline_closurecall

# sha1 of InlineWorker.inline_ir's source in numba-cuda 0.30.x: two copy_ir calls, the first
# return value (the second copy) unused by InlineInlinables and the typed inliner
KNOWN_INLINE_IR = "90871d54ab2f45e587233a9c57373feadd7d40ea"


class _Copier:
    """`inline_closurecall.copy` while a callee is inlined: the first copy_ir's block copies deep,
    the second's (one a block, after the first's) the blocks themselves."""

    def __init__(self):
        self.deep = self.shallow = 0

    def __getattr__(self, name):
        return getattr(copy, name)

    def deepcopy(self, x, memo=None):
        if self.deep:
            self.deep -= 1
            return copy.deepcopy(x, memo)
        if self.shallow:
            self.shallow -= 1
            return x
        return copy.deepcopy(x, memo)


def _source_hash(fn) -> str:
    return hashlib.sha1(inspect.getsource(fn).encode()).hexdigest()


@contextlib.contextmanager
def without_spare_copy():
    """Within the block, numba's inliner makes one copy of each callee's IR, not two."""
    worker = inline_closurecall.InlineWorker
    original = worker.inline_ir
    if _source_hash(original) != KNOWN_INLINE_IR:
        yield False
        return
    copier = _Copier()

    def inline_ir(self, caller_ir, block, i, callee_ir, callee_freevars, arg_typs=None):
        copier.deep = copier.shallow = len(callee_ir.blocks)
        return original(self, caller_ir, block, i, callee_ir, callee_freevars, arg_typs=arg_typs)

    saved = inline_closurecall.copy
    worker.inline_ir, inline_closurecall.copy = inline_ir, copier
    try:
        yield True
    finally:
        worker.inline_ir, inline_closurecall.copy = original, saved
