"""A batch's Gemma3 decode step on the simulator (launches recorded, none run): each post-norm
residual update (attn_output's and the down's, on gemv_dp4a_multi at four sequences) writes the
next normed input's int8 form itself, into the buffers the GEMV after it reads (the gate|up, the
next layer's Q|K|V, the logits), and the attention kernel its output's for attn_output, so the
step's only quantize_x launches are the first layer's Q|K|V input and each layer's activation.
The kernels' numbers: tests/sim/test_norm_rope_act.py and tests/gpu/test_norm_rope_act.py; the
engine's: tests/gpu/test_engine_batch.py."""

import types as pytypes

import numpy as np

from tests.sim.test_batch_post_trace import NamedRecorder
from tests.sim.launch_trace import FakeCublas
from tests.sim.test_tp_trace import HOLDER, _forwards, record_launches

N_SEQS = 4


def test_post_norms_write_the_next_gemvs_int8_input(gemma3_path, monkeypatch):
    from impnb.engine_batch import CudaBatchEngine, DecodeRow
    from impnb.gguf_file import open_model_file
    from impnb.sampling import SamplingParams

    rec = NamedRecorder()
    HOLDER.clear()
    record_launches(HOLDER, monkeypatch)
    HOLDER[:] = [rec]
    try:
        engine = CudaBatchEngine(open_model_file(gemma3_path), 64, kv_tokens=64 * N_SEQS, max_batch=N_SEQS,
                                 graphs=False)
        engine.m.cublas = engine.m.mm.cublas = FakeCublas(rec)
        engine.m.ctx.device = pytypes.SimpleNamespace(compute_capability=(9, 0))
        engine._checked = lambda token: token & 0xFFFF
        greedy = SamplingParams(temperature=0)
        pages = [np.arange(b * 2, b * 2 + 2, dtype=np.int32) for b in range(N_SEQS)]
        for b in range(N_SEQS):
            engine.prefill_seq(np.arange(3 + b, dtype=np.int32) + 1, 0, pages[b], greedy)
        engine.b_outs.copy_to_device(np.zeros(N_SEQS, np.int32))  # nothing runs: the ids read back are these
        engine.decode([DecodeRow(5, 3 + b, pages[b], greedy, 1) for b in range(N_SEQS)])
    finally:
        HOLDER.clear()
    step = _forwards(rec.calls)[-1]
    names = [c.get("name", "") for c in step]
    n_layer = engine.m.cfg.n_layer
    posts = [i for i, n in enumerate(names) if n == "_rms_norm_post_add_q_kernel"]
    assert len(posts) == 2 * n_layer and "_rms_norm_post_add_kernel" not in names, names
    for i in posts:
        _, reader = next((j, c) for j, c in enumerate(step[i + 1:]) if names[i + 1 + j].startswith("_gemv_dp4a"))
        assert reader["args"][1:4] == step[i]["args"][6:9], "the next GEMV reads other int8 buffers than the norm wrote"
    attns = [i for i, n in enumerate(names) if n.startswith("_decode_short_") and n.endswith("_quant_kernel")]
    assert len(attns) == n_layer, names
    for i in attns:
        reader = next(c for j, c in enumerate(step[i + 1:]) if names[i + 1 + j].startswith("_gemv_dp4a"))
        assert reader["args"][1:4] == step[i]["args"][10:13], "attn_output reads other int8 buffers than attention wrote"
    assert names.count("_quantize_x_kernel") == 1 + n_layer, names
