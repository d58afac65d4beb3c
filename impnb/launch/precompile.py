"""Build a model's kernels before its first launch: a dry run records the (kernel, signature)
pairs its launches need, then the cubins the disk cache lacks compile in worker processes forked
from this one (so they inherit every kernel, factory closures included), one a core, with a
progress line on stderr. Anything that fails here only leaves that kernel to compile at its first
launch, as it would without this.
"""

import contextlib
import logging
import multiprocessing
import os
import sys
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from impnb.launch import cache

log = logging.getLogger("impnb.launch")
_jobs: list = []  # (kernel, sig, cc) for the forked workers, by index
STALL_S = 300  # a pool where no kernel finishes compiling for this long is taken as stuck


def signature(args) -> tuple:
    from impnb.launch.args import signature as numba_signature  # not importable under the simulator

    return numba_signature(args)


class Recorder:
    """The distinct (kernel, signature) pairs a dry run launches, by cache key."""

    def __init__(self, cc: tuple):
        self.cc = cc
        self.jobs: dict[str, tuple] = {}

    def __call__(self, kernel, args) -> None:
        sig = signature(args)
        key = cache.cache_key(kernel, sig, self.cc)
        if key is not None:
            self.jobs.setdefault(key, (kernel, sig))

    def missing(self) -> list[tuple]:
        """(kernel, sig, cc) of the recorded pairs whose cubin is not on disk."""
        return [(k, sig, self.cc) for key, (k, sig) in self.jobs.items()
                if not cache.cubin_path(k, key).is_file()]

    def paths(self) -> list[str]:
        return sorted(cache.cubin_path(k, key).name for key, (k, _) in self.jobs.items())


@contextlib.contextmanager
def record(cc: tuple):
    """Within: launch() records its kernel and signature and launches nothing."""
    import impnb.launch

    rec = Recorder(cc)
    if hasattr(impnb.launch, "recorder"):  # the simulator's launch
        owner = impnb.launch
    else:
        from impnb.launch import launcher as owner
    owner.recorder = rec
    try:
        yield rec
    finally:
        owner.recorder = None


class Progress:
    """`impnb: compiling kernels i/n` on stderr: rewritten in place on a terminal, else a line at
    most every few seconds and at the end."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.stream = total, 0, stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.last = 0.0
        self._show()

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self.tty or self.done == self.total or now - self.last >= 5:
            self._show()

    def _show(self) -> None:
        self.last = time.monotonic()
        end = "\n" if self.done == self.total or not self.tty else ""
        self.stream.write(f"{chr(13) if self.tty else ''}impnb: compiling kernels {self.done}/{self.total}{end}")
        self.stream.flush()


def _compile_one(i: int) -> int:
    kernel, sig, cc = _jobs[i]
    cache.get_cubin(kernel, sig, cc)  # compiles and writes the cache file
    return i


def _compile_forked(n: int, n_workers: int, progress: Progress) -> int:
    """_jobs[0..n) compiled by n_workers forked processes; how many failed. TimeoutError when
    none finishes for STALL_S (the workers are then killed)."""
    failed = 0
    with warnings.catch_warnings():  # fork in a threaded process: the workers only compile
        warnings.simplefilter("ignore", DeprecationWarning)
        pool = ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("fork"))
    try:
        pending = {pool.submit(_compile_one, i) for i in range(n)}
        while pending:
            done, pending = wait(pending, timeout=STALL_S, return_when=FIRST_COMPLETED)
            if not done:
                raise TimeoutError(f"no kernel finished compiling in {STALL_S} s")
            for future in done:
                if future.exception() is not None:
                    failed += 1
                    log.info("precompile: %s", future.exception())
                progress.step()
    except BaseException:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return failed


def workers() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def compile_all(jobs: list[tuple], n_workers: int | None = None, stream=None) -> int:
    """Compile (kernel, sig, cc) jobs into the disk cache, in parallel where fork and more than
    one core allow; returns how many failed (left to their first launch)."""
    global _jobs
    if not jobs:
        return 0
    n_workers = min(n_workers or workers(), len(jobs))
    progress = Progress(len(jobs), stream)
    failed = 0
    if n_workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        _jobs = list(jobs)
        try:
            failed = _compile_forked(len(jobs), n_workers, progress)
            return failed
        except Exception as e:  # a broken or stuck pool: what is missing compiles here, one by one
            log.warning("parallel compile failed (%s: %s); compiling in this process", type(e).__name__, e)
            jobs = [j for j in jobs if not cache.cubin_path(j[0], cache.cache_key(*j) or "").is_file()]
            progress, failed = Progress(len(jobs), stream), 0
        finally:
            _jobs = []
    for kernel, sig, cc in jobs:
        try:
            cache.get_cubin(kernel, sig, cc)
        except Exception as e:
            failed += 1
            log.info("precompile: %s", e)
        progress.step()
    return failed
