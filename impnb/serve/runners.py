"""The model runner for a device: the numpy reference over a paged pool on the CPU; on the GPU,
today, the single-sequence CUDA engine run one sequence at a time.

A batched GPU runner replaces SingleSequenceRunner(CudaEngine) here, with its pool sized by
pool_size.blocks_for_memory(cfg, block_size, gpu_memory_utilization, *pool_size.gpu_memory())
after its weights and step buffers are allocated (or blocks_for_tokens of kv_cache_tokens).
"""

import numpy as np

from impnb.devices import engine_class
from impnb.gguf_file import ModelFile
from impnb.models import load_reference
from impnb.models.validate import validate_model
from impnb.serve.pool_size import blocks_for_tokens
from impnb.serve.runner import ModelRunner

DEFAULT_BLOCK_SIZE = 16
CPU_POOL_CONTEXTS = 2  # the CPU pool's default size, in contexts


def make_runner(mf: ModelFile, n_ctx: int, device: str = "auto", kv_cache_tokens: int | None = None,
                block_size: int = DEFAULT_BLOCK_SIZE, graphs: bool = True,
                gpu_memory_utilization: float = 0.9) -> ModelRunner:
    """The runner for device; gpu_memory_utilization is for a batched GPU runner's pool (the
    single-sequence CUDA engine holds one context of its own)."""
    cfg = validate_model(mf)
    cls = engine_class(device, cfg.arch)
    if cls.device == "cuda":
        from impnb.serve.single_runner import SingleSequenceRunner
        from impnb.warmup import prepare

        prepare(mf, n_ctx)  # a first start compiles the model's kernels across the cores
        return SingleSequenceRunner(cls(mf, n_ctx, graphs=graphs), block_size)
    from impnb.serve.cpu_runner import CpuRunner

    n_tokens = CPU_POOL_CONTEXTS * n_ctx if kv_cache_tokens is None else kv_cache_tokens
    n_blocks = blocks_for_tokens(n_tokens, block_size)
    validate_model(mf, min(n_blocks * block_size, cfg.n_ctx), device="cpu")  # host memory, finite weights
    with np.errstate(all="ignore"):  # non-finite weights are reported at the first sample
        model = load_reference(mf)
    return CpuRunner(model, n_blocks, block_size)
