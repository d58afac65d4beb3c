"""FA2 prefill attention in the CUDA simulator: the GPU test's check on tiny shapes (D 64; one
case each of D 128, of D 256, whose Q fragments are reloaded per tile, and of D 512, whose blocks
own output slices; one query tile, one to two key tiles). Checks the fragment plumbing (Q, K via
ldmatrix, P from the S accumulators, V via ldmatrix.trans), the masks and the cp.async ring;
whether the hardware agrees with ptx_sim's tables is for tests/gpu/test_ptx.py."""

import pytest

from tests.gpu.test_attention_fa2 import _seed, check_fa2


@pytest.mark.parametrize("pos0,T,H,Hkv,window,softcap,std,page_size,causal,D", [
    (0, 17, 1, 1, None, None, 1.0, 32, True, 64),    # odd T, one key tile, diagonal masking
    (0, 40, 4, 1, None, None, 1.0, 16, True, 64),    # GQA 4, rows of all four warps
    (50, 20, 2, 2, 30, None, 1.0, 16, True, 64),     # window: keys 21..69, first tile partly left of it; two KV heads
    (5, 9, 1, 1, None, 5.0, 3.0, 32, True, 64),      # softcap
    (60, 8, 1, 1, None, None, 1.0, 32, False, 64),   # not causal: every query sees 68 keys
    (40, 9, 1, 1, None, 20.0, 1.0, 16, True, 128),   # D 128, softcap (GQA 2 at D 128: m16, bf16)
    (40, 9, 1, 1, 20, None, 1.0, 32, True, 256),     # D 256: 32-key tiles, keys 21..48 in two
    (40, 9, 2, 1, 8, None, 3.0, 16, True, 512),      # D 512: two output slices a head, GQA 2, keys 33..48 in one tile
])
def test_fa2(pos0, T, H, Hkv, window, softcap, std, page_size, causal, D):
    check_fa2(_seed(pos0, T, H), pos0, T, H, Hkv, D, std, window, softcap, page_size, causal)


@pytest.mark.parametrize("pos0,T,window,softcap,page_size,D", [
    (50, 20, 30, None, 16, 64),      # window across the first tile
    (40, 9, None, 20.0, 32, 128),    # D 128 softcap
])
def test_fa2_m16(pos0, T, window, softcap, page_size, D):
    """The BM 64 tiling (the default is BM 128 for D 64 and 128)."""
    check_fa2(_seed(pos0, T, D), pos0, T, 2, 1, D, 1.0, window, softcap, page_size, True, tiling="m16")


@pytest.mark.parametrize("pos0,T,window,softcap,D", [
    (70, 17, None, None, 64),     # two key tiles, the ring wraps
    (40, 9, 20, 20.0, 128),       # D 128, window and softcap
])
def test_fa2_bf16(pos0, T, window, softcap, D):
    """A bf16 cache: Q and P packed to bf16, S and O on mma.sync's bf16 form."""
    check_fa2(_seed(pos0, T, D, 16), pos0, T, 2, 1, D, 1.0, window, softcap, 32, True, kv="bf16")


@pytest.mark.parametrize("L,H,Hkv,D,window,splits,page_size", [
    (70, 4, 2, 256, 40, 2, 32),     # GQA 2, two KV heads; window: keys 30..69 over two tiles, two splits
    (70, 2, 1, 256, None, 5, 16),   # five splits of three tiles: two empty ones
    (40, 4, 1, 512, 30, 2, 32),     # D 512: two output slices a KV head, GQA 4, keys 10..39
])
def test_fa2_decode(L, H, Hkv, D, window, splits, page_size):
    """The decode form: the query heads of a KV head as tile rows, splits, their partials merged."""
    check_fa2(_seed(L, H, splits), L - 1, 1, H, Hkv, D, 1.0, window, None, page_size, True, splits=splits)
