"""The GPU engine on tiny random gemma4 models (impnb/synthetic_full_gemma4.TINY_SHAPES, Q8_0,
every tensor drawn at random, norms and scales about 1, Q's and K's norms about head_dim^-1/4 so
that an fp16 cache moves the logits < 1e-3: tests/test_synthetic_full_gemma4.py) against the
numpy reference, which tests/test_reference_gemma4.py holds to HF transformers: "dense"
(E2B-like: per-layer embeddings, the last two layers reading earlier layers' cache pages, the
double-wide MLP there), "moe" (26B-A4B-like: routed GELU experts beside the MLP, K = V on the
global layers with their own KV head count) and "wide" (26B-A4B's heads of 256 and 512, 128
experts). Sliding windows 8 and 16, prompts of 96 tokens: teacher-forced decode on the short and
the split-K attention kernels and on dp4a GEMVs, prefill in one chunk and in two, and graph
replay equal to eager. The engines keep the routed experts' down in fp32 (IMPNB_MOE_DOWN_DP4A=0)
but where a test asks for dp4a: int8 activations move these models' logits by ~1e-2 of the
largest (the dp4a test's bounds), past the fp32 tests' 1e-2 for half the tokens of "wide"."""

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.sampling import SamplingParams
from impnb.synthetic_full_gemma4 import TINY_SHAPES, write_full_gguf
from impnb.tuning import PAGE_SIZE
from tests.gpu.test_engine_moe import agree, assert_graph_equals_eager

pytestmark = pytest.mark.gpu
N_TOKENS = 96


@pytest.fixture(scope="module", params=sorted(TINY_SHAPES))
def case(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / f"tiny-gemma4-{request.param}.gguf"
    write_full_gguf(path, TINY_SHAPES[request.param], seed=3, workers=1)
    mf = open_model_file(path)
    ref = load_reference(mf)
    ids = np.random.default_rng(5).integers(0, ref.cfg.n_vocab, N_TOKENS).astype(np.int32)
    from impnb.engine_cuda import CudaEngine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMPNB_MOE_DOWN_DP4A", "0")
        engine = CudaEngine(mf, 256, graphs=False)
    return ids, ref.forward(ids, ref.new_cache(N_TOKENS + 8)), engine


@pytest.fixture(autouse=True)
def down_fp32(monkeypatch):
    """The engines a test makes keep the experts' down in fp32, as the module's (see above)."""
    monkeypatch.setenv("IMPNB_MOE_DOWN_DP4A", "0")


def teacher_forced(engine, ids) -> np.ndarray:
    engine.reset(SamplingParams(temperature=0))
    return np.concatenate([engine.logits([t]) for t in ids])


def test_decode_steps_match_reference(case):
    ids, ref, engine = case
    agree(teacher_forced(engine, ids), ref, "decode vs reference")
    assert engine.last_step.short_blocks, "not on the short decode attention kernel"


def test_decode_split_attention_matches_reference(case, monkeypatch):
    """Decode attention on the split-K kernel (IMPNB_SHORT_DECODE_MAX 0), windows included."""
    from impnb.engine_cuda import CudaEngine

    ids, ref, engine = case
    monkeypatch.setenv("IMPNB_SHORT_DECODE_MAX", "0")
    split = CudaEngine(engine.mf, 256, graphs=False)
    agree(teacher_forced(split, ids), ref, "split-K decode vs reference")
    assert not split.last_step.short_blocks and split.last_step.splits


def test_decode_wide_tiled_matches_reference(case, monkeypatch):
    """Decode with the global heads of 512 ("wide") on attention_wide_tiled (IMPNB_WIDE_TILED)."""
    from impnb.engine_cuda import CudaEngine

    ids, ref, engine = case
    monkeypatch.setenv("IMPNB_WIDE_TILED", "1")
    tiled = CudaEngine(engine.mf, 256, graphs=False)
    assert tiled.m.tuning.wide_tiled
    agree(teacher_forced(tiled, ids), ref, "decode on attention_wide_tiled vs reference")


def test_window_ring_equals_whole_pools(case, monkeypatch, request):
    """One sequence's sliding layers on a ring of their window's pages (IMPNB_WINDOW_RING): a prompt
    of the model's prompt chunk and 88 tokens more, in those two chunks, and 20 decode steps wrap
    the ring (pages for the window and a chunk) and give the logits of the engine with whole pools,
    bit for bit; dense also agrees with the reference ('wide' is off it past 256 tokens, the fp16
    cache; moe's routers, at near ties over thousands of tokens, send 2-3% of them to another
    expert, as with whole pools)."""
    from impnb.engine_cuda import CudaEngine

    _, _, engine = case
    chunk = engine.m.chunk
    n = chunk + 88
    ids = np.random.default_rng(9).integers(0, engine.m.cfg.n_vocab, n + 20).astype(np.int32)
    outs = []
    for ring in ("0", "1"):
        monkeypatch.setenv("IMPNB_WINDOW_RING", ring)
        e = CudaEngine(engine.mf, 2 * chunk + 512, graphs=False)
        assert any(e.m.kv.windowed) == (ring == "1")
        sliding = next(il for il in range(e.m.cfg.n_layer) if e.m.cfg.window(il) is not None)
        assert (e.m.kv.k[sliding].shape[0] * PAGE_SIZE < n) == (ring == "1")  # the ring wraps
        e.reset(SamplingParams(temperature=0))
        outs.append(np.concatenate([e.logits(ids[:chunk]), e.logits(ids[chunk:n])]
                                   + [e.logits([t]) for t in ids[n:]]))
        del e
    assert np.isfinite(outs[0]).all()
    assert np.array_equal(outs[1].view(np.uint32), outs[0].view(np.uint32))
    if request.node.callspec.params["case"] == "dense":
        ref = load_reference(engine.mf)
        agree(outs[1], ref.forward(ids, ref.new_cache(n + 28)), "window ring vs reference")


def test_window_ring_graph_equals_eager(case):
    """With the window ring, a prompt of the model's chunk and 88 tokens more and 40 greedy steps
    through the prefill graphs (the chunk's and the 88 rows' buckets) and the decode graphs wrap
    the ring and equal eager bit for bit."""
    from impnb.engine_cuda import CudaEngine
    from tests.gpu.test_graphs import decode

    _, _, engine = case
    chunk = engine.m.chunk
    ids = list(np.random.default_rng(10).integers(0, engine.m.cfg.n_vocab, chunk + 88))
    p = SamplingParams(temperature=0)
    eager = CudaEngine(engine.mf, 2 * chunk + 512, graphs=False)
    graphed = CudaEngine(engine.mf, 2 * chunk + 512, graphs=True, lookahead=False)
    assert any(eager.m.kv.windowed) and any(graphed.m.kv.windowed)
    t_e, l_e = decode(eager, ids, p, 40)
    for _ in range(2):  # the first prefill runs eagerly and is captured, the second replays
        t_g, l_g = decode(graphed, ids, p, 40)
        assert graphed.graphs and graphed.prefill_graphs, graphed.graph_disabled
        assert t_e == t_g and np.array_equal(l_e, l_g)


@pytest.mark.parametrize("window_short", ["1", "0"], ids=["window-short", "window-split"])
def test_decode_window_short_beside_split(case, monkeypatch, window_short, request):
    """Contexts past the short kernel's range (IMPNB_SHORT_DECODE_MAX 256, 300 tokens at n_ctx
    1024): the global layers decode on the split kernel (or attention_wide), the sliding ones, whose
    windows' keys are within it, on the short kernel (WINDOW_SHORT; off: the split kernel); the
    prompt's logits (260 rows, one chunk) and teacher-forced ones over the last 40 tokens against
    the reference."""
    from impnb.engine_cuda import CudaEngine

    if request.node.callspec.params["case"] == "wide":
        pytest.skip("'wide' past 256 tokens: rounding the numpy reference's own K/V to fp16 moves its logits "
                    "by up to 1.2e-1 of the largest (median 7.5e-3), past the agreement bounds; the GPU's "
                    "9.5e-2 / 8e-3 is that (docs/EXPERIMENTS.md, 'Test models')")

    _, _, engine = case
    ref = load_reference(engine.mf)
    ids = np.random.default_rng(7).integers(0, ref.cfg.n_vocab, 300).astype(np.int32)
    want = ref.forward(ids, ref.new_cache(308))
    monkeypatch.setenv("IMPNB_SHORT_DECODE_MAX", "256")
    monkeypatch.setenv("IMPNB_WINDOW_SHORT", window_short)
    mixed = CudaEngine(engine.mf, 1024, graphs=False)
    mixed.reset(SamplingParams(temperature=0))
    agree(mixed.logits(ids[:260]), want[:260], "prefill of 260 vs reference")
    got = np.concatenate([mixed.logits([t]) for t in ids[260:]])
    agree(got, want[260:], "window short, context split vs reference")
    step = mixed.last_step
    assert step.ctx_bucket == 1024 and step.short_blocks == 0 and bool(step.window_blocks) == (window_short == "1")


@pytest.mark.parametrize("tail", ["0", "1"], ids=["tails-on-gemv", "tails-on-dp4a"])
def test_decode_on_dp4a_matches_reference(case, monkeypatch, tail):
    """Every decode GEMV of a Q8_0 weight on gemv_dp4a (int8 x), the routed experts' gate|up and
    down included, and with DP4A_TAIL the residual tails of attn_output and down (gemv_dp4a's tail
    kernel; else gemv.py's on float x). Gemma's post-norms scale every
    sublayer's output to the residual's size, so int8 inputs move these models far more than
    qwen3's: the reference with every matmul's input rounded to int8 (32-blocks, max / 127) moved
    the logits by median 2e-2 (dense), 3e-2 (moe), 8e-2 (wide, where 128 experts' routers flip),
    top-1 1.0, 1.0, 0.989 over the tokens whose top-2 gap is >= 3e-2 of the largest logit."""
    from impnb.engine_cuda import CudaEngine

    ids, ref, engine = case
    monkeypatch.setenv("IMPNB_DP4A_MIN_MB", "0")
    monkeypatch.setenv("IMPNB_DP4A_MIN_K", "0")
    monkeypatch.setenv("IMPNB_MOE_DOWN_DP4A", "1")
    monkeypatch.setenv("IMPNB_DP4A_TAIL", tail)
    dp4a = CudaEngine(engine.mf, 256, graphs=False)
    assert dp4a.m.dp4a_linears() and dp4a.m.mm.tuning.dp4a_tail == (tail == "1")
    experts = [lw.experts for lw in dp4a.m.blk if lw.experts is not None]
    assert all(ex.gate_up_dp4a and ex.down_dp4a for ex in experts), "the routed experts not on dp4a"
    out = teacher_forced(dp4a, ids)
    agree(out, ref, f"dp4a decode ({len(dp4a.m.dp4a_linears())} weights) vs reference", margin=3e-2,
          min_close=0.0, min_top1=0.97)
    assert np.median(np.abs(out - ref).max(-1)) < 0.15 * np.abs(ref).max()


def test_prefill_matches_reference(case):
    """The whole prompt as one chunk, then as two (the second over the first's cache, past the
    window). The GEMMs read x in fp16 (the reference with every matmul's input rounded so moved
    the logits by median 3e-4 to 8e-4) and the prefill attention kernels round Q and P to fp16
    (their tested error: ~1e-3 of the inputs' scale). "wide"'s 128 random experts over six
    layers amplify that rounding: their top 8 weigh nearly alike, so a re-routed token moves
    its logits by percents, and what it wrote to the cache moves the tokens after it. The
    reference under noise of 3e-4 of the attention output's largest value moved by median
    5e-2 of the largest logit there (2e-3 without the experts), hence wide is held as the dp4a
    test holds its int8 paths: top-1 over the decisive tokens and the median error."""
    ids, ref, engine = case
    wide = engine.m.cfg.n_expert >= 64
    bounds = dict(margin=3e-2, min_close=0.0, min_top1=0.97) if wide else dict(min_close=0.97)
    engine.reset(SamplingParams(temperature=0))
    one = engine.logits(ids)
    agree(one, ref, "prefill vs reference", **bounds)
    engine.reset(SamplingParams(temperature=0))
    two = np.concatenate([engine.logits(ids[:40]), engine.logits(ids[40:])])
    agree(two, ref, "prefill in two chunks vs reference", **bounds)
    for out in (one, two):
        assert np.median(np.abs(out - ref).max(-1)) < 0.15 * np.abs(ref).max()


def test_graph_decode_equals_eager(case):
    """32 greedy steps after a 20-token prompt through the captured decode graph equal eager."""
    ids, _, engine = case
    assert_graph_equals_eager(engine, ids)


def test_prefill_graph_equals_eager(case):
    """A 60-token prompt's padded chunk replayed from its prefill graph, then greedy steps: equal to eager."""
    from impnb.engine_cuda import CudaEngine
    from tests.gpu.test_graphs import decode

    ids, _, engine = case
    p = SamplingParams(temperature=0)
    t_e, l_e = decode(engine, list(ids[:60]), p, 16)
    graphed = CudaEngine(engine.mf, 256, graphs=True, lookahead=False)
    for _ in range(2):  # the first prefill runs eagerly and is captured, the second replays
        t_g, l_g = decode(graphed, list(ids[:60]), p, 16)
        assert graphed.prefill_graphs, graphed.graph_disabled
        assert t_e == t_g and np.array_equal(l_e, l_g)
