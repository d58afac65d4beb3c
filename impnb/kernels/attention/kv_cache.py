"""Paged fp16 KV cache: the layout, its numpy twin (write, gather) and the CUDA write kernel.

Per layer (B sequences, Hkv KV heads, D head dim, P = page_size tokens per page):
  k_pool      (n_pages, P, Hkv, Dk) float16
  v_pool      (n_pages, P, Hkv, Dv) float16
  block_table (B, max_pages) int32: position p of sequence b lives at
              pool[block_table[b, p // P], p % P]; entries past the live length are never read.
One block table serves every layer; pages need not be contiguous or ordered.
The runtime's pools are float16: K and V sit far inside fp16's range (|V| < 100 on the real
SmolLM2 and Gemma3 layers of tests/gpu/test_attention_real.py; Gemma's overflow is in the
residual stream, kept fp32), and fp16 keeps 3 more mantissa bits than bf16 (prefill attention's
error on those layers is ~8x lower from an fp16 cache). The prefill attention kernels also read
bf16 pools: numpy has no bfloat16, so those are uint16 arrays of bf16 bit patterns (BF16;
bf16_bits / bf16_values).
"""

import numpy as np
from numba import cuda
from numba.core import types

from impnb.launch import launch

PAGE_SIZES = (16, 32)
_THREADS = 128


BF16 = np.dtype(np.uint16)  # a pool dtype: bf16 bit patterns


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounded to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def bf16_values(b: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32, exactly."""
    return (b.astype(np.uint32) << 16).view(np.float32)


def pool_shape(n_pages: int, page_size: int, n_head_kv: int, head_dim: int) -> tuple[int, int, int, int]:
    assert page_size in PAGE_SIZES, f"page size {page_size} not in {PAGE_SIZES}"
    return n_pages, page_size, n_head_kv, head_dim


def pages_needed(n_ctx: int, page_size: int) -> int:
    return (n_ctx + page_size - 1) // page_size


def contiguous_block_table(n_seq: int, max_pages: int) -> np.ndarray:
    """(n_seq, max_pages) int32: sequence b owns pages b * max_pages ... in order."""
    return np.arange(n_seq * max_pages, dtype=np.int32).reshape(n_seq, max_pages)


def _batched(k: np.ndarray, pos: np.ndarray, block_table: np.ndarray):
    """(T, Hkv, D) / (T,) / (max_pages,) views as B = 1; (B, T, ...) pass through."""
    bt = block_table.reshape(-1, block_table.shape[-1])
    return k.reshape(bt.shape[0], -1, *k.shape[-2:]), pos.reshape(bt.shape[0], -1), bt


def kv_write_ref(k_pool: np.ndarray, v_pool: np.ndarray, block_table: np.ndarray,
                 k: np.ndarray, v: np.ndarray, pos: np.ndarray) -> None:
    """Numpy twin of kv_write: k, v (B, T, Hkv, D) float32 -> fp16 rows at pos (B, T); pos < 0 skipped."""
    k4, pos2, bt = _batched(k, pos, block_table)
    v4 = v.reshape(k4.shape[:2] + v.shape[-2:])
    page_size = k_pool.shape[1]
    for b, t in np.ndindex(*pos2.shape):
        p = int(pos2[b, t])
        if p >= 0:
            page = bt[b, p // page_size]
            k_pool[page, p % page_size] = k4[b, t].astype(np.float16)
            v_pool[page, p % page_size] = v4[b, t].astype(np.float16)


def kv_gather_ref(pool: np.ndarray, block_table_row: np.ndarray, length: int) -> np.ndarray:
    """Positions 0..length-1 of one sequence back to contiguous (length, Hkv, D) float16."""
    p = np.arange(length)
    page_size = pool.shape[1]
    return pool[block_table_row[p // page_size], p % page_size]


# grid (T, B), block 128: one block writes token t of sequence b (all KV heads of K and V);
# thread i owns elements i, i + 128, ... of the contiguous (Hkv, D) slab. pos < 0 (padding) writes nothing.
@cuda.jit
def _kv_write_kernel(k, v, pos, block_table, k_pool, v_pool):
    t = cuda.blockIdx.x
    b = cuda.blockIdx.y
    p = pos[b, t]
    if p < 0:
        return
    page_size = k_pool.shape[1]
    page = block_table[b, p // page_size]
    off = p % page_size
    Dk = k.shape[3]
    for i in range(cuda.threadIdx.x, k.shape[2] * Dk, cuda.blockDim.x):
        h = i // Dk
        d = i - h * Dk
        k_pool[page, off, h, d] = types.float16(k[b, t, h, d])
    Dv = v.shape[3]
    for i in range(cuda.threadIdx.x, v.shape[2] * Dv, cuda.blockDim.x):
        h = i // Dv
        d = i - h * Dv
        v_pool[page, off, h, d] = types.float16(v[b, t, h, d])


def _contiguous(a, dtype, ndim: int, name: str):
    assert a.dtype == dtype and a.ndim == ndim and a.is_c_contiguous(), \
        f"{name}: C-contiguous {np.dtype(dtype)} with {ndim} dims expected, got {a.dtype} {a.shape}"
    return a


def kv_write(k, v, pos, block_table, k_pool, v_pool, stream) -> None:
    """Write new K/V rows into the paged cache, converting float32 -> fp16.

    k (B, T, Hkv, Dk), v (B, T, Hkv, Dv) float32; pos (B, T) int32 (< 0: padding, skipped);
    block_table (B, max_pages) int32; pools as in the module docstring. One sequence may pass
    k (T, Hkv, D), pos (T,), block_table (max_pages,).
    """
    if k.ndim == 3:
        T = k.shape[0]
        k, v, pos = k.reshape(1, *k.shape), v.reshape(1, *v.shape), pos.reshape(1, T)
        block_table = block_table.reshape(1, block_table.size)
    _contiguous(k, np.float32, 4, "k")
    _contiguous(v, np.float32, 4, "v")
    _contiguous(pos, np.int32, 2, "pos")
    _contiguous(block_table, np.int32, 2, "block_table")
    _contiguous(k_pool, np.float16, 4, "k_pool")
    _contiguous(v_pool, np.float16, 4, "v_pool")
    B, T, Hkv, _ = k.shape
    assert pos.shape == (B, T) and block_table.shape[0] == B and v.shape[:3] == (B, T, Hkv)
    assert k_pool.shape[2:] == k.shape[2:] and v_pool.shape[2:] == v.shape[2:], "pool heads/dims differ"
    assert k_pool.shape[:2] == v_pool.shape[:2] and k_pool.shape[1] in PAGE_SIZES, "pool pages differ"
    if B and T:
        launch(_kv_write_kernel, (T, B), _THREADS, stream, k, v, pos, block_table, k_pool, v_pool)


_F4 = types.float32[:, :, :, ::1]
_H4 = types.float16[:, :, :, ::1]
_I2 = types.int32[:, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_kv_write_kernel, (_F4, _F4, _I2, _I2, _H4, _H4), {"max_registers": 64, "ptx_contains": ("cvt.rn.f16.f32",)}),
    ]
