"""The batched decode's qkv_post inside attention_decode_mma (tuning.BATCH_MMA_POST), recorded
without running anything (launch_trace.py): a decode step of three sequences on the tensor-core
kernel (tiny qwen3) launches no qkv_post, its attention kernels the post builds reading Q|K|V
whole from the GEMV's outputs (the tiny rows are too short for the split-K GEMMs whose partials
the kernel can add: those run in tests/gpu/test_engine_batch.py); switched off, qkv_post's launch
and the plain builds as before."""

import types as pytypes

import numpy as np
import pytest

from impnb.synthetic import tiny_gguf
from tests.sim.launch_trace import FakeCublas, Recorder
from tests.sim.test_tp_trace import HOLDER, _forwards, record_launches

PARTS_ARG = 15  # attention_decode_mma's kernel: q, k_pool, ..., k_new, v_new, parts, vcol, ...


class NamedRecorder(Recorder):
    """Recorder that also notes each kernel's name (mma_kernel names its builds by their options)."""

    def launch(self, kernel, *args, **kwargs):
        super().launch(kernel, *args, **kwargs)
        self.calls[-1]["name"] = kernel.py_func.__name__


@pytest.mark.parametrize("post", (True, False))
def test_batch_decode_post(post, tmp_path, monkeypatch):
    from impnb.engine_batch import CudaBatchEngine, DecodeRow
    from impnb.gguf_file import open_model_file
    from impnb.kernels.attention.attention_decode_mma_post import NO_PARTS
    from impnb.sampling import SamplingParams

    monkeypatch.setenv("IMPNB_SHORT_DECODE_MAX_BATCH", "1")  # three sequences past the short kernel's batches
    monkeypatch.setenv("IMPNB_BATCH_MMA_POST", "1" if post else "0")
    _, path = tiny_gguf("qwen3", "Q8_0", tmp_path, seed=1)
    rec = NamedRecorder()
    HOLDER.clear()
    record_launches(HOLDER, monkeypatch)
    HOLDER[:] = [rec]
    try:
        engine = CudaBatchEngine(open_model_file(path), 64, kv_tokens=192, max_batch=4, graphs=False)
        engine.m.cublas = engine.m.mm.cublas = FakeCublas(rec)
        engine.m.ctx.device = pytypes.SimpleNamespace(compute_capability=(9, 0))
        engine._checked = lambda token: token & 0xFFFF
        greedy = SamplingParams(temperature=0)
        pages = [np.arange(b * 2, b * 2 + 2, dtype=np.int32) for b in range(3)]
        for b in range(3):
            engine.prefill_seq(np.arange(3 + b, dtype=np.int32) + 1, 0, pages[b], greedy)
        engine.b_outs.copy_to_device(np.zeros(4, np.int32))  # nothing runs: the ids read back are these
        engine.decode([DecodeRow(5, 3 + b, pages[b], greedy, 1) for b in range(3)])
    finally:
        HOLDER.clear()
    step = _forwards(rec.calls)[-1]
    names = [c.get("name", "") for c in step]
    n_layer = engine.m.cfg.n_layer
    mma = [i for i, n in enumerate(names) if n.startswith("_decode_mma_")]
    assert len(mma) == n_layer, names
    assert all(names[i].endswith("_post_kernel") == post for i in mma), names
    assert names.count("_qkv_post_kernel") == (0 if post else n_layer), names
    for i in mma:
        args = step[i]["args"]
        assert args[PARTS_ARG + 1] == ["<i4", NO_PARTS]
        if post:  # q, k_new, v_new: the three outputs of the layer's Q|K|V GEMV, one buffer in that order
            q, k, v = args[0], args[PARTS_ARG - 2], args[PARTS_ARG - 1]
            assert q[1] == k[1] == v[1] and q[2] < k[2] < v[2], (q, k, v)
