"""MatMul.pair's choice of gemm_mmq_pair (impnb/gpu/linear.py): the row buckets tuning lists, at up
to GEMV_MAX_ROWS rows only where the gemv rows table gives Q|K the int8 GEMM, for a Q|K and a V of
two types the int8 GEMM takes."""

from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as T

from impnb.gpu.gemv_dispatch import MMQ
from impnb.gpu.linear import MatMul
from impnb.tuning import Overrides


def lin(ggml_type, multi=None, cols=4096):
    return SimpleNamespace(w=SimpleNamespace(ggml_type=ggml_type, cols=cols), multi=multi or {})


@pytest.mark.parametrize("n_tok,buckets,qk,v,n_ys,want", [
    (8, (8,), lin(T.Q4_K, {8: MMQ}), lin(T.Q6_K), 2, True),
    (6, (8,), lin(T.Q4_K, {6: MMQ}), lin(T.Q6_K), 2, True),
    (8, (8,), lin(T.Q4_K, {8: "s32u1r4"}), lin(T.Q6_K), 2, False),  # Q|K on a GEMV there
    (1, (8,), lin(T.Q4_K), lin(T.Q6_K), 2, False),                  # one sequence's GEMVs
    (8, (16,), lin(T.Q4_K, {8: MMQ}), lin(T.Q6_K), 2, False),
    (12, (16,), lin(T.Q4_K), lin(T.Q6_K), 2, True),
    (24, (16,), lin(T.Q4_K), lin(T.Q6_K), 2, False),
    (24, (8, 32), lin(T.Q4_K), lin(T.Q6_K), 2, True),
    (12, (16,), lin(T.Q4_K), lin(T.Q4_K), 2, False),                # one type: stacked, no pair
    (12, (16,), lin(T.Q4_K), lin(T.Q5_K), 2, False),                # a type the int8 GEMM lacks
    (12, (16,), lin(T.Q4_K), lin(T.Q6_K), 3, False),
    (12, (), lin(T.Q4_K), lin(T.Q6_K), 2, False),
])
def test_mmq_pair_choice(n_tok, buckets, qk, v, n_ys, want):
    mm = MatMul.__new__(MatMul)
    mm.tuning = Overrides(gemm_pair_mmq=buckets)
    assert mm._mmq_pair(n_tok, qk, n_ys, v) == want
