"""The GPU engine on tiny random Qwen3.5 hybrids (qwen35 dense, qwen35moe with the shared expert,
qwen3next with its fused ssm_ba regrouped at load;
impnb/synthetic_qwen35.py at GPU_SIZES: Gated DeltaNet layers and gated attention of head dim 256
with partial RoPE, every parameter randomised) against the numpy reference on the same file:
teacher-forced decode steps, prefill over more than one prompt chunk (the DeltaNet state carried
across chunks), a padded prompt chunk followed by decode steps (the padding leaves the state
alone), graph replay (prefill and decode graphs) equal to eager after a reset, and look-ahead
decode equal to step by step, a forced token (the queued step dropped) included.

The tiny hybrids are more sensitive to rounding than the tiny qwen3 models (emulated in numpy on
qwen35moe: int8 inputs to the experts' down projection alone move the median token's logits by
0.8% and flip 8% of top-1s; fp16 GEMM inputs, as prefill has them, flip a router near-tie now and
then, and the recurrent state carries that token's error into the next few tokens at ~20%).
So the engine here keeps the experts' down off dp4a (IMPNB_MOE_DOWN_DP4A=0: decode is then fp32
but for the fp16 KV cache, which moves logits by ~2e-4), and the MoE hybrids' prefill is held to
LOOSE against the reference: on an H200 qwen35moe Q8_0's two-chunk prefill was off by 0.26 at
worst, as the numpy reference with its GEMM inputs rounded to fp16 is (tokens 355-358 both: at
token 355 layer 0's router has its 2nd and 3rd experts 1.6e-4 apart, a logit spread of 1.05,
and the recurrent state carries the other expert's output into the next tokens; the other far
tokens are near-ties too, or heads whose k·q is near zero, whose sign the gated RMSNorm keeps;
qwen35moe F32 flips 12 of its 589 top-1s in runs of up to 5 tokens, as a near-tie carried by the
state does, with the chunked rule's error against the recurrence that of its numpy twin).
The chunk boundary itself is held tight where that noise cannot reach: the same prompt split
elsewhere gives the same logits (test_prefill_split_does_not_matter). Graphs against eager run
with the defaults too (bit for bit)."""

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.sampling import SamplingParams
from impnb.synthetic_qwen35 import tiny_gguf
from tests.gpu.test_engine_moe import agree

pytestmark = pytest.mark.gpu
N_DECODE = 96  # teacher-forced decode steps
SPLIT = 512  # a prompt split in two chunks here (the DeltaNet's tensor-core kernel takes 512 rows)
N_PROMPT = SPLIT + 77
N_CTX = 1024
LOOSE = (0.975, 3e-2, 0.97, 5e-3)  # top-1 agreement, per-token bound, share of tokens within it, median


@pytest.fixture(scope="module", params=["qwen35-Q8_0", "qwen35moe-Q8_0", "qwen35moe-F32", "qwen3next-Q8_0"])
def case(request, tmp_path_factory):
    arch, qtype = request.param.split("-")
    _, path = tiny_gguf(arch, qtype, tmp_path_factory.mktemp("tiny"), seed=3, gpu=True)
    mf = open_model_file(path)
    ref = load_reference(mf)
    ids = np.random.default_rng(5).integers(0, ref.cfg.n_vocab, N_PROMPT).astype(np.int32)
    from impnb.engine_cuda import CudaEngine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMPNB_MOE_DOWN_DP4A", "0")
        engine = CudaEngine(mf, N_CTX, graphs=False)
    return ids, ref.forward(ids, ref.new_cache(N_PROMPT + 8)), engine


def agree_prefill(out, ref, engine, what):
    """agree's bounds, LOOSE's for the MoE hybrids (router near-ties under fp16 GEMM inputs)."""
    if engine.cfg.arch == "qwen35":
        agree(out, ref, what)
        return
    min_top1, bound, min_close, max_median = LOOSE
    rel = np.abs(out - ref).max(-1) / np.abs(ref).max()
    top1, close = np.mean(out.argmax(-1) == ref.argmax(-1)), np.mean(rel < bound)
    print(f"{what}: max|dlogit|/max|logit| {rel.max():.2e} (median {np.median(rel):.2e}), "
          f"top-1 agreement {top1:.3f}, tokens within {bound}: {close:.3f}, "
          f"past it: {np.flatnonzero(rel >= bound).tolist()[:16]}")
    assert top1 >= min_top1 and close >= min_close and np.median(rel) < max_median, (top1, close, np.median(rel))


def test_engine_runs_the_hybrid_on_the_gpu(case):
    """The hybrid's layers, and on the MoE hybrids the shared expert gate folded into the decode
    (its row under the router's, the shared down on the gated GEMV at T = 1), which the decode
    tests below then run."""
    _, _, engine = case
    specs = {(s.mixer, s.ffn) for s in engine.m.layers}
    assert {mixer for mixer, _ in specs} == {"attention", "gated_deltanet"}
    assert engine.m.rec is not None and engine.lookahead
    assert all(lw.attn.q_gate is not None for s, lw in zip(engine.m.layers, engine.m.blk) if s.mixer == "attention")
    for spec, lw in zip(engine.m.layers, engine.m.blk):
        if spec.ffn == "moe_shared":
            ex = lw.ffn
            assert ex.gate_inps is not None and ex.gate_inps.w.rows == engine.cfg.n_expert + 1
            assert engine.m.mm.takes_gated(ex.shared.down, 1)


def test_decode_steps_match_reference(case):
    ids, ref, engine = case
    engine.reset(SamplingParams(temperature=0))
    out = np.concatenate([engine.logits([t]) for t in ids[:N_DECODE]])
    assert engine.last_step.n_tokens == 1
    agree(out, ref[:N_DECODE], "decode vs reference")


def test_shared_gate_fold_matches_the_gate_apart(case, monkeypatch):
    """Decode with the shared expert gate folded (the default: its logit from the router's GEMV,
    its sigmoid in the shared down's) against the gate's own GEMV and sigmoid_gate
    (IMPNB_SHARED_GATE_FOLD=0): 32 teacher-forced steps within agree's bounds of each other (the
    two differ by fp32 rounding: a layer's routed logits are the same bits either way, but that
    rounding may still send a later layer's router near a tie the other way)."""
    from impnb.engine_cuda import CudaEngine

    ids, _, folded = case
    if folded.cfg.arch == "qwen35":
        pytest.skip("no experts")
    monkeypatch.setenv("IMPNB_MOE_DOWN_DP4A", "0")
    monkeypatch.setenv("IMPNB_SHARED_GATE_FOLD", "0")
    apart = CudaEngine(folded.mf, N_CTX, graphs=False)
    assert all(lw.ffn.gate_inps is None for lw in apart.m.blk)
    runs = []
    for engine in (folded, apart):
        engine.reset(SamplingParams(temperature=0))
        runs.append(np.concatenate([engine.logits([t]) for t in ids[:32]]))
    agree(runs[0], runs[1], "shared gate folded vs apart")


def test_prefill_over_two_chunks_matches_reference(case):
    """The prompt in two chunks (512 rows, then 77): GEMMs, the conv and the token-by-token
    DeltaNet kernel, the second chunk starting from the first's states."""
    ids, ref, engine = case
    engine.reset(SamplingParams(temperature=0))
    out = np.concatenate([engine.logits(ids[:SPLIT]), engine.logits(ids[SPLIT:])])
    agree_prefill(out, ref, engine, "prefill (two chunks) vs reference")


def test_prefill_in_one_chunk_past_the_graphs_matches_reference(case):
    """The MoE hybrids' prompt chunk passes the largest graph's rows (tuning.prefill_chunk): the
    whole prompt in one forward call (GEMMs, grouped expert GEMMs and the DeltaNet on 589 rows)."""
    ids, ref, engine = case
    if engine.m.chunk < len(ids):
        pytest.skip(f"a prompt chunk of {engine.m.chunk} rows (a dense model)")
    engine.reset(SamplingParams(temperature=0))
    agree_prefill(engine.logits(ids), ref, engine, "prefill (one chunk) vs reference")


def test_prefill_split_does_not_matter(case, monkeypatch):
    """The prompt as 512 + 77 rows and as 300 + 289 rows, the DeltaNet token by token in both
    (IMPNB_GDN_CHUNKED_MIN_ROWS=0; by default a 512-row chunk takes the tensor-core kernel and a
    300-row one does not, whose fp16 operands alone move logits by ~1e-3): the same logits within
    1e-3 for 98% of the tokens (a router near a tie flips on rounding: 6 of 589 on qwen35moe on
    the H200) and within 1e-2 for the 8 after either split, where a state or conv window carried
    wrong across a chunk boundary would show (the token-by-token kernel gives the same bits however
    a prompt is split; the GEMMs' and attention's rows move by rounding alone, ~1e-6, far below
    the router ties that move the comparison with the reference)."""
    from impnb.engine_cuda import CudaEngine

    ids, _, eager = case
    monkeypatch.setenv("IMPNB_MOE_DOWN_DP4A", "0")
    monkeypatch.setenv("IMPNB_GDN_CHUNKED_MIN_ROWS", "0")
    engine = CudaEngine(eager.mf, N_CTX, graphs=False)
    assert engine.m.tuning.gdn_chunked_min_rows == 0
    runs = []
    for split in (SPLIT, 300):
        engine.reset(SamplingParams(temperature=0))
        runs.append(np.concatenate([engine.logits(ids[:split]), engine.logits(ids[split:])]))
    rel = np.abs(runs[0] - runs[1]).max(-1) / np.abs(runs[0]).max()
    after = np.r_[300:308, SPLIT:SPLIT + 8]
    print(f"split 512 vs 300: max {rel.max():.2e}, median {np.median(rel):.2e}, after the splits "
          f"{rel[after].max():.2e}")
    assert np.mean(rel < 1e-3) >= 0.98 and rel[after].max() < 1e-2, np.flatnonzero(rel >= 1e-3)


def test_reset_starts_from_zero_state(case):
    """The same short prompt twice with a reset between: equal logits bit for bit (the states
    zeroed, not carried from the first run)."""
    ids, _, engine = case
    runs = []
    for _ in range(2):
        engine.reset(SamplingParams(temperature=0))
        runs.append(engine.logits(ids[:40]))
    assert np.array_equal(runs[0], runs[1])


def test_padded_prompt_then_decode_matches_reference(case):
    """prefill() pads a 300-token prompt to its 512-row bucket: its sampled token is one of the
    reference's top two, and teacher-forced decode after it agrees with the reference (padded
    rows left the conv and delta-rule states alone)."""
    ids, ref, engine = case
    n = 300
    engine.reset(SamplingParams(temperature=0))
    token = engine.prefill(ids[:n])
    assert token in np.argsort(ref[n - 1])[-2:], (token, np.argsort(ref[n - 1])[-2:])  # the greedy one, or a near tie
    out = np.concatenate([engine.logits([t]) for t in ids[n:n + 32]])
    agree_prefill(out, ref[n:n + 32], engine, "decode after a padded prompt chunk vs reference")


@pytest.mark.parametrize("defaults", [False, True], ids=["down_fp32", "defaults"])
def test_graphs_equal_eager(case, defaults, monkeypatch):
    """32 greedy steps after a 20-token prompt (its 32-row prefill graph, captured on the first
    run and replayed on the second, and the decode graph) equal eager's bit for bit, twice: the
    states reset between runs. defaults: both engines with the experts' down on dp4a."""
    from impnb.engine_cuda import CudaEngine
    from tests.gpu.test_graphs import decode

    ids, _, eager = case
    if not defaults:
        monkeypatch.setenv("IMPNB_MOE_DOWN_DP4A", "0")
    else:
        eager = CudaEngine(eager.mf, N_CTX, graphs=False)
    graphed = CudaEngine(eager.mf, N_CTX, graphs=True, lookahead=False)  # logits read after each step
    p = SamplingParams(temperature=0)
    t_e, l_e = decode(eager, list(ids[:20]), p, 32)
    for _ in range(2):
        t_g, l_g = decode(graphed, list(ids[:20]), p, 32)
        assert graphed.graphs and graphed.prefill_graphs, graphed.graph_disabled
        assert t_e == t_g and np.array_equal(l_e, l_g)


def test_sampled_graphs_equal_eager(case):
    """Seeded sampling with a repeat penalty through the graphs equals eager's draws."""
    from impnb.engine_cuda import CudaEngine
    from tests.gpu.test_graphs import decode

    ids, _, eager = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMPNB_MOE_DOWN_DP4A", "0")
        graphed = CudaEngine(eager.mf, N_CTX, graphs=True, lookahead=False)
    p = SamplingParams(temperature=0.8, seed=3, repeat_penalty=1.1)
    t_e, l_e = decode(eager, list(ids[:20]), p, 24)
    t_g, l_g = decode(graphed, list(ids[:20]), p, 24)
    assert graphed.graphs, graphed.graph_disabled
    assert t_e == t_g and np.array_equal(l_e, l_g)


def test_lookahead_equals_step_by_step(case):
    """Look-ahead decode (each step queued on the device's own token) gives step by step's tokens;
    a forced token drops the queued step, which read one slot of the state pair and wrote the
    other, and decode continues from the state before it (gpu/recurrent.py)."""
    from impnb.engine_cuda import CudaEngine

    ids, _, eager = case
    params = SamplingParams(temperature=0.8, seed=5, repeat_penalty=1.1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMPNB_MOE_DOWN_DP4A", "0")
        plain = CudaEngine(eager.mf, N_CTX, graphs=True, lookahead=False)
        ahead = CudaEngine(eager.mf, N_CTX, graphs=True, lookahead=True)
    runs = []
    for engine in (eager, plain, ahead):
        engine.reset(params)
        token = engine.prefill(list(ids[:20]))
        out = []
        for i in range(24):
            token = engine.step(token if i not in (7, 12, 13) else int(ids[100 + i]))  # forced tokens
            out.append(token)
        runs.append(out)
    assert runs[0] == runs[1] == runs[2]
    assert ahead.ahead is not None  # the last step queued one ahead


def test_decode_steps_on_dp4a_match_reference(case, monkeypatch):
    """Every decode GEMV of a dp4a type on gemv_dp4a (IMPNB_DP4A_MIN_MB and _MIN_K 0; the routed
    experts' down kept fp32 as in this module's engines): the DeltaNet layers' stacked Q|K|V|Z
    (and the attention layers' Q|K|V) as one plain GEMV into the joint buffer of their outputs
    (MatMul.split), ahead of the conv fused into gdn_decode: its outputs against the float split's,
    at three magnitudes; then teacher-forced decode against the reference, with bounds for int8
    activations everywhere."""
    from impnb.engine_cuda import CudaEngine

    ids, ref, engine = case
    monkeypatch.setenv("IMPNB_DP4A_MIN_MB", "0")
    monkeypatch.setenv("IMPNB_DP4A_MIN_K", "0")
    monkeypatch.setenv("IMPNB_MOE_DOWN_DP4A", "0")
    dp4a = CudaEngine(engine.mf, N_CTX, graphs=False)
    stacked = [n for n in dp4a.m.dp4a_linears() if n.endswith("ssm_qkvz")]
    if not stacked:
        pytest.skip("no stacked Q|K|V|Z of a dp4a type (F32 model)")
    m, d = dp4a.m, dp4a.m.cfg.deltanet
    widths = (d.conv_channels, d.n_v_heads * d.head_v_dim)
    rng = np.random.default_rng(12)
    for std in (0.1, 1.0, 10.0):  # the joint GEMV's outputs against gemv_stacked's float split
        x = m.ctx.upload((rng.standard_normal((1, m.cfg.n_embd)) * std).astype(np.float32))
        ys, joint = m.mm.stacked_outputs("test_qkvz", 1, widths)
        for y in ys:
            y.copy_to_device(np.full(y.shape, np.nan, np.float32), stream=m.ctx.nb_stream)
        m.mm.split(x, m.lin[stacked[0]], ys, None, joint)
        apart = [m.ctx.upload(np.full((1, n), np.nan, np.float32)) for n in widths]
        m.mm.split(x, m.lin[stacked[0]], apart)
        m.ctx.sync()
        for got, want in zip(ys, apart):
            got, want = got.copy_to_host(), want.copy_to_host()
            assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), "int8 x: within 2e-2 of the float GEMV"
    # int8 activations through every GEMV move these tiny hybrids' logits by a median 2.7-4.4e-2
    # of the largest (H200: top-1 0.87-0.99 over the tokens whose top-2 gap is >= 1e-2 of it)
    dp4a.reset(SamplingParams(temperature=0))
    out = np.concatenate([dp4a.logits([t]) for t in ids[:N_DECODE]])
    agree(out, ref[:N_DECODE], f"dp4a decode ({len(dp4a.m.dp4a_linears())} weights) vs reference", margin=1e-2,
          min_close=0.0, min_top1=0.8)
    assert np.median(np.abs(out - ref[:N_DECODE]).max(-1)) < 0.06 * np.abs(ref[:N_DECODE]).max()


def test_chunked_prefill_matches_reference(case, monkeypatch):
    """The tensor-core DeltaNet prefill (IMPNB_GDN_CHUNKED_MIN_ROWS=16: every prompt chunk of 16
    rows and more): the two-chunk prompt within LOOSE of the reference (its fp16 operands move the
    state by ~1e-3 of its scale), decode after a padded chunk likewise, and its prefill graph
    equal to eager bit for bit."""
    from impnb.engine_cuda import CudaEngine
    from tests.gpu.test_graphs import decode

    ids, ref, eager = case
    monkeypatch.setenv("IMPNB_MOE_DOWN_DP4A", "0")
    monkeypatch.setenv("IMPNB_GDN_CHUNKED_MIN_ROWS", "16")
    engine = CudaEngine(eager.mf, N_CTX, graphs=False)
    assert engine.m.tuning.gdn_chunked_min_rows == 16
    engine.reset(SamplingParams(temperature=0))
    out = np.concatenate([engine.logits(ids[:SPLIT]), engine.logits(ids[SPLIT:])])
    loose(out, ref, "chunked prefill (two chunks) vs reference")
    n = 300
    engine.reset(SamplingParams(temperature=0))
    engine.prefill(ids[:n])
    out = np.concatenate([engine.logits([t]) for t in ids[n:n + 32]])
    loose(out, ref[n:n + 32], "decode after a padded chunked prompt vs reference")
    graphed = CudaEngine(eager.mf, N_CTX, graphs=True, lookahead=False)
    p = SamplingParams(temperature=0)
    t_e, l_e = decode(engine, list(ids[:20]), p, 8)
    t_g, l_g = decode(graphed, list(ids[:20]), p, 8)
    assert graphed.prefill_graphs, graphed.graph_disabled
    assert t_e == t_g and np.array_equal(l_e, l_g)


def loose(out, ref, what):
    """LOOSE's bounds, whatever the architecture."""
    min_top1, bound, min_close, max_median = LOOSE
    rel = np.abs(out - ref).max(-1) / np.abs(ref).max()
    top1, close = np.mean(out.argmax(-1) == ref.argmax(-1)), np.mean(rel < bound)
    print(f"{what}: max {rel.max():.2e}, median {np.median(rel):.2e}, top-1 {top1:.3f}, within {bound}: {close:.3f}")
    assert top1 >= min_top1 and close >= min_close and np.median(rel) < max_median, (top1, close, np.median(rel))
