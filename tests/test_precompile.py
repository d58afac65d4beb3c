"""Parallel precompile: cubins compiled in forked workers land in the disk cache as the launcher's
own compile writes them; a failed job is counted and left to its first launch; the recorder keeps
each (kernel, signature) once and launches nothing."""

import io

import numpy as np
import pytest
from numba.cuda import types

from impnb.kernels.common.build_info import CC
from impnb.kernels.elementwise import cast, rows
from impnb.kernels.sample import step_state
from impnb.launch import cache, launcher, precompile

JOBS = [(cast._cast_f16_kernel, (types.float32[::1], types.float16[::1]), CC),
        (rows._gather_row_kernel, rows.build_signatures()[0][1].args, CC),
        (step_state._advance_kernel, step_state.build_signatures()[0][1].args, CC)]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IMPNB_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(cache, "_memory", {})
    return tmp_path / "kernels"


def test_parallel_compile_fills_the_cache_as_the_launcher_would(cache_dir):
    out = io.StringIO()
    assert precompile.compile_all(JOBS, n_workers=2, stream=out) == 0
    assert out.getvalue().splitlines()[-1] == "impnb: compiling kernels 3/3"
    for kernel, sig, cc in JOBS:
        path = cache.cubin_path(kernel, cache.cache_key(kernel, sig, cc))
        assert path.is_file()
        before = dict(cache.stats)
        cubin = cache.get_cubin(kernel, sig, cc)
        assert cache.stats["disk"] == before.get("disk", 0) + 1  # read back, not compiled again
        assert cubin[:4] == b"\x7fELF"


def test_a_failing_job_is_counted_and_the_rest_compile(cache_dir):
    bad = (cast._cast_f16_kernel, (types.int32, types.float16[::1]), CC)  # no such typing
    out = io.StringIO()
    assert precompile.compile_all([bad, JOBS[0]], n_workers=2, stream=out) == 1
    assert cache.cubin_path(JOBS[0][0], cache.cache_key(*JOBS[0])).is_file()


def test_recorder_notes_each_pair_once_and_launches_nothing(cache_dir, monkeypatch):
    # host arrays stand in for device arrays (no GPU here): typed as the launcher would type them
    monkeypatch.setattr(precompile, "signature", lambda args: JOBS[0][1])
    x = np.zeros(4, np.float32)
    with precompile.record(CC) as rec:
        for _ in range(3):
            launcher.launch(cast._cast_f16_kernel, 1, 32, 0, x, x)
    assert launcher.recorder is None
    assert len(rec.jobs) == 1
    [(kernel, sig, cc)] = rec.missing()
    assert (kernel, sig, cc) == JOBS[0]


def test_manifest_is_warm_only_when_every_cubin_is_on_disk(tmp_path):
    from impnb.warmup import _is_warm, _write_manifest

    path = tmp_path / "manifest-x.json"
    assert not _is_warm(path)
    _write_manifest(path, ["a.cubin", "b.cubin"])
    (tmp_path / "a.cubin").write_bytes(b"")
    assert not _is_warm(path)
    (tmp_path / "b.cubin").write_bytes(b"")
    assert _is_warm(path)
    path.write_text("{not json")
    assert not _is_warm(path)


def test_manifest_key_follows_context_and_settings(tmp_path, monkeypatch, cache_dir):
    from impnb.warmup import manifest_path

    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    mf = type("MF", (), {"path": str(model)})()
    a = manifest_path(mf, 4096, CC)
    assert a.parent == cache_dir and a == manifest_path(mf, 4096, CC)
    assert manifest_path(mf, 2048, CC) != a
    assert manifest_path(mf, 4096, CC, max_batch=64) not in (a, manifest_path(mf, 4096, CC, max_batch=16))
    assert manifest_path(mf, 4096, CC, max_batch=1) == a  # one sequence: the single engine's set
    monkeypatch.setenv("IMPNB_GEMV_TAIL", "0")
    assert manifest_path(mf, 4096, CC) != a


def test_a_stuck_pool_is_killed_and_the_jobs_compile_here(cache_dir, monkeypatch):
    import os
    import time

    parent, here = os.getpid(), []

    def stuck_in_workers(kernel, sig, cc):
        if os.getpid() != parent:
            time.sleep(60)
        here.append(kernel)

    monkeypatch.setattr(precompile, "STALL_S", 2)
    monkeypatch.setattr(cache, "get_cubin", stuck_in_workers)
    start = time.perf_counter()
    assert precompile.compile_all(JOBS[:2], n_workers=2, stream=io.StringIO()) == 0
    assert time.perf_counter() - start < 30
    assert here == [JOBS[0][0], JOBS[1][0]]


def test_first_jobs_compile_now_and_the_rest_behind_them(cache_dir):
    """compile_first: the first part on disk when it returns; a launch needing one of the rest
    waits for its worker and reads its file (compiles nothing itself); finish waits for the rest."""
    out = io.StringIO()
    failed, background = precompile.compile_first(JOBS[:1], JOBS[1:], n_workers=2, stream=out)
    assert failed == 0 and background is not None
    assert out.getvalue().splitlines()[0] == "impnb: compiling kernels 0/1"
    assert cache.cubin_path(JOBS[0][0], cache.cache_key(*JOBS[0])).is_file()
    assert set(cache.pending) == {cache.cache_key(*job) for job in JOBS[1:]}
    before = dict(cache.stats)
    assert cache.get_cubin(*JOBS[1])[:4] == b"\x7fELF"
    assert cache.stats["compiled"] == before.get("compiled", 0)  # the worker's file, read back
    assert cache.stats["disk"] == before.get("disk", 0) + 1
    assert background.finish(io.StringIO()) == 0
    assert not cache.pending
    for job in JOBS:
        assert cache.cubin_path(job[0], cache.cache_key(*job)).is_file()


def test_abandoned_background_leaves_its_kernels_to_their_launch(cache_dir, monkeypatch):
    import os
    import time

    parent = os.getpid()
    real = cache.get_cubin

    def slow_in_workers(kernel, sig, cc):
        if os.getpid() != parent and kernel is not JOBS[0][0]:
            time.sleep(60)
        return real(kernel, sig, cc)

    monkeypatch.setattr(cache, "get_cubin", slow_in_workers)
    failed, background = precompile.compile_first(JOBS[:1], JOBS[1:], n_workers=2, stream=io.StringIO())
    assert failed == 0
    start = time.perf_counter()
    background.abandon()
    assert not cache.pending and time.perf_counter() - start < 10
    monkeypatch.setattr(cache, "get_cubin", real)
    before = dict(cache.stats)
    assert cache.get_cubin(*JOBS[2])[:4] == b"\x7fELF"  # compiled here: no worker is left to wait for
    assert cache.stats["compiled"] == before.get("compiled", 0) + 1


def test_recorder_splits_missing_jobs_at_its_mark(cache_dir, monkeypatch):
    sigs = iter([JOBS[0][1], JOBS[1][1], JOBS[2][1]])  # a pair launched again is not typed again
    monkeypatch.setattr(precompile, "signature", lambda args: next(sigs))
    x = np.zeros(4, np.float32)
    with precompile.record(CC) as rec:
        launcher.launch(JOBS[0][0], 1, 32, 0, x, x)
        launcher.launch(JOBS[1][0], 1, 32, 0, x, x)
        rec.mark()
        launcher.launch(JOBS[0][0], 1, 32, 0, x, x)  # already in the first part
        launcher.launch(JOBS[2][0], 1, 32, 0, x, x)
    first, rest = rec.missing_split()
    assert first == JOBS[:2] and rest == JOBS[2:]
    assert rec.missing() == first + rest


@pytest.mark.parametrize("abandon", [False, True], ids=["finish", "abandon"])
def test_warmup_finish_writes_the_manifest_only_when_everything_built(cache_dir, tmp_path, abandon):
    """warmup.finish after a first-token prepare: waits for the background jobs and writes the
    manifest (a later start is warm); abandoned (an error), it writes none."""
    from impnb import warmup

    failed, background = precompile.compile_first(JOBS[:1], JOBS[1:], n_workers=2, stream=io.StringIO())
    names = [cache.cubin_path(k, cache.cache_key(k, sig, cc)).name for k, sig, cc in JOBS]
    path = cache_dir / "manifest-test.json"
    warmup._background = (background, path, names, failed)
    warmup.finish(io.StringIO(), abandon=abandon)
    assert warmup._background is None and not cache.pending
    assert warmup._is_warm(path) is (not abandon)
    warmup.finish()  # nothing left: a no-op
