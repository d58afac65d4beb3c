"""Embedding kernels in numba's CUDA simulator: rows bit-equal to numpy's dequantize(row) * scale."""

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.elementwise.embedding import EMBEDDING_TYPES, embedding, embedding_ref
from impnb.kernels.common.repack import repack
from tests.test_repack import make_weight


def run_embedding(raw, ggml_type, ids, scale):
    table = repack(raw, ggml_type).to_device()
    out = cuda.to_device(np.full((len(ids), table.cols), np.nan, np.float32))
    embedding(table, cuda.to_device(ids), out, scale, 0)
    return out.copy_to_host()


@pytest.mark.parametrize("ggml_type", EMBEDDING_TYPES, ids=lambda t: t.name)
def test_embedding_is_bit_exact(ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    raw = make_weight(ggml_type, 19, 256, rng)
    ids = np.array([18, 0, 7, 7], np.int32)
    scale = float(np.sqrt(256.0)) * 1.01
    got = run_embedding(raw, ggml_type, ids, scale)
    assert np.array_equal(got, embedding_ref(raw, ggml_type, ids, scale))


def test_embedding_out_of_range_id_gives_nan_row():
    from gguf import GGMLQuantizationType as T
    raw = make_weight(T.Q8_0, 19, 256, np.random.default_rng(3))
    got = run_embedding(raw, T.Q8_0, np.array([19, 2], np.int32), 1.0)
    assert np.isnan(got[0]).all()
    assert np.array_equal(got[1], embedding_ref(raw, T.Q8_0, np.array([2]), 1.0)[0])
