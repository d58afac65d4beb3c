"""The GPU engine on a tiny random qwen3moe (8 experts, 2 per token; Q8_0, F32, Q8_0 with a Q4_1
V) against the numpy reference and its HF transformers twin (same weights): teacher-forced decode
steps (router, expert GEMV) and a 128-token prefill (grouping, grouped tensor-core GEMM; and the
cuBLAS batched fallback), and graph replay equal to eager."""

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.sampling import SamplingParams
from impnb.synthetic import hf_from_gguf, tiny_gguf

pytestmark = pytest.mark.gpu
N_TOKENS = 128
MIN_TOP1 = 0.99
MAX_REL = 1e-2


@pytest.fixture(scope="module", params=["Q8_0", "F32", "Q8_0_V_Q4_1"])
def case(request, tmp_path_factory):
    hf, path = tiny_gguf("qwen3moe", request.param, tmp_path_factory.mktemp("tiny"), seed=3)
    if request.param != "F32":  # HF reading the same quantized file
        hf = hf_from_gguf(path)
    mf = open_model_file(path)
    ref = load_reference(mf)
    ids = np.random.default_rng(5).integers(0, ref.cfg.n_vocab, N_TOKENS).astype(np.int32)
    from impnb.engine_cuda import CudaEngine

    return ids, ref.forward(ids, ref.new_cache(N_TOKENS + 8)), hf, CudaEngine(mf, 256)


def agree(out, ref, what, margin=0.0, min_close=MIN_TOP1, min_top1=MIN_TOP1):
    """Top-1 agreement >= 99% and a per-token logit error under MAX_REL for >= 99% of tokens: at a
    near tie of two router logits (seed 3 has one 6.6e-6 apart, against a spread of 0.06) fp32
    rounding may send a token to the other expert, which moves that token's logits by ~2%.
    `margin` > 0 counts top-1 only over the tokens whose reference top-2 gap is at least that
    fraction of the largest logit: paths with int8 activations move every logit by ~4e-3 of it,
    and a tiny random model has 13-17% of its tokens nearer a tie than 1e-2; min_close: the
    fraction of tokens within MAX_REL, lower where int8 activations flip routers near a tie;
    min_top1: the top-1 agreement asked for."""
    scale = np.abs(ref).max()
    rel = np.abs(out - ref).max(-1) / scale
    top2 = np.sort(ref, -1)[:, -2:]
    decisive = top2[:, 1] - top2[:, 0] >= margin * scale
    top1 = np.mean((out.argmax(-1) == ref.argmax(-1))[decisive])
    close = np.mean(rel < MAX_REL)
    print(f"{what}: max|dlogit|/max|logit| {rel.max():.2e} (median {np.median(rel):.2e}), "
          f"top-1 agreement {top1:.3f} over {decisive.sum()} tokens, tokens within {MAX_REL}: {close:.3f}")
    assert decisive.mean() >= 0.5, "too few decisive tokens to judge top-1"
    assert top1 >= min_top1 and close >= min_close, (top1, close)


def assert_graph_equals_eager(eager, ids):
    """32 greedy steps after a 20-token prompt through the captured decode graph (programmatic
    launches) equal eager's steps bit for bit; eager: a CudaEngine with graphs off."""
    from impnb.engine_cuda import CudaEngine
    from tests.gpu.test_graphs import decode

    graphed = CudaEngine(eager.mf, 256, graphs=True, lookahead=False)
    p = SamplingParams(temperature=0)
    t_e, l_e = decode(eager, list(ids[:20]), p, 32)
    t_g, l_g = decode(graphed, list(ids[:20]), p, 32)
    assert graphed.graphs, graphed.graph_disabled
    assert t_e == t_g and np.array_equal(l_e, l_g)


def test_decode_steps_match_reference(case):
    ids, ref, _, engine = case
    engine.reset(SamplingParams(temperature=0))
    out = np.concatenate([engine.logits([t]) for t in ids])
    agree(out, ref, "decode vs reference")


def test_prefill_chunk_past_the_graphs(case):
    """A mixture of experts' prompt chunk passes the largest prefill graph's rows
    (tuning.prefill_chunk): 1500 tokens in one forward call (GEMMs, routing, grouped expert GEMMs
    and attention on 1500 rows) agree with the reference."""
    from impnb.engine_cuda import CudaEngine

    _, _, _, engine = case
    e = CudaEngine(engine.mf, 2048, graphs=False)
    assert e.m.chunk >= 1500
    ids = np.random.default_rng(6).integers(0, e.cfg.n_vocab, 1500).astype(np.int32)
    ref = load_reference(engine.mf)
    e.reset(SamplingParams(temperature=0))
    agree(e.logits(ids), ref.forward(ids, ref.new_cache(1508)), "one chunk of 1500 vs reference")


def test_prefill_matches_reference_and_hf(case):
    import torch

    ids, ref, hf, engine = case
    engine.reset(SamplingParams(temperature=0))
    out = engine.logits(ids)
    agree(out, ref, "prefill vs reference")
    with torch.no_grad():
        hf_logits = hf(torch.tensor(ids[None].astype(np.int64))).logits[0].float().numpy()
    agree(out, hf_logits, "prefill vs HF")


@pytest.mark.parametrize("dp4a", [False, True], ids=["gemv", "dp4a"])
def test_graph_decode_equals_eager(case, dp4a, monkeypatch):
    """32 greedy steps through the captured decode graph equal eager steps bit for bit (dp4a: the
    routed gate|up and every other decode GEMV of a dp4a type on gemv_dp4a, the router folded
    into attn_output's launch)."""
    ids, _, _, engine = case
    from impnb.engine_cuda import CudaEngine

    if dp4a:
        monkeypatch.setenv("IMPNB_DP4A_MIN_MB", "0")
        monkeypatch.setenv("IMPNB_DP4A_MIN_K", "0")
    eager = CudaEngine(engine.mf, 256, graphs=False)
    if dp4a and not eager.m.dp4a_linears():
        pytest.skip("no weight of a dp4a type (F32 model)")
    assert_graph_equals_eager(eager, ids)


def test_prefill_cublas_fallback(case, monkeypatch):
    """Every prefill expert GEMM on the cuBLAS batched fallback (gpu/moe_prefill.py): logits against
    the reference, and greedy steps after a 20-token prompt equal to eager bit for bit, the prompt's
    prefill graph (captured with the fallback) replayed the second time."""
    from impnb.engine_cuda import CudaEngine
    from impnb.gpu import moe_dispatch
    from tests.gpu.test_graphs import decode

    ids, ref, _, engine = case
    monkeypatch.setattr(moe_dispatch, "choose", lambda *args, **kwargs: "cublas")
    eager = CudaEngine(engine.mf, 256, graphs=False)
    eager.reset(SamplingParams(temperature=0))
    agree(eager.logits(ids), ref, "prefill (cuBLAS fallback) vs reference")
    graphed = CudaEngine(engine.mf, 256, graphs=True, lookahead=False)
    p = SamplingParams(temperature=0)
    t_e, l_e = decode(eager, list(ids[:20]), p, 32)
    for _ in range(2):  # the first prefill runs eagerly and is captured, the second replays
        t_g, l_g = decode(graphed, list(ids[:20]), p, 32)
        assert graphed.prefill_graphs, graphed.graph_disabled
        assert t_e == t_g and np.array_equal(l_e, l_g)


def test_decode_steps_on_dp4a_match_reference(case, monkeypatch):
    """Every decode GEMV of a dp4a type on gemv_dp4a, the routed gate|up experts included
    (IMPNB_DP4A_MIN_MB and _MIN_K 0), attn_output on the int8 form decode attention writes with
    the router folded into its launch (kernels/moe/router_fold.py): teacher-forced decode still
    agrees with the reference."""
    ids, ref, _, engine = case
    from impnb.engine_cuda import CudaEngine

    monkeypatch.setenv("IMPNB_DP4A_MIN_MB", "0")
    monkeypatch.setenv("IMPNB_DP4A_MIN_K", "0")
    dp4a = CudaEngine(engine.mf, 256, graphs=False)
    if not any(name.endswith("ffn_gate_up_exps") for name in dp4a.m.dp4a_linears()):
        pytest.skip("no expert weight of a dp4a type (F32 model)")
    dp4a.reset(SamplingParams(temperature=0))
    out = np.concatenate([dp4a.logits([t]) for t in ids])
    assert dp4a.m.mm.attn_xq(dp4a.m.lin["blk.0.attn_output"], dp4a.last_step, None) is not None, "attn_output not on attention's int8 form"
    assert len(dp4a.m.router_folds) == dp4a.m.cfg.n_layer, "the router not folded into attn_output"
    agree(out, ref, f"dp4a decode ({len(dp4a.m.dp4a_linears())} weights) vs reference")


def test_decode_with_the_down_writing_the_next_input(case, monkeypatch):
    """IMPNB_DOWN_QUANT_TAIL with every decode GEMV on dp4a: each layer's routed experts' down
    writes the next layer's Q|K|V input in int8 from its last block (no quantize_x between):
    teacher-forced decode agrees with the reference, and 32 greedy graph steps (programmatic
    launches, the grid's ticket counter) equal eager ones bit for bit."""
    from impnb.engine_cuda import CudaEngine
    from impnb.gpu.forward import _next_input

    ids, ref, _, engine = case
    for name, value in (("IMPNB_DP4A_MIN_MB", "0"), ("IMPNB_DP4A_MIN_K", "0"), ("IMPNB_DOWN_QUANT_TAIL", "1")):
        monkeypatch.setenv(name, value)
    tail = CudaEngine(engine.mf, 256, graphs=False)
    if not tail.m.blk[0].ffn.down_dp4a:
        pytest.skip("no expert weight of a dp4a type (F32 model)")
    if all(tail.m.blk[il].attn.qkv is None for il in range(1, tail.m.cfg.n_layer)):
        pytest.skip("no stacked Q|K|V (V in a type of its own): no layer's input to write")
    assert all(_next_input(tail.m, il, 1) is not None for il in range(tail.m.cfg.n_layer - 1))
    tail.reset(SamplingParams(temperature=0))
    out = np.concatenate([tail.logits([t]) for t in ids])
    agree(out, ref, "dp4a decode, the down writing the next input, vs reference")
    assert_graph_equals_eager(tail, ids)


def test_decode_with_separate_qkv_post(case, monkeypatch):
    """Decode with qkv_post as its own kernel after the Q|K|V GEMVs (as Qwen3-30B-A3B runs it: 8
    query heads a KV head; the tiny model's head dim 64 otherwise fuses it into attention). The
    kernel reads pos and the block table before griddepcontrol.wait: teacher-forced decode agrees
    with the reference, and 32 greedy graph steps (programmatic launches) equal eager ones bit for
    bit."""
    ids, ref, _, engine = case
    from impnb.engine_cuda import CudaEngine

    monkeypatch.setenv("IMPNB_FUSED_POST_DIMS", "")
    eager = CudaEngine(engine.mf, 256, graphs=False)
    assert not eager.m.plan.decode_post
    eager.reset(SamplingParams(temperature=0))
    agree(np.concatenate([eager.logits([t]) for t in ids]), ref, "decode (qkv_post apart) vs reference")
    assert eager.last_step.short_blocks, "teacher-forced decode not on the short attention kernel step() takes"
    assert_graph_equals_eager(eager, ids)
