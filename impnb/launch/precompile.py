"""Build a model's kernels before its first launch: a dry run records the (kernel, signature)
pairs its launches need, then the cubins the disk cache lacks compile in worker processes forked
from this one (so they inherit every kernel, factory closures included), one a core, with a
progress line on stderr. Anything that fails here only leaves that kernel to compile at its first
launch, as it would without this.

compile_first compiles only the jobs a first result needs (a prompt's) before it returns and
leaves the rest compiling in the same workers (Background): a launch that needs one of those
waits for its worker (cache.pending), and Background.finish waits for the rest.
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
        self.jobs: dict[str, tuple] = {}  # in the order of their first launch
        self.first: int | None = None  # how many of them came before mark()
        self.seen: set = set()  # the launcher's (kernel, argument key)s already recorded

    def __call__(self, kernel, args) -> None:
        from impnb.launch.args import flatten  # not importable under the simulator

        launch_key = [kernel]
        flatten(args, launch_key, [])
        launch_key = tuple(launch_key)
        if launch_key in self.seen:  # a dry run launches the same pair thousands of times
            return
        self.seen.add(launch_key)
        sig = signature(args)
        key = cache.cache_key(kernel, sig, self.cc)
        if key is not None:
            self.jobs.setdefault(key, (kernel, sig))

    def mark(self) -> None:
        """The pairs recorded so far are what a first result needs (compile_first's first part)."""
        self.first = len(self.jobs)

    def missing(self) -> list[tuple]:
        """(kernel, sig, cc) of the recorded pairs whose cubin is not on disk."""
        return [(k, sig, self.cc) for key, (k, sig) in self.jobs.items()
                if not cache.cubin_path(k, key).is_file()]

    def missing_split(self) -> tuple[list[tuple], list[tuple]]:
        """missing(), as (those recorded before mark(), those after); all first without a mark."""
        first = len(self.jobs) if self.first is None else self.first
        parts = ([], [])
        for i, (key, (k, sig)) in enumerate(self.jobs.items()):
            if not cache.cubin_path(k, key).is_file():
                parts[i >= first].append((k, sig, self.cc))
        return parts

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
    """`impnb: compiling kernels i/n` (or another `what`) on stderr: rewritten in place on a
    terminal, else a line at most every few seconds and at the end."""

    def __init__(self, total: int, stream=None, what: str = "compiling kernels"):
        self.total, self.done, self.stream, self.what = total, 0, stream or sys.stderr, what
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
        self.stream.write(f"{chr(13) if self.tty else ''}impnb: {self.what} {self.done}/{self.total}{end}")
        self.stream.flush()


def _compile_one(i: int) -> int:
    kernel, sig, cc = _jobs[i]
    cache.get_cubin(kernel, sig, cc)  # compiles and writes the cache file
    return i


def _fork_pool(n_workers: int) -> ProcessPoolExecutor:
    with warnings.catch_warnings():  # fork in a threaded process: the workers only compile
        warnings.simplefilter("ignore", DeprecationWarning)
        return ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("fork"))


def _kill(pool: ProcessPoolExecutor) -> None:
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _wait_all(futures, progress: Progress) -> int:
    """Wait for futures, a progress step each; how many failed. TimeoutError when none finishes
    for STALL_S."""
    failed = 0
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=STALL_S, return_when=FIRST_COMPLETED)
        if not done:
            raise TimeoutError(f"no kernel finished compiling in {STALL_S} s")
        for future in done:
            if future.cancelled() or future.exception() is not None:
                failed += 1
                log.info("precompile: %s", "cancelled" if future.cancelled() else future.exception())
            progress.step()
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
    return compile_first(jobs, [], n_workers, stream)[0]


def _compile_here(jobs: list[tuple], stream) -> int:
    """jobs compiled one by one in this process; how many failed."""
    progress, failed = Progress(len(jobs), stream), 0
    for kernel, sig, cc in jobs:
        try:
            cache.get_cubin(kernel, sig, cc)
        except Exception as e:
            failed += 1
            log.info("precompile: %s", e)
        progress.step()
    return failed


class Background:
    """Jobs compiling in a pool's forked workers while this process goes on: a launch that needs
    one waits for its worker (cache.pending); finish() waits for the rest."""

    def __init__(self, pool: ProcessPoolExecutor, futures: dict):
        self.pool, self.futures = pool, futures  # cache key -> Future
        cache.pending.update(futures)

    def finish(self, stream=None) -> int:
        """Wait for every job, with `impnb: finishing the kernel cache i/n` on stderr while any
        is left; how many failed. The workers are killed if the wait is interrupted or stuck."""
        global _jobs
        try:
            left = [f for f in self.futures.values() if not f.done()]
            failed = sum(1 for f in self.futures.values()
                         if f.done() and (f.cancelled() or f.exception() is not None))
            if left:
                progress = Progress(len(self.futures), stream, "finishing the kernel cache")
                progress.done = len(self.futures) - len(left)
                failed += _wait_all(left, progress)
            self.pool.shutdown()
            return failed
        except BaseException:
            _kill(self.pool)
            raise
        finally:
            self._forget()
            _jobs = []

    def abandon(self) -> None:
        """Stop the workers; what they had not compiled is left to its first launch."""
        global _jobs
        _kill(self.pool)
        self._forget()
        _jobs = []

    def _forget(self) -> None:
        for key in self.futures:
            cache.pending.pop(key, None)


def compile_first(first: list[tuple], rest: list[tuple], n_workers: int | None = None,
                  stream=None) -> tuple[int, Background | None]:
    """Compile the `first` jobs before returning and leave the `rest` compiling in the same forked
    workers: (how many of `first` failed, the Background of the rest, or None when nothing is
    left: no rest, or, without fork or a second core or when the pool broke, everything compiled
    here)."""
    global _jobs
    jobs = list(first) + list(rest)
    if not jobs:
        return 0, None
    n_workers = min(n_workers or workers(), len(jobs))
    if n_workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return _compile_here(jobs, stream), None
    _jobs = jobs  # the workers fork at the first submit and keep their copy
    pool = _fork_pool(n_workers)
    try:
        futures = [pool.submit(_compile_one, i) for i in range(len(first))]
        later = {cache.cache_key(*job): pool.submit(_compile_one, len(first) + i) for i, job in enumerate(rest)}
        failed = _wait_all(futures, Progress(len(first), stream)) if first else 0
    except Exception as e:  # a broken or stuck pool: what is missing compiles here, one by one
        _kill(pool)
        _jobs = []
        log.warning("parallel compile failed (%s: %s); compiling in this process", type(e).__name__, e)
        return _compile_here([j for j in jobs if not cache.cubin_path(j[0], cache.cache_key(*j) or "").is_file()],
                             stream), None
    except BaseException:
        _kill(pool)
        _jobs = []
        raise
    if not later:
        pool.shutdown()
        _jobs = []
        return failed, None
    return failed, Background(pool, later)
