"""The model runner for a device: the numpy reference over a paged pool on the CPU (one sequence
at a time through CpuEngine's own cache where the pool cannot hold a sequence's state: hybrids'
recurrent state, Gemma 4's per-layer and shared K/V); on the GPU
the batched CUDA engine, its pool kv_cache_tokens or what gpu_memory_utilization leaves once the
weights are in (pool_size.blocks_for_memory), or for one sequence at a time (max_num_seqs 1:
the CLI; hybrids, whose recurrent state the batched engine does not hold) the single-sequence
CUDA engine, whose look-ahead decode keeps the GPU busy while the host reads each token."""

import numpy as np

from impnb.devices import engine_class
from impnb.errors import ParameterError
from impnb.gguf_file import ModelFile
from impnb.models.validate import validate_model
from impnb.serve.pool_size import blocks_for_tokens
from impnb.serve.engine import DEFAULT_MAX_NUM_SEQS
from impnb.serve.runner import ModelRunner

DEFAULT_BLOCK_SIZE = 16
CPU_POOL_CONTEXTS = 2  # the CPU pool's default size, in contexts


def make_runner(mf: ModelFile, n_ctx: int, device: str = "auto", kv_cache_tokens: int | None = None,
                block_size: int = DEFAULT_BLOCK_SIZE, graphs: bool = True,
                gpu_memory_utilization: float = 0.9, max_num_seqs: int | None = None, tp=None,
                first_token=None) -> ModelRunner:
    """The runner for device; block_size is the CPU pool's (the GPU's pages are PAGE_SIZE); tp:
    this process's tensor-parallel rank (impnb/parallel/ranks.Rank; one sequence on the GPU);
    first_token (the SamplingParams of the one sequence): a first start builds the kernels its
    prompt needs and leaves the rest compiling in the background (the caller then calls
    warmup.finish)."""
    cfg = validate_model(mf)
    cls = engine_class(device, cfg.arch, cfg)
    if tp is not None and cls.device != "cuda":
        raise ParameterError(f"--tp {tp.world} needs the GPU (device {cls.device})")
    if cls.device == "cuda":
        from impnb.models.paged_kv_cache import PagedKVPool
        from impnb.warmup import prepare

        single = max_num_seqs == 1 or not PagedKVPool.holds(cfg)  # recurrent state, per-layer or shared K/V
        if tp is None or tp.leader:  # rank 0 builds a rank's kernels; the others wait for it to join
            from impnb.engine_batch import BATCH_BUCKETS

            max_batch = 1 if single else min(max_num_seqs or DEFAULT_MAX_NUM_SEQS, BATCH_BUCKETS[-1])
            # compiled across the cores at a first start, the batch buckets' decode steps too
            prepare(mf, n_ctx, tp_world=tp.world if tp else 1, max_batch=max_batch,
                    first_token=first_token if single and tp is None else None)
        if single:
            from impnb.serve.single_runner import SingleSequenceRunner
            from impnb.warmup import finish

            try:
                return SingleSequenceRunner(cls(mf, n_ctx, graphs=graphs, tp=tp), block_size)
            except BaseException:
                finish(abandon=True)  # kernels still compiling for a runner that is not there
                raise
        return _batch_runner(mf, cfg, n_ctx, kv_cache_tokens, gpu_memory_utilization,
                             max_num_seqs or DEFAULT_MAX_NUM_SEQS, graphs, tp)
    from impnb.models import load_reference  # the numpy reference: only the CPU path loads it
    from impnb.models.paged_kv_cache import PagedKVPool

    if not PagedKVPool.holds(cfg):  # recurrent state, per-layer or shared K/V: one sequence at a time
        from impnb.engine_cpu import CpuEngine
        from impnb.serve.single_runner import SingleSequenceRunner

        return SingleSequenceRunner(CpuEngine(mf, n_ctx), block_size)
    from impnb.serve.cpu_runner import CpuRunner

    n_tokens = CPU_POOL_CONTEXTS * n_ctx if kv_cache_tokens is None else kv_cache_tokens
    n_blocks = blocks_for_tokens(n_tokens, block_size)
    validate_model(mf, min(n_blocks * block_size, cfg.n_ctx), device="cpu")  # host memory, finite weights
    with np.errstate(all="ignore"):  # non-finite weights are reported at the first sample
        model = load_reference(mf)
    return CpuRunner(model, n_blocks, block_size)


def _batch_runner(mf, cfg, n_ctx, kv_cache_tokens, utilization, max_num_seqs, graphs, tp=None) -> ModelRunner:
    from impnb.engine_batch import BATCH_BUCKETS, CudaBatchEngine
    from impnb.gpu.model import HEADROOM
    from impnb.serve.cuda_runner import CudaBatchRunner
    from impnb.serve.pool_size import blocks_for_memory, gpu_memory
    from impnb.tuning import PAGE_SIZE

    max_batch = min(max_num_seqs, BATCH_BUCKETS[-1])
    if kv_cache_tokens is None and tp is not None:
        kv_cache_tokens = _rank_pool_tokens(mf, cfg, tp, utilization)
    if kv_cache_tokens is None:
        free, total = gpu_memory()
        weights = sum(t.data.nbytes for t in mf.tensors.values())
        kv_cache_tokens = PAGE_SIZE * blocks_for_memory(cfg, PAGE_SIZE, utilization,
                                                        max(free - weights - HEADROOM, 0), total)
    n_tokens = blocks_for_tokens(kv_cache_tokens, PAGE_SIZE) * PAGE_SIZE
    engine = CudaBatchEngine(mf, n_ctx, n_tokens, max_batch, graphs=graphs, tp=tp)
    if engine.m.cublas is not None:  # made now, not at some request's first cuBLAS prefill
        engine.m.cublas.ready()
    return CudaBatchRunner(engine)


def _rank_pool_tokens(mf, cfg, tp, utilization: float) -> int:
    """A tensor-parallel rank's pool in tokens, the same on every rank (the scheduler on rank 0
    hands out pages every rank holds): utilization of the GPU's total memory less the rank's
    share of the weights, from the device's size alone (no CUDA context made before the rank's)."""
    from cuda.bindings import driver

    from impnb.gpu.model import HEADROOM
    from impnb.parallel.shard import expert_split, rank_config, split_of
    from impnb.serve.pool_size import blocks_for_memory
    from impnb.tuning import PAGE_SIZE

    driver.cuInit(0)
    err, dev = driver.cuDeviceGet(tp.local_rank)
    err2, total = driver.cuDeviceTotalMem(dev) if err == driver.CUresult.CUDA_SUCCESS else (err, 0)
    if err2 != driver.CUresult.CUDA_SUCCESS:
        raise ParameterError(f"GPU {tp.local_rank}'s memory cannot be read ({err2.name})")
    weights = sum(t.data.nbytes // (tp.world if split_of(name) else 1) for name, t in mf.tensors.items())
    rcfg = rank_config(cfg, tp.world, expert_split(mf.tensors, cfg, tp.world))
    return PAGE_SIZE * blocks_for_memory(rcfg, PAGE_SIZE, utilization, int(total) - weights - HEADROOM, int(total))
