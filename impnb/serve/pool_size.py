"""How many KV blocks the pool gets: a number of tokens, or on the GPU a fraction of its memory
(vLLM's --gpu-memory-utilization: the pool takes what is left of that fraction once the weights
and the step buffers are allocated)."""

from impnb.errors import DeviceError, ParameterError
from impnb.models.config import ModelConfig

GPU_KV_BYTES = 2  # the GPU pool stores K/V in fp16


def kv_bytes_per_token(cfg: ModelConfig, element_bytes: int) -> int:
    """K and V of one token in every layer."""
    return cfg.n_layer * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * element_bytes


def blocks_for_tokens(n_tokens: int, block_size: int) -> int:
    if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens <= 0:
        raise ParameterError(f"the KV pool size must be a positive number of tokens, got {n_tokens!r:.40}")
    return -(-n_tokens // block_size)


def check_fraction(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ParameterError(f"{name} must be in (0, 1], got {value!r:.40}")


def blocks_for_memory(cfg: ModelConfig, block_size: int, utilization: float, free_bytes: int,
                      total_bytes: int, element_bytes: int = GPU_KV_BYTES) -> int:
    """Blocks that fit in utilization * total memory, less what is in use already (total - free:
    the weights, the step buffers, other processes); DeviceError when not one fits."""
    check_fraction("gpu_memory_utilization", utilization)
    budget = int(utilization * total_bytes) - (total_bytes - free_bytes)
    per_block = kv_bytes_per_token(cfg, element_bytes) * block_size
    n_blocks = max(budget, 0) // per_block
    if n_blocks == 0:
        raise DeviceError(f"no KV block fits in {utilization:g} of the GPU's {total_bytes / 2**30:.1f} GiB "
                          f"with {(total_bytes - free_bytes) / 2**30:.1f} GiB in use: raise "
                          f"gpu_memory_utilization or free GPU memory")
    return n_blocks


def gpu_memory() -> tuple[int, int]:
    """(free, total) bytes of the current GPU, after what this process has allocated."""
    from numba import cuda  # the GPU path only

    free, total = cuda.current_context().get_memory_info()
    return int(free), int(total)
