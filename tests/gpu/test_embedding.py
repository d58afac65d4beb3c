"""Embedding lookup on the GPU: rows bit-equal to numpy's dequantize(row) * float32(scale)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.elementwise.embedding import EMBEDDING_TYPES, embedding, embedding_ref
from impnb.kernels.common.repack import repack
from tests.gpu.cases import fitting
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu

TABLES = [(49152, 576), (4096, 640), (989, 2048), (4099, 1024)]  # (vocab, d): SmolLM2, Gemma3-like, odd vocabs


def check_embedding(ggml_type, vocab, d, ids, scale):
    raw = make_weight(ggml_type, vocab, d, np.random.default_rng([int(ggml_type), vocab, d]))
    table = repack(raw, ggml_type).to_device()
    stream = cuda.stream()
    out = cuda.to_device(np.full((len(ids), d), np.nan, np.float32), stream=stream)
    embedding(table, cuda.to_device(ids, stream=stream), out, scale, stream)
    got = out.copy_to_host(stream=stream)
    stream.synchronize()
    ref = embedding_ref(raw, ggml_type, ids, scale)
    assert np.array_equal(got, ref), f"{np.sum(got != ref)} values differ"



@pytest.mark.parametrize("ggml_type,vocab,d", fitting(EMBEDDING_TYPES, TABLES))
def test_embedding_bit_exact(ggml_type, vocab, d):
    rng = np.random.default_rng(vocab)
    for n_tok in (1, 3, 8, 111):
        ids = rng.integers(0, vocab, n_tok).astype(np.int32)
        ids[0] = vocab - 1
        check_embedding(ggml_type, vocab, d, ids, scale=float(np.sqrt(d)))


def test_embedding_out_of_range_id_gives_nan_row():
    raw = make_weight(T.Q8_0, 19, 576, np.random.default_rng(3))
    table = repack(raw, T.Q8_0).to_device()
    out = cuda.to_device(np.random.default_rng(4).standard_normal((3, 576)).astype(np.float32))
    embedding(table, cuda.to_device(np.array([5, 19, -1], np.int32)), out, 1.0, 0)
    got = out.copy_to_host()
    assert np.isnan(got[1:]).all()
    assert np.array_equal(got[0], embedding_ref(raw, T.Q8_0, np.array([5]), 1.0)[0])
