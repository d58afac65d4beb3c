"""`impnb warmup -m MODEL`: build every kernel the model's GPU path needs into the disk cache ahead
of its first start (an image's build, a server's start-up), compiling across the host's cores."""

import sys

from impnb.devices import engine_class
from impnb.errors import DeviceError, ParameterError
from impnb.gguf_file import open_model_file
from impnb.model_registry import resolve_model
from impnb.models import model_config


def run(args) -> int:
    if args.ctx <= 0:
        raise ParameterError(f"--ctx must be > 0, got {args.ctx}")
    if args.jobs is not None and args.jobs <= 0:
        raise ParameterError(f"--jobs must be > 0, got {args.jobs}")
    if args.max_seqs is not None and args.max_seqs <= 0:
        raise ParameterError(f"--max-seqs must be > 0, got {args.max_seqs}")
    mf = open_model_file(resolve_model(args.model))
    cfg = model_config(mf)
    try:
        engine_class("cuda", cfg.arch)
    except DeviceError as e:
        raise DeviceError(f"warmup builds GPU kernels and needs a usable GPU: {e}") from None
    from impnb.engine_batch import BATCH_BUCKETS
    from impnb.launch.cache import cache_dir
    from impnb.models.paged_kv_cache import PagedKVPool
    from impnb.serve.engine import DEFAULT_MAX_NUM_SEQS
    from impnb.warmup import prepare

    n_ctx = min(args.ctx, cfg.n_ctx)
    seqs = DEFAULT_MAX_NUM_SEQS if args.max_seqs is None else args.max_seqs
    max_batch = min(seqs, BATCH_BUCKETS[-1]) if PagedKVPool.holds(cfg) else 1  # as serve's runner
    info = prepare(mf, n_ctx, force=True, n_workers=args.jobs, max_batch=max_batch)
    name = mf.get("general.name", mf.arch)
    if info is None:
        print(f"impnb: warmup: the dry run of {name} failed (see the warning above); its kernels "
              f"will compile at first launch", file=sys.stderr)
        return 1
    cached = info["kernels"] - info["compiled"] - info["failed"]
    print(f"impnb: warmup: {name} at context {n_ctx}: {info['kernels']} kernels, {info['compiled']} "
          f"compiled, {cached} already cached, {info['failed']} failed, {info['seconds']:.1f} s "
          f"({cache_dir()})", file=sys.stderr)
    return 1 if info["failed"] else 0
