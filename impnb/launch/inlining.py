"""Kernel builds without the IR copies numba's inliner throws away (about half a build's CPU time:
a first start's compile, the build checks) and without its labels doubling.

numba-cuda inlines an `inline=True` device function (most of a kernel build's CPU time goes to
this) by running the callee's untyped passes to a fresh IR in `InlineWorker.inline_function`,
then `inline_ir` deep-copies that IR twice: a copy to splice in, as the IR "gets mutated", and a
copy of the untouched IR returned to callers that all discard it. On that untyped path the fresh
IR has no other owner, so it is spliced in as it is and neither copy is made; where inline_ir is
called with an IR that may be kept (the typed inliner), only the discarded copy is skipped.

inline_ir also moves the callee's block labels past the caller's and past numba's process-wide
largest label. A callee that inlined callees of its own has labels near that largest already, so
each such inline doubles it: over a process's kernel builds the labels reach a thousand digits and
NVVM rejects the IR ("use of undefined value '%B1031...'"). The fresh IR's labels are ranked
(0, 1, ... in the same order) before inline_ir moves them, so the labels grow by the blocks
inlined; their order, and so the code, is as before.

The code compiled is the same (tests/test_numba_inlining.py). Applied only where numba-cuda's
inliner is the one this was read from; any other version compiles as it is. The patch holds numba's
compiler lock, so no compile of another thread runs while it is in place.
"""

import contextlib
import copy
import hashlib
import inspect

from numba.cuda.core import inline_closurecall, ir, ir_utils
from numba.cuda.core.compiler_lock import global_compiler_lock

# sha1 of the two methods' source in numba-cuda 0.30.x
KNOWN_SOURCES = {"inline_ir": "90871d54ab2f45e587233a9c57373feadd7d40ea",
                 "inline_function": "71ff9c04737c574c6f1c897c43526e689976ed10"}


class _Copier:
    """`inline_closurecall.copy` while a callee is inlined: its only use there is copy_ir's
    `copy.deepcopy(block)`, called once a callee block for the copy to splice in, then once a
    block for the discarded one. `deep` of those calls copy, the next `kept` return the block."""

    def __init__(self):
        self.deep = self.kept = 0

    def __getattr__(self, name):
        return getattr(copy, name)

    def deepcopy(self, x, memo=None):
        if self.deep:
            self.deep -= 1
            return copy.deepcopy(x, memo)
        if self.kept:
            self.kept -= 1
            return x
        return copy.deepcopy(x, memo)


def ranked_labels(blocks: dict) -> dict:
    """blocks (label -> ir.Block) relabelled 0, 1, ... in their labels' order, with the jumps and
    branches; unchanged where an instruction holds labels of its own (numba's label extensions).
    Not ir_utils.rename_labels: it renumbers in topological order, which would reorder the blocks
    and so the code."""
    if ir_utils.add_offset_to_labels_extensions:
        return blocks
    rank = {label: i for i, label in enumerate(sorted(blocks))}
    for block in blocks.values():
        term = block.body[-1] if block.body else None
        # new nodes, as numba's relabelling makes: copies of an IR may share the old ones
        if isinstance(term, ir.jump_types):
            block.body[-1] = ir.Jump(rank[term.target], term.loc)
        elif isinstance(term, ir.branch_types):
            block.body[-1] = ir.Branch(term.cond, rank[term.truebr], rank[term.falsebr], term.loc)
    return {rank[label]: block for label, block in blocks.items()}


_active = False  # the patch is in place (on the thread that holds the compiler lock)


def source_hash(fn) -> str:
    return hashlib.sha1(inspect.getsource(fn).encode()).hexdigest()


def applies() -> bool:
    """Whether the installed numba-cuda's inliner is the one this was read from."""
    worker = inline_closurecall.InlineWorker
    return all(source_hash(getattr(worker, name)) == sha for name, sha in KNOWN_SOURCES.items())


@contextlib.contextmanager
def without_spare_copies():
    """Within the block numba's inliner splices in a callee's fresh IR without copying it; yields
    whether it does (False: numba-cuda is another version, left as it is)."""
    global _active
    if _active:  # already in place (a build check's compile_cubin)
        yield True
        return
    if not applies():
        yield False
        return
    worker = inline_closurecall.InlineWorker
    inline_ir, saved_copy = worker.inline_ir, inline_closurecall.copy
    copier, fresh = _Copier(), [False]

    def spliced(self, caller_ir, block, i, callee_ir, callee_freevars, arg_typs=None):
        n = len(callee_ir.blocks)
        copier.deep, copier.kept = (0, 2 * n) if fresh[0] else (n, n)
        fresh[0] = False
        return inline_ir(self, caller_ir, block, i, callee_ir, callee_freevars, arg_typs=arg_typs)

    def inline_function(self, caller_ir, block, i, function, arg_typs=None):
        # numba's inline_function, with its fresh IR marked as owned by this call alone
        callee_ir = self.run_untyped_passes(function)
        callee_ir.blocks = ranked_labels(callee_ir.blocks)
        fresh[0] = True
        return self.inline_ir(caller_ir, block, i, callee_ir, function.__code__.co_freevars,
                              arg_typs=arg_typs)

    with global_compiler_lock:
        saved = worker.inline_ir, worker.inline_function
        worker.inline_ir, worker.inline_function, inline_closurecall.copy = spliced, inline_function, copier
        _active = True
        try:
            yield True
        finally:
            _active = False
            (worker.inline_ir, worker.inline_function), inline_closurecall.copy = saved, saved_copy
