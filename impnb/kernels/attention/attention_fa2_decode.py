"""FA2's decode form on the host side: one token's attention over the paged cache on the tensor-core
tiles of attention_fa2 (fa2_kernel(..., decode=True)), a block's tile rows the query heads of one
KV head, the keys split over the SMs, the splits merged by attention_wide.merge_splits.
Numpy reference: attention.attention_ref."""

import numpy as np

from impnb.kernels.attention import attention_wide
from impnb.kernels.attention.attention_fa2 import (DEFAULT_TILING, FA2_PTX, HEAD_DIMS, LOG2E, THREADS, TILINGS,
                                                   V_SLICE, WARPS, check_args, fa2_kernel, kernel_sig, shared_bytes)
from impnb.launch import launch

DECODE_HEAD_DIMS = (256, 512)  # head dims attention_fa2_decode is built and tested for
SMEM_PER_SM = 228 << 10        # shared memory of an sm_90 SM


def decode_splits(keys: int, n_head_kv: int, D: int, n_sm: int = 132, tiling: str = DEFAULT_TILING) -> int:
    """attention_fa2_decode's splits for up to `keys` keys: a block for each place the SMs' shared
    memory holds, at least one key tile a split, at most attention_wide.MAX_SPLITS."""
    BN, MT, _ = TILINGS[tiling][D]
    per_sm = max(1, SMEM_PER_SM // shared_bytes(D, BN, MT))
    blocks = n_head_kv * (D // V_SLICE.get(D, D))
    return max(1, min(n_sm * per_sm // blocks, -(-keys // BN), attention_wide.MAX_SPLITS))


def attention_fa2_decode(q, k_pool, v_pool, block_table, pos, out, partials, n_splits: int, scale: float,
                         window: int | None, softcap: float | None, stream, tiling: str = DEFAULT_TILING) -> None:
    """out (1, H, D) = attention of one token's q (1, H, D) float32 at pos (1,) over the paged cache
    (as attention_fa2), on FA2's tensor-core tiles in their decode form: a block's tile rows are the
    query heads of one KV head, its keys one of n_splits shares of the token's, the shares merged
    by attention_wide.merge_splits; partials (at least n_splits, 1, H, D + 2) float32 scratch,
    unread at n_splits 1. The key range is read from pos on the device: a captured graph stays
    valid as the context grows."""
    bf16 = check_args(q, k_pool, v_pool, block_table, pos, out, window, softcap)
    T, H, D = q.shape
    Hkv, P = k_pool.shape[2], k_pool.shape[1]
    BN, MT, q_in_regs = TILINGS[tiling][D]
    assert T == 1 and D in HEAD_DIMS and H // Hkv <= 16 * MT * WARPS, (q.shape, Hkv)
    assert 1 <= n_splits <= attention_wide.MAX_SPLITS
    assert n_splits == 1 or (partials.dtype == np.float32 and partials.shape[0] >= n_splits
                             and partials.shape[1:] == (1, H, D + 2) and partials.is_c_contiguous()), partials.shape
    launch(fa2_kernel(D, BN, MT, q_in_regs, P, bf16, decode=True), (Hkv * (D // V_SLICE.get(D, D)), n_splits),
           THREADS, stream, q, k_pool, v_pool, block_table, pos, out, partials, np.float32(scale * LOG2E),
           np.int32(window or 0), np.float32(softcap or 0.0), shared_bytes=shared_bytes(D, BN, MT))
    if n_splits > 1:
        attention_wide.merge_splits(partials, out, n_splits, stream)


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py)."""
    return [(fa2_kernel(D, *TILINGS[DEFAULT_TILING][D], 32, False, True), kernel_sig(decode=True),
             {"max_registers": 255, "ptx_contains": FA2_PTX})
            for D in DECODE_HEAD_DIMS]
