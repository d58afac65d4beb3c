"""Batched decode attention on tensor cores in the CUDA simulator: the GPU test's check on tiny
shapes (two to three sequences, tiles partly live at both ends, a window, splits with nothing to
do, softcap, both page sizes, D 64 and 128)."""

import pytest

from tests.gpu.test_attention_decode_mma import _seed, check_mma


@pytest.mark.parametrize("lengths,H,Hkv,D,window,softcap,page_size,n_splits,std", [
    ([1, 20], 4, 1, 64, None, None, 16, 1, 1.0),          # a single key; one tile, part live
    ([70, 33], 6, 2, 64, None, None, 32, 1, 3.0),         # GQA 3, two KV heads, five tiles over four warps
    ([50, 9, 100], 2, 1, 128, 30, None, 16, 2, 1.0),      # D 128, window: first tile partly left of it, two splits
    ([40], 3, 3, 64, None, 5.0, 32, 4, 1.0),              # softcap; four splits of three tiles, one empty
])
def test_mma(lengths, H, Hkv, D, window, softcap, page_size, n_splits, std):
    check_mma(_seed(len(lengths), H, D), lengths, H, Hkv, D, std, window, softcap, page_size, n_splits)


@pytest.mark.parametrize("lengths,H,Hkv,D,window,page_size", [
    ([1, 20], 4, 1, 64, None, 16),       # a group of four heads: four int8 groups of 16 a row
    ([70, 33], 6, 2, 128, 40, 32),       # GQA 3 at D 128, a window
])
def test_mma_int8_output(lengths, H, Hkv, D, window, page_size):
    """One split with the output's int8 form, bit for bit quantize_x's of the output."""
    check_mma(_seed(len(lengths), H, D, 1), lengths, H, Hkv, D, 1.0, window, None, page_size, 1, quant=True)


@pytest.mark.parametrize("lengths,D,window,page_size,stages", [
    ([40, 7], 128, None, 32, 4),       # a ring deeper than a warp's tiles, and a sequence of one tile
    ([200, 61], 128, 150, 32, 4),      # a window: its first tile partly live
    ([260], 128, None, 16, 4),         # each warp's share longer than its ring
])
def test_mma_ring_depths(lengths, D, window, page_size, stages):
    """The deeper ring ring_stages picks for a grid of few blocks."""
    check_mma(_seed(len(lengths), D, stages), lengths, 4, 2, D, 1.0, window, None, page_size, 1, stages)


@pytest.mark.parametrize("lengths,D,window,page_size,n_splits,quant", [
    ([300, 7], 64, None, 16, 1, True),     # eight warps: a warp's share two tiles, one tile's sequence
    ([200, 61], 128, 150, 32, 2, False),   # a window, two splits
])
def test_mma_wide_blocks(lengths, D, window, page_size, n_splits, quant):
    """Blocks of WIDE_WARPS warps with their rings WIDE_STAGES deep (ring_plan's blocks that own an SM)."""
    from impnb.kernels.attention.attention_decode_mma import WIDE_STAGES, WIDE_WARPS
    check_mma(_seed(len(lengths), D, 8), lengths, 4, 2, D, 1.0, window, None, page_size, n_splits, WIDE_STAGES[D],
              quant=quant, warps=WIDE_WARPS)


@pytest.mark.parametrize("lengths,H,Hkv,D,window,page_size,n_splits,quant,warps,post", [
    ([1, 20], 4, 1, 64, None, 16, 1, True, 4, (True, True, 64)),      # a sequence of the fresh key alone
    ([70, 33], 6, 2, 128, 40, 32, 2, False, 4, (False, False, 64)),   # a window, the fresh key in split 2, half rotated
    ([140, 7], 4, 2, 64, None, 16, 1, False, 8, (True, True, 48)),     # eight warps, partial NeoX rotation
    ([1, 20], 4, 1, 64, None, 16, 1, True, 4, (True, True, 64, 10, True)),   # from ten split-K partials
    ([30, 3], 4, 2, 64, None, 32, 1, False, 4, (False, True, 32, 3, False)),  # three partials, V whole
])
def test_mma_post(lengths, H, Hkv, D, window, page_size, n_splits, quant, warps, post):
    """qkv_post in front: the fresh K and V written to the cache and merged as one more part."""
    from impnb.kernels.attention.attention_decode_mma import WIDE_STAGES
    stages = WIDE_STAGES[D] if warps == 8 else None
    check_mma(_seed(len(lengths), H, D, 2), lengths, H, Hkv, D, 1.0, window, None, page_size, n_splits, stages,
              quant=quant, warps=warps, post=post)
