"""gemv's one-step rule: the kernel that issues its loads before griddepcontrol.wait is taken
exactly where a thread's chunks fit one step, and only for quantized types."""

import pytest
from gguf import GGMLQuantizationType as T

from impnb.kernels.gemv.gemv import NO_GLU, WIDE_LOADS, choose, gemv_kernel, variant_kernel
from impnb.kernels.gemv.gemv_variants import Variant


def _kernel(t, n_tok, v, one_step):
    # as variant_kernel calls it (lru_cache keys on the call's form)
    return gemv_kernel(t, n_tok, v.span, NO_GLU, False, v.unroll, v.rows, False, 0, False, one_step, False, False)


def _one_step(t, n_tok, v, cols) -> bool:
    k = variant_kernel(t, n_tok, v, cols=cols)
    one, looped = _kernel(t, n_tok, v, True), _kernel(t, n_tok, v, False)
    assert k in (one, looped)
    return k is one


@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.F16, T.F32])
def test_one_step_where_the_chunks_fit(t):
    for cols in (256, 576, 640, 1024, 1536, 2048, 4096, 14336):
        for n_tok in (1, 2, 8):
            v = choose(t, n_tok, cols, 4096)
            fits = cols // 32 <= v.span * v.unroll
            assert _one_step(t, n_tok, v, cols) == (fits and t not in WIDE_LOADS), (cols, n_tok, v)


def test_small_model_shapes_take_it_and_long_rows_do_not():
    for cols in (576, 640, 1536, 2048):  # SmolLM2's and Gemma3's K
        assert _one_step(T.Q4_1, 1, choose(T.Q4_1, 1, cols, 576), cols)
    assert not _one_step(T.Q4_1, 1, Variant(32, 1, 4), 2048)  # 64 chunks, 32 threads: two steps
    assert not _one_step(T.Q4_K, 1, choose(T.Q4_K, 1, 14336, 4096), 14336)
