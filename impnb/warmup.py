"""A model's GPU kernels built before its first token: on a start that finds them missing, a dry
run of the CUDA engine (launches recorded, none made) lists every (kernel, signature) its load,
prompt buckets, context buckets and sampler configurations need (and, for a batched engine of up
to max_batch sequences, every batch bucket's decode step); launch/precompile.py compiles the
ones the disk cache lacks across the host's cores. A manifest beside the cubins names the set,
so a warm start checks files and runs nothing. `impnb warmup -m MODEL` does it ahead of time;
IMPNB_PRECOMPILE=0 leaves every kernel to compile at its first launch.
"""

import gc
import hashlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from impnb.errors import DeviceError, GGUFError, ParameterError, UnsupportedError
from impnb.gguf_file import ModelFile
from impnb.sampling import SamplingParams

log = logging.getLogger("impnb.warmup")
MANIFEST_VERSION = "impnb-manifest-1"
# the sampler's configurations, as the decode graph keys them: greedy or not, penalty or not
CONFIGS = [SamplingParams(temperature=0), SamplingParams(),
           SamplingParams(temperature=0, repeat_penalty=1.1), SamplingParams(repeat_penalty=1.1)]


class _InertCublas:
    """cuBLAS for the dry run: no call reaches the device (its operands were never written)."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _cc() -> tuple:
    from numba import cuda

    from impnb.launch.cubin import arch_cc

    return arch_cc(cuda.current_context().device.compute_capability)


def manifest_path(mf: ModelFile, n_ctx: int, cc: tuple, tp_world: int = 1, max_batch: int = 1) -> Path:
    """The manifest of this model file, context, target, tensor-parallel size (a rank's shapes)
    and batch under the toolchain and kernel sources in use; IMPNB_* settings are in the key,
    since some choose kernels."""
    from impnb.launch.cache import cache_dir, kernels_digest, toolchain

    st = os.stat(mf.path)
    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith("IMPNB_") and k not in ("IMPNB_CACHE_DIR", "IMPNB_MODELS_DIR", "IMPNB_PRECOMPILE"))
    parts = [MANIFEST_VERSION, os.path.abspath(mf.path), st.st_size, st.st_mtime_ns, n_ctx, cc,
             toolchain(), kernels_digest(), env] + ([tp_world] if tp_world > 1 else []) \
        + ([("batch", max_batch)] if max_batch > 1 else [])
    return cache_dir() / f"manifest-{hashlib.sha256(repr(parts).encode()).hexdigest()[:32]}.json"


def _is_warm(path: Path) -> bool:
    try:
        names = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(names, list) and all(isinstance(n, str) and (path.parent / n).is_file() for n in names)


class _InertGroup:
    """A tensor-parallel group for the dry run: rank 0 of world, collectives that do nothing (every
    rank's kernels are rank 0's: the same shapes)."""

    rank, local_rank, leader = 0, 0, True

    def __init__(self, world: int):
        self.world = world

    def all_reduce(self, buf) -> None:
        pass

    def all_gather(self, part, whole) -> None:
        pass

    def broadcast(self, buf, root: int = 0) -> None:
        pass


def _same_config(a: SamplingParams, b: SamplingParams) -> bool:
    """Whether the decode graphs key a and b alike (so they launch the same sampling kernels)."""
    return (a.greedy, a.penalized) == (b.greedy, b.penalized)


def dry_run(mf: ModelFile, n_ctx: int, cc: tuple, tp_world: int = 1, max_batch: int = 1,
            first: SamplingParams | None = None):
    """The precompile.Recorder of a CUDA engine's load (a tensor-parallel rank's, for tp_world
    ranks), every prompt bucket and every context bucket's decode step under each sampler
    configuration, and with max_batch > 1 the batched engine's decode step at every batch bucket
    up to it, none of it launched; marked (Recorder.mark) after the load and the prompts (under
    `first`'s sampler configuration alone where given)."""
    from impnb.engine_cuda import CudaEngine
    from impnb.graphs import prefill as prefill_graphs
    from impnb.launch.precompile import record
    from impnb.tuning import DECODE_CTX_BUCKETS

    with record(cc) as rec:
        group = _InertGroup(tp_world) if tp_world > 1 else None
        engine = CudaEngine(mf, n_ctx, graphs=False, lookahead=False, tp_group=group)
        try:
            if engine.m.cublas is not None:
                engine.m.cublas.close()
            engine.m.cublas = engine.m.mm.cublas = _InertCublas()
            engine._checked = lambda token: 0  # nothing ran: the sampled ids are whatever memory held
            positions = sorted({min(b, n_ctx) - 2 for b in DECODE_CTX_BUCKETS if min(b, n_ctx) >= 3})
            firsts = [c for c in CONFIGS if first is not None and _same_config(c, first)] or CONFIGS
            for params in firsts + [c for c in CONFIGS if c not in firsts]:
                engine.reset(params)
                for B in (b for b in prefill_graphs.BUCKETS if b <= n_ctx):
                    engine.pos = 0
                    engine.prefill(np.ones(B, np.int32))
                if params is firsts[-1]:
                    rec.mark()  # the load and the prompt's kernels: what the first token needs
            for params in CONFIGS:
                engine.reset(params)
                for pos in positions:
                    engine.pos = pos
                    engine.step(1)  # eager: the step's launches
                    plan = engine.m.plan.decode_step(engine.m.plan.ctx_bucket(pos + 2))
                    engine._decode_launches(plan)  # the decode graph's body, its device-side advance too
        finally:
            del engine
            gc.collect()
        if max_batch > 1:
            _dry_batch(mf, n_ctx, group, max_batch, positions)
    return rec


def _dry_batch(mf: ModelFile, n_ctx: int, group, max_batch: int, positions: list) -> None:
    """The batched engine's decode steps (the launches of a batch graph's body) at every batch
    bucket up to max_batch, context bucket and sampler configuration, for a model it serves."""
    from impnb.engine_batch import BATCH_BUCKETS, CudaBatchEngine
    from impnb.tuning import PAGE_SIZE

    try:
        engine = CudaBatchEngine(mf, n_ctx, kv_tokens=PAGE_SIZE, max_batch=max_batch, graphs=False, tp_group=group)
    except UnsupportedError:  # served one sequence at a time (recurrent state, per-layer K/V)
        return
    try:
        if engine.m.cublas is not None:
            engine.m.cublas.close()
        engine.m.cublas = engine.m.mm.cublas = _InertCublas()
        for Bb in (b for b in BATCH_BUCKETS if b <= max_batch):
            for pos in positions:
                plan = engine.m.plan.decode_step(pos + 2, 1, Bb)
                for params in CONFIGS:
                    engine._batch_launches(plan, Bb, params.greedy, params.penalized)
    finally:
        del engine
        gc.collect()


_background = None  # (precompile.Background, manifest path, its names) of a prepare(first_token=params)


def prepare(mf: ModelFile, n_ctx: int, force: bool = False, n_workers: int | None = None,
            stream=None, tp_world: int = 1, max_batch: int = 1,
            first_token: SamplingParams | None = None) -> dict | None:
    """Build what the model's GPU path needs (with max_batch > 1 the batched engine's too) unless
    the manifest says it is built (or `force`); a dict of counts and seconds, or None when it is
    off or failed (kernels then compile at their first launch, as without this). first_token:
    return once the load's kernels and the prompts' under these sampling parameters are built,
    and leave the rest compiling in the background (a launch that needs one waits for it);
    finish() waits for them and writes the manifest."""
    if os.environ.get("IMPNB_PRECOMPILE", "1") == "0":
        return None
    try:
        return _prepare(mf, n_ctx, force, n_workers, stream, tp_world, max_batch, first_token)
    except (GGUFError, UnsupportedError, ParameterError, DeviceError):
        raise
    except Exception as e:  # noqa: BLE001 — any failure only means compiling at first launch
        log.warning("kernel warm-up failed (%s: %s); kernels compile at first launch", type(e).__name__, e)
        return None


def _prepare(mf: ModelFile, n_ctx: int, force: bool, n_workers: int | None, stream, tp_world: int,
             max_batch: int, first_token: SamplingParams | None) -> dict | None:
    from numba import cuda

    from impnb.launch.precompile import compile_all, compile_first

    start = time.perf_counter()
    cc = _cc()
    path = manifest_path(mf, n_ctx, cc, tp_world, max_batch)
    if not force and _is_warm(path):
        return dict(warm=True, kernels=None, compiled=0, failed=0, seconds=time.perf_counter() - start)
    try:
        rec = dry_run(mf, n_ctx, cc, tp_world, max_batch, first_token)
    except (GGUFError, UnsupportedError, ParameterError, DeviceError):
        raise  # the user's model or parameters: the one error line the real load would give
    except Exception as e:  # noqa: BLE001 — any other failure only means compiling at first launch
        log.warning("kernel warm-up's dry run failed (%s: %s); kernels compile at first launch",
                    type(e).__name__, e)
        return None
    finally:
        cuda.current_context().deallocations.clear()  # the dry engine's memory, before the real one
    if first_token is not None:
        first, rest = rec.missing_split()
        failed, background = compile_first(first, rest, n_workers, stream)
        if background is not None:
            global _background
            _background = (background, path, rec.paths(), failed)
            return dict(warm=False, kernels=len(rec.jobs), compiled=len(first) - failed, failed=failed,
                        background=len(rest), seconds=time.perf_counter() - start)
        missing = first + rest
    else:
        missing = rec.missing()
        failed = compile_all(missing, n_workers, stream)
    if not failed:
        _write_manifest(path, rec.paths())
    return dict(warm=False, kernels=len(rec.jobs), compiled=len(missing) - failed, failed=failed,
                background=0, seconds=time.perf_counter() - start)


def finish(stream=None, abandon: bool = False) -> None:
    """Wait for the kernels a prepare(first_token=params) left compiling and write the manifest
    when all of them built (abandon: stop their workers instead, leaving them to a later start).
    Nothing to do when there are none."""
    global _background
    if _background is None:
        return
    background, path, names, failed = _background
    _background = None
    if abandon:
        background.abandon()
        return
    try:
        failed += background.finish(stream)
    except Exception as e:  # noqa: BLE001 — a stuck or broken pool: a later start compiles the rest
        log.warning("kernel warm-up did not finish (%s: %s)", type(e).__name__, e)
        return
    if not failed:
        _write_manifest(path, names)


def _write_manifest(path: Path, names: list[str]) -> None:
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(names))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("kernel cache: cannot write %s (%s)", path, e)
