"""CudaBatchEngine's staging of a decode step on the simulated device: each row's id, position,
block table (scratch page past its pages), sampler row and counter, and repeat-penalty ring
land in the step's device buffers; padding rows decode token 0 at position 0, greedy, into the
scratch page; a block table out of range is a ParameterError before anything is copied."""

import numpy as np
import pytest

from impnb.engine_cuda import HISTORY
from impnb.errors import ParameterError
from impnb.gguf_file import open_model_file
from impnb.kernels.sample import sample as sample_kernels
from impnb.sampling import SamplingParams
from impnb.synthetic import tiny_gguf
from impnb.tuning import PAGE_SIZE

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from impnb.engine_batch import CudaBatchEngine

    _, path = tiny_gguf("qwen3", "Q8_0", tmp_path_factory.mktemp("tiny"), seed=2)
    return CudaBatchEngine(open_model_file(path), 128, kv_tokens=16 * PAGE_SIZE, max_batch=8, graphs=False)


def poison(engine) -> None:
    m = engine.m
    for a in (m.ids, m.pos, m.kv.tables, engine.b_steps, engine.b_hist):
        a.copy_to_device(np.full(a.shape, -7, a.dtype))
    engine.b_params.copy_to_device(np.full(engine.b_params.shape, np.nan))


def test_stage_rows_and_padding(engine):
    from impnb.engine_batch import DecodeRow

    rng = np.random.default_rng(11)
    params = [SamplingParams(temperature=0.7, top_k=20, seed=9), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.1, top_p=0.8, repeat_penalty=1.3, seed=2**40 + 3)]
    pages = [rng.permutation(engine.n_pages)[:n].astype(np.int32) for n in (1, 3, engine.max_pages)]
    rows = [DecodeRow(int(rng.integers(0, 500)), int(rng.integers(0, 100)), pages[b], params[b], b + 4,
                      history=rng.integers(0, 500, 70 if b == 2 else 5)) for b in range(3)]
    for step in range(2):  # twice: the second takes the kept sampler rows
        poison(engine)
        engine._stage(rows, 4, penalty=True)
        m = engine.m
        assert m.ids.copy_to_host()[:4].tolist() == [r.token for r in rows] + [0]
        assert m.pos.copy_to_host()[:4].tolist() == [r.pos for r in rows] + [0]
        assert engine.b_steps.copy_to_host()[:4].tolist() == [4, 5, 6, -1]  # padding: not advanced
        tables = m.kv.tables.copy_to_host()[:4]
        for b in range(4):
            listed = pages[b] if b < 3 else np.zeros(0, np.int32)  # the padding row: none
            n = len(listed)
            assert np.array_equal(tables[b, :n], listed)
            assert (tables[b, n:] == engine.scratch_page).all()
        want = sample_kernels.sample_params(params + [SamplingParams(temperature=0.0)])
        assert np.array_equal(engine.b_params.copy_to_host()[:4], want)
        hist = engine.b_hist.copy_to_host()[:4]
        assert sorted(hist[2]) == sorted(rows[2].history[-HISTORY:])
        assert sorted(hist[0][hist[0] >= 0]) == sorted(rows[0].history) and (hist[3] == -1).all()


def test_bad_block_table_is_a_parameter_error(engine):
    from impnb.engine_batch import DecodeRow

    good = DecodeRow(3, 4, np.array([0, 1], np.int32), SamplingParams(temperature=0.0), 1)
    for pages in ([engine.n_pages], [-1], list(range(engine.max_pages + 1))):
        bad = DecodeRow(3, 4, np.array(pages, np.int32), SamplingParams(temperature=0.0), 1)
        with pytest.raises(ParameterError, match="block table"):
            engine._stage([good, bad], 2, penalty=False)


def test_advance_rows_moves_the_live_rows_alone():
    """The batched step's last kernel: each live row's sampled id, position + 1 and counter + 1 become
    its next input; padding rows (counter -1) keep what was staged; against advance_rows_ref."""
    from numba import cuda

    from impnb.kernels.sample import step_state

    rng = np.random.default_rng(5)
    B = 7
    outs = rng.integers(0, 50000, B).astype(np.int32)
    ids = rng.integers(0, 50000, B).astype(np.int32)
    pos = rng.integers(0, 4000, B).astype(np.int32)
    steps = rng.integers(0, 300, B).astype(np.int32)
    steps[[2, 5, 6]] = -1
    d = [cuda.to_device(a) for a in (outs, ids, pos, steps)]
    step_state.advance_rows(*d, 0)
    step_state.advance_rows_ref(outs, ids, pos, steps)
    for got, want in zip(d[1:], (ids, pos, steps)):
        assert np.array_equal(got.copy_to_host(), want)
    assert ids[2] != outs[2] and steps[5] == -1
