"""The batched CUDA engine (impnb/engine_batch.py) on tiny random qwen3 / qwen3moe against the numpy
reference and against itself: sequences of different prompt lengths in one shared page pool with
shuffled pages, decode steps of several sequences at once.

- teacher-forced logits of every sequence of a batch within the single-sequence tolerance of the
  reference (rows joining and leaving between steps);
- a row's logits and seeded draws do not depend on the other rows of its batch bucket (dense
  model: each row's GEMV and attention read only its own inputs), so sampling is reproducible
  whatever the batch's composition;
- greedy decode through the batch graphs equals eager, token for token;
- the padding rows of a bucket write only the scratch page.
"""

import numpy as np
import pytest

from impnb.engine_batch import BATCH_BUCKETS, CudaBatchEngine, DecodeRow
from impnb.errors import ParameterError
from impnb.gguf_file import open_model_file
from impnb.models import load_reference
from impnb.sampling import SamplingParams
from impnb.synthetic import tiny_gguf
from impnb.tuning import PAGE_SIZE

pytestmark = pytest.mark.gpu

N_CTX = 256
GREEDY = SamplingParams(temperature=0.0)
PROMPTS = (5, 40, 17, 1, 70, 33)  # prompt lengths of the sequences


@pytest.fixture(scope="module", params=[("qwen3", "Q8_0"), ("qwen3moe", "Q8_0"), ("qwen3", "F32")],
                ids=lambda p: "-".join(p))
def case(request, tmp_path_factory):
    arch, qtype = request.param
    _, path = tiny_gguf(arch, qtype, tmp_path_factory.mktemp("tiny"), seed=3)
    mf = open_model_file(path)
    ref = load_reference(mf)
    rng = np.random.default_rng(4)
    seqs = [rng.integers(0, ref.cfg.n_vocab, n + 24).astype(np.int32) for n in PROMPTS]
    refs = [ref.forward(s, ref.new_cache(N_CTX)) for s in seqs]
    return mf, seqs, refs


def synthetic_layers(tmp_path, model: str, layers: int):
    """The first `layers` layers of synthetic_full's full-size `model` in Q4_K_M (llama.cpp's
    mix: Q6_K where use_more_bits says), opened."""
    from dataclasses import replace

    from impnb import synthetic_full

    path = tmp_path / f"{model}-{layers}.gguf"
    synthetic_full.write_full_gguf(str(path), replace(synthetic_full.SHAPES[model], num_hidden_layers=layers),
                                   "Q4_K_M", None, 0, "test", 4)
    return open_model_file(path)


def page_sets(n_seqs: int, pages_each: int, n_pages: int, seed: int) -> list[np.ndarray]:
    """Disjoint, shuffled page lists: sequence pages are not contiguous or ordered."""
    perm = np.random.default_rng(seed).permutation(n_pages)[: n_seqs * pages_each]
    return [perm[i * pages_each:(i + 1) * pages_each].astype(np.int32) for i in range(n_seqs)]


def test_teacher_forced_batch_matches_reference(case):
    mf, seqs, refs = case
    engine = CudaBatchEngine(mf, N_CTX, kv_tokens=len(seqs) * 4 * PAGE_SIZE, max_batch=8, graphs=False)
    pages = page_sets(len(seqs), 4, engine.n_pages, 0)
    got = [[] for _ in seqs]
    for i, (s, n) in enumerate(zip(seqs, PROMPTS)):
        engine.prefill_seq(s[:n], 0, pages[i], GREEDY)
        got[i].append(engine.m.arena.get("logits", (1, engine.cfg.n_vocab)).copy_to_host()[0])
    pos = list(PROMPTS)
    for step in range(24):
        # sequences join late and leave early: the batch changes size and order every step
        live = [i for i in range(len(seqs)) if not (i == 3 and step < 5) and not (i == 1 and step >= 20)]
        live = live[step % len(live):] + live[:step % len(live)]
        rows = [DecodeRow(int(seqs[i][pos[i]]), pos[i], pages[i], GREEDY, 0) for i in live]
        for i, row in zip(live, engine.decode_logits(rows)):
            got[i].append(row)
            pos[i] += 1
    for i, (n, ref) in enumerate(zip(PROMPTS, refs)):
        out = np.stack(got[i])
        want = ref[n - 1:n - 1 + len(out)]
        rel = np.abs(out - want).max() / np.abs(want).max()
        agree = np.mean(out.argmax(-1) == want.argmax(-1))
        print(f"sequence {i}: {len(out)} rows, max|dlogit|/max|logit| {rel:.2e}, top-1 {agree:.3f}")
        assert rel < 1e-2 and agree >= 0.95


def test_teacher_forced_large_batch_matches_reference(case):
    """A batch past SHORT_DECODE_MAX_BATCH (12 sequences: bucket 16, GEMMs of 16 rows) takes the
    batch attention on tensor cores (attention_decode_mma: head dim 64), a KV head's query rows a
    block; every sequence's teacher-forced logits within the single-sequence tolerance of the
    reference."""
    mf, seqs, refs = case
    seqs, refs, prompts = seqs * 2, refs * 2, PROMPTS * 2
    engine = CudaBatchEngine(mf, N_CTX, kv_tokens=len(seqs) * 4 * PAGE_SIZE, max_batch=16, graphs=False)
    pages = page_sets(len(seqs), 4, engine.n_pages, 2)
    got = [[] for _ in seqs]
    for i, (s, n) in enumerate(zip(seqs, prompts)):
        engine.prefill_seq(s[:n], 0, pages[i], GREEDY)
    pos = list(prompts)
    for step in range(12):
        rows = [DecodeRow(int(seqs[i][pos[i]]), pos[i], pages[i], GREEDY, 0) for i in range(len(seqs))]
        for i, row in enumerate(engine.decode_logits(rows)):
            got[i].append(row)
            pos[i] += 1
        assert engine.last_step.batch == 16 and engine.last_step.short_blocks == 0 and engine.last_step.mma
    for i, (n, ref) in enumerate(zip(prompts, refs)):
        out = np.stack(got[i])
        want = ref[n:n + len(out)]
        rel = np.abs(out - want).max() / np.abs(want).max()
        agree = np.mean(out.argmax(-1) == want.argmax(-1))
        print(f"sequence {i}: max|dlogit|/max|logit| {rel:.2e}, top-1 {agree:.3f}")
        assert rel < 1e-2 and agree >= 0.9


def test_a_row_does_not_depend_on_its_neighbours(case):
    """The same sequence's logits and seeded samples in two batches of one bucket with other
    sequences beside it, at another row: bit for bit equal (dense model); sampled tokens equal."""
    mf, seqs, _ = case
    engine = CudaBatchEngine(mf, N_CTX, kv_tokens=len(seqs) * 4 * PAGE_SIZE, max_batch=8, graphs=False)
    if engine.cfg.n_expert:
        pytest.skip("routed experts group the batch's tokens: rows share the expert GEMMs' tiles")
    pages = page_sets(len(seqs), 4, engine.n_pages, 1)
    for i, n in enumerate(PROMPTS):
        engine.prefill_seq(seqs[i][:n], 0, pages[i], GREEDY)
    p = SamplingParams(temperature=0.9, top_k=0, top_p=0.95, min_p=0.0, seed=77)

    def row(i, **kw):
        return DecodeRow(int(seqs[i][PROMPTS[i]]), PROMPTS[i], pages[i], kw.get("params", p), 3)

    a = engine.decode_logits([row(0), row(2), row(4)])  # bucket 4, sequence 0 at row 0
    b = engine.decode_logits([row(5), row(1), row(3), row(0)])  # bucket 4, sequence 0 at row 3
    assert np.array_equal(a[0], b[3])
    ta = engine.decode([row(0), row(2), row(4)])
    tb = engine.decode([row(5), row(1), row(3), row(0)])
    assert ta[0] == tb[3]


def test_greedy_graphs_equal_eager(case):
    mf, seqs, _ = case
    tokens = {}
    for graphs in (False, True):
        engine = CudaBatchEngine(mf, N_CTX, kv_tokens=len(seqs) * 4 * PAGE_SIZE, max_batch=8, graphs=graphs)
        pages = page_sets(len(seqs), 4, engine.n_pages, 2)
        last = [engine.prefill_seq(s[:n], 0, pages[i], GREEDY) for i, (s, n) in enumerate(zip(seqs, PROMPTS))]
        pos, out = list(PROMPTS), [[t] for t in last]
        for step in range(20):
            live = list(range(len(seqs))) if step % 3 else [0, 2, 5]  # buckets 8 and 4 in turn
            rows = [DecodeRow(out[i][-1], pos[i], pages[i], GREEDY, len(out[i])) for i in live]
            for i, t in zip(live, engine.decode(rows)):
                out[i].append(int(t))
                pos[i] += 1
        if graphs:
            assert engine.batch_graphs, engine.graph_disabled
        tokens[graphs] = out
    assert tokens[False] == tokens[True]


def test_padding_rows_touch_only_the_scratch_page(case):
    """A step of 3 sequences runs bucket 4: its padding row writes the scratch page, no other."""
    mf, seqs, _ = case
    engine = CudaBatchEngine(mf, N_CTX, kv_tokens=8 * PAGE_SIZE, max_batch=4, graphs=False)
    pages = page_sets(3, 2, engine.n_pages, 3)
    for i in range(3):
        engine.prefill_seq(seqs[i][:PROMPTS[i] % 30 + 1], 0, pages[i], GREEDY)
    k0 = engine.m.kv.k[0].copy_to_host()
    owned = np.concatenate(pages)
    free = np.setdiff1d(np.arange(engine.n_pages), owned)
    engine.decode([DecodeRow(int(seqs[i][0]), PROMPTS[i] % 30 + 1, pages[i], GREEDY, 1) for i in range(3)])
    k1 = engine.m.kv.k[0].copy_to_host()
    assert np.array_equal(k0[free], k1[free], equal_nan=True)


def test_bad_steps_raise(case):
    mf, seqs, _ = case
    engine = CudaBatchEngine(mf, N_CTX, kv_tokens=4 * PAGE_SIZE, max_batch=2, graphs=False)
    with pytest.raises(ParameterError):
        engine.decode([])
    with pytest.raises(ParameterError):
        engine.decode([DecodeRow(1, 0, np.array([0]), GREEDY, 0)] * 3)
    with pytest.raises(ParameterError):
        engine.decode([DecodeRow(1, 0, np.array([engine.n_pages]), GREEDY, 0)])  # the scratch page
    with pytest.raises(ParameterError):
        CudaBatchEngine(mf, N_CTX, kv_tokens=4 * PAGE_SIZE, max_batch=BATCH_BUCKETS[-1] + 1)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_models_batch_equals_alone(name, request):
    """SmolLM2 and Gemma3 (sliding window of 512: the prompts pass it): three sequences decoded
    together give each one's logits alone (CudaEngine, its own contiguous cache) within 3e-2 of
    the largest (their GEMVs take int8 activations in the batch, gemv_dp4a_multi, and float ones
    alone; test_engine.py holds either to 5e-2 of the reference), and the same greedy tokens
    where its top two are not a near-tie. Gemma3 within 5e-2: its attn_output and down, before
    the post-norms, take int8 x̂ in the batch too."""
    mf = open_model_file(request.getfixturevalue(f"{name}_path"))
    check_batch_equals_alone(mf, 1024, (600, 37, 530), 12, 9, 5e-2 if name == "gemma3" else 3e-2, name)


def check_batch_equals_alone(mf, n_ctx, lengths, steps, seed, tol, name, before_batch=lambda: None):
    """len(lengths) sequences decoded together (graphs on) give each one's logits alone
    (CudaEngine, its own contiguous cache) within tol of the largest, and the same greedy tokens
    where its top two are more than tol apart; before_batch runs between the two engines'
    construction."""
    from impnb.engine_cuda import CudaEngine

    rng = np.random.default_rng(seed)
    seqs = [rng.integers(100, 20000, n + steps).astype(np.int32) for n in lengths]
    alone = []
    single = CudaEngine(mf, n_ctx, graphs=False)
    for s, n in zip(seqs, lengths):
        single.reset(GREEDY)
        single.prefill(s[:n])
        alone.append(np.concatenate([single.logits([t]) for t in s[n:n + steps]]))
    del single
    before_batch()
    n_seqs = len(lengths)
    engine = CudaBatchEngine(mf, n_ctx, kv_tokens=n_seqs * n_ctx, max_batch=max(4, n_seqs), graphs=True)
    pages = page_sets(n_seqs, n_ctx // PAGE_SIZE, engine.n_pages, 5)
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        engine.prefill_seq(s[:n], 0, pages[i], GREEDY)
    got = np.stack([engine.decode_logits([DecodeRow(int(s[n + j]), n + j, pages[i], GREEDY, 0)
                                          for i, (s, n) in enumerate(zip(seqs, lengths))])
                    for j in range(steps)], 1)
    for i in range(n_seqs):
        rel = np.abs(got[i] - alone[i]).max() / np.abs(alone[i]).max()
        top2 = np.sort(alone[i], -1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > tol * np.abs(alone[i]).max()
        print(f"{name} sequence {i}: max|dlogit|/max|logit| {rel:.2e}")
        assert rel < tol
        assert np.array_equal(got[i].argmax(-1)[clear], alone[i].argmax(-1)[clear])
    return engine


def lookahead_script(engine, seqs, params):
    """Three sequences through decode(): the first alone, its pages listed one position early (the
    block of its next position with the step before); the second joining with its pages listed
    only when reached; a third prefilled between two steps of the same rows, joining a step later;
    the second leaving.
    -> each sequence's tokens."""
    pages = page_sets(3, 3, engine.n_pages, 7)
    n = (28, 29, 9)
    toks = [[int(engine.prefill_seq(seqs[i][:n[i]], 0, pages[i][:1 + n[i] // PAGE_SIZE], params[i]))] for i in (0, 1)]
    toks.append([])
    for j in range(16):
        if j == 8:
            toks[2].append(int(engine.prefill_seq(seqs[2][:n[2]], 0, pages[2][:1], params[2])))
        live = [0] + ([1] if 3 <= j < 12 else []) + ([2] if j >= 9 else [])
        rows = []
        for i in live:
            pos = n[i] + len(toks[i]) - 1
            early = 1 if i == 0 else 0
            rows.append(DecodeRow(toks[i][-1], pos, pages[i][:1 + (pos + early) // PAGE_SIZE], params[i], len(toks[i])))
        for i, t in zip(live, engine.decode(rows)):
            toks[i].append(int(t))
    return toks


def test_lookahead_steps_equal_staged_steps(case):
    """With look-ahead each step queues the next on the device's own inputs; every sequence's
    tokens (greedy, and seeded draws) equal those of the same engine staging every step, through
    page boundaries (a block listed early keeps the chain, one listed late breaks it), rows joining
    and leaving, and a prompt prefilled between steps; and queued steps do run as queued."""
    mf, seqs, _ = case
    seeded = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.0, seed=5)
    for params in ((GREEDY,) * 3, (seeded, GREEDY, SamplingParams(temperature=1.1, seed=9))):
        out = {}
        for lookahead in (False, True):
            engine = CudaBatchEngine(mf, N_CTX, kv_tokens=10 * PAGE_SIZE, max_batch=4, lookahead=lookahead)
            out[lookahead] = lookahead_script(engine, seqs, params)
            print(f"lookahead {lookahead}: queued steps taken {engine.ahead_taken}, dropped {engine.ahead_dropped}")
            if lookahead:
                assert engine.ahead_taken >= 8
            else:
                assert engine.ahead_taken == engine.ahead_dropped == 0
            del engine
        assert out[True] == out[False], params


def test_int8_gemm_rows_equal_alone(tmp_path, monkeypatch):
    """Decode steps of 2..8 rows with every int8-x Linear on the int8 GEMM (IMPNB_GEMV_ROWS_FORCE=mmq:
    the pre-norm in x's quantization, Q|K|V into its outputs, gate|up then its activation, the
    residual unfused) on two layers of the synthetic Qwen3-8B Q4_K_M (Q4_K and Q6_K at real
    widths): three sequences decoded together give each one's logits alone (CudaEngine, one row:
    no int8 GEMM) to 5e-2 of the largest, the same greedy tokens where not that near a tie. The
    random weights amplify x's int8 rounding (32-column groups here, 16 on the row alone): 2.1-2.3e-2
    measured; a wrong fragment, scale or norm is off by the logits' own size."""
    from impnb.gpu.gemv_dispatch import MMQ

    engine = check_batch_equals_alone(synthetic_layers(tmp_path, "qwen3-8b", 2), 256, (40, 7, 101), 10, 11, 5e-2,
                                      "qwen3-8b mmq",
                                      lambda: monkeypatch.setenv("IMPNB_GEMV_ROWS_FORCE", "mmq"))
    assert {lin.multi.get(3) for lin in engine.m.lin.values() if lin.int8_x} == {MMQ}


def moe_decode_logits(mf, n_seqs: int, check) -> np.ndarray:
    """(n_seqs, 8, vocab) logits of 8 teacher-forced decode steps of n_seqs sequences (prompts of
    3..119 tokens, seeded by n_seqs) on a fresh engine of mf, graphs on; check(engine) first."""
    rng = np.random.default_rng(n_seqs)
    lengths = rng.integers(3, 120, n_seqs)
    seqs = [rng.integers(100, 20000, n + 8).astype(np.int32) for n in lengths]
    engine = CudaBatchEngine(mf, 256, kv_tokens=n_seqs * 256, max_batch=max(4, n_seqs), graphs=True)
    check(engine)
    pages = page_sets(n_seqs, 256 // PAGE_SIZE, engine.n_pages, 5)
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        engine.prefill_seq(s[:n], 0, pages[i], GREEDY)
    return np.stack([engine.decode_logits([DecodeRow(int(s[n + j]), n + j, pages[i], GREEDY, 0)
                                           for i, (s, n) in enumerate(zip(seqs, lengths))])
                     for j in range(8)], 1)


def assert_routed_steps_agree(a, b, close: float, label: str) -> None:
    """a, b (n_seqs, steps, vocab): logits of one MoE layer's model by two paths whose routers sum
    in other orders. A step's logits depend on that step's routing alone (one layer: the KV comes
    before the experts), so each (sequence, step) is within `close` of the largest logit but where
    a near-tied expert went the other way (at most one step in eight, within 5e-2: an expert mixed
    up or a slot in another's row moves every step by the logits' own size); the greedy tokens equal
    where the top two are further apart than 5e-2."""
    rel = np.abs(a - b).max(-1) / np.abs(b).max(-1)
    print(f"{label}: max|dlogit|/max|logit| a step: median {np.median(rel):.2e}, max {rel.max():.2e}, "
          f"{(rel > close).sum()} of {rel.size} above {close:g}")
    assert np.isfinite(a).all() and rel.max() < 5e-2 and (rel > close).sum() <= rel.size // 8
    top2 = np.sort(b, -1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 5e-2 * np.abs(b).max(-1)
    assert np.array_equal(a.argmax(-1)[clear], b.argmax(-1)[clear])


@pytest.mark.parametrize("n_seqs", [8, 13, 32])
def test_router_batch_equals_its_kernels(tmp_path, monkeypatch, n_seqs):
    """Decode steps of 8, 13 (the 16 bucket) and 32 rows of one layer of the synthetic Qwen3-30B-A3B
    Q4_K_M through the grouped decode with its routing in one launch (router_batch) against the
    norm, router, top-k, grouping and quantization kernels (IMPNB_ROUTER_BATCH_ROWS=0; 32 rows on
    it by IMPNB_ROUTER_BATCH_ROWS=32, past the tuned 16). Both run the
    same experts' int8 arithmetic on routers of fp32 sums in other orders, so a step's logits agree
    within 1e-5 of the largest but where a near-tied expert went the other way
    (assert_routed_steps_agree)."""
    from impnb.gpu import moe

    mf = synthetic_layers(tmp_path, "qwen3-30b-a3b", 1)
    monkeypatch.setenv("IMPNB_ROUTER_FOLD", "0")
    got = {}
    for on in (1, 0):
        monkeypatch.setenv("IMPNB_ROUTER_BATCH_ROWS", "32" if on else "0")

        def check(engine, on=on):
            assert moe._routes_in_one(engine.m, engine.m.blk[0].ffn, n_seqs) == bool(on)
        got[on] = moe_decode_logits(mf, n_seqs, check)
    assert_routed_steps_agree(got[1], got[0], 1e-5, f"B{n_seqs}")


@pytest.mark.parametrize("n_seqs", [8, 13])
def test_router_slot_order_equals_grouped(tmp_path, monkeypatch, n_seqs):
    """router_batch's slots in their own order (OWN: each slot its own tile and row, the grouped
    GEMVs' tiles fastest in launch order) against the slots grouped by expert (SCAN), decode steps
    of 8 and 13 rows of one layer of the synthetic Qwen3-30B-A3B Q4_K_M: each row of each expert
    is the same computation wherever it sits, and the combine reads the rows by slot, so the logits
    are equal bit for bit."""
    from impnb import tuning
    from impnb.gpu import moe, moe_dispatch
    from impnb.kernels.moe import router_batch

    mf = synthetic_layers(tmp_path, "qwen3-30b-a3b", 1)
    monkeypatch.setenv("IMPNB_ROUTER_FOLD", "0")
    got = {}
    for mode in (router_batch.OWN, router_batch.SCAN):
        monkeypatch.setattr(tuning, "ROUTER_DIRECT", mode)

        def check(engine):
            ffn, cfg = engine.m.blk[0].ffn, engine.m.cfg
            assert moe._routes_in_one(engine.m, ffn, n_seqs)
            paths = moe_dispatch.ffn_paths((ffn.gate_up, ffn.down), cfg.n_expert, n_seqs)
            assert {moe_dispatch.tile_tokens(p) for p in paths} == {1}, "OWN takes a token a tile alone"
        got[mode] = moe_decode_logits(mf, n_seqs, check)
    assert np.isfinite(got[router_batch.OWN]).all()
    assert np.array_equal(got[router_batch.OWN], got[router_batch.SCAN])


def test_combine_next_equals_combine_and_quantize(tmp_path, monkeypatch, n_seqs=8):
    """Decode steps of 8 rows of two layers of the synthetic Qwen3-30B-A3B Q4_K_M: layer 0's
    grouped MoE ending in moe_combine_next (the combine and layer 1's Q|K|V input in gemm_mmq's
    int8 form in one launch, and its Q6_K V's in quant_x's with IMPNB_COMBINE_NEXT_V) against
    moe_combine and layer 1's own quantize_x32 and quantize_x (IMPNB_COMBINE_NEXT=0); it runs where
    on and not where off, V's form where asked. x is the same bit for bit and the int8 inputs
    within their scales' last bit (test_moe.py's check_combine_next): a scale's last bit may flip
    one x̂ rounding, and every GEMM after it takes int8 input, so a step's logits agree within 2e-2
    of the largest (the mmq pair's tolerance, for the same reason: one row of a step measured 5.3e-3
    on an H200, the others 0 or ~1e-6) and the greedy tokens where the top two are further apart
    than twice that."""
    from impnb.gpu import moe

    mf = synthetic_layers(tmp_path, "qwen3-30b-a3b", 2)
    monkeypatch.setenv("IMPNB_ROUTER_FOLD", "0")
    calls = []
    fused = moe.moe_combine_next
    monkeypatch.setattr(moe, "moe_combine_next", lambda *a, **kw: calls.append(kw.get("vq") is not None) or fused(*a, **kw))
    got = {}
    for on, v in ((0, 1), (1, 0), (1, 1)):
        monkeypatch.setenv("IMPNB_COMBINE_NEXT", str(on))
        monkeypatch.setenv("IMPNB_COMBINE_NEXT_V", str(v))
        calls.clear()
        got[on, v] = moe_decode_logits(mf, n_seqs, lambda engine: None)
        assert bool(calls) == bool(on) and all(c == bool(v) for c in calls), (on, v, calls)
    b = got[0, 1]
    for key in ((1, 0), (1, 1)):
        a = got[key]
        rel = np.abs(a - b).max(-1) / np.abs(b).max(-1)
        assert np.isfinite(a).all() and rel.max() < 2e-2, (key, rel.max())
        top2 = np.sort(b, -1)[..., -2:]
        clear = top2[..., 1] - top2[..., 0] > 4e-2 * np.abs(b).max(-1)
        assert np.array_equal(a.argmax(-1)[clear], b.argmax(-1)[clear]), key


def assert_switch_bit_exact(tmp_path, monkeypatch, layers: int, switch: str, module, name: str, asked_of, reached):
    """Decode steps of 8 rows of the first `layers` layers of the synthetic Qwen3-30B-A3B Q4_K_M
    (moe_decode_logits, graphs on) with IMPNB_<switch> on and off. A spy on module.name records
    asked_of(args, kw, result) of each call (at capture), and reached(on, asked) says whether the
    switch got to them. Both ways make the same sums in the same order, so the logits are equal bit
    for bit; a kernel reading an input before the launch that writes it has finished reads the step
    before's (or the poison of a fresh arena)."""
    mf = synthetic_layers(tmp_path, "qwen3-30b-a3b", layers)
    got, asked = {}, []
    real = getattr(module, name)

    def spy(*args, **kw):
        out = real(*args, **kw)
        asked.append(asked_of(args, kw, out))
        return out

    monkeypatch.setattr(module, name, spy)
    for on in (1, 0):
        monkeypatch.setenv(f"IMPNB_{switch}", str(on))
        asked.clear()
        got[on] = moe_decode_logits(mf, 8, lambda engine: None)
        assert reached(on, asked), f"{switch}={on}: {asked}"
    assert np.isfinite(got[1]).all() and np.array_equal(got[1], got[0])


def test_attention_int8_output_equals_quantize_x(tmp_path, monkeypatch):
    """One layer: attn_output's int8 input written by attention_decode_mma in one split against
    quantize_x of attention's float output (IMPNB_ATTN_DP4A=0); the int8 forms are equal bit for bit."""
    from impnb.kernels.attention import attention_decode_mma as adm

    assert_switch_bit_exact(tmp_path, monkeypatch, 1, "ATTN_DP4A", adm, "attention_decode_mma",
                            lambda args, kw, out: kw.get("xq") is not None and args[7] == 1,
                            lambda on, asked: asked and all(a == bool(on) for a in asked))


def test_expert_act_int8_equals_quantize_x(tmp_path, monkeypatch):
    """One layer, moe_table's token a tile at the 16 bucket: the down GEMV's int8 act written by
    gate|up's GEMV (moe_prefill.act_int8) against quantize_x of its float act (IMPNB_MOE_ACT_INT8=0);
    the int8 forms are equal bit for bit. (The prompts' prefills before the 8 steps take other
    buckets' paths.)"""
    from impnb.gpu import moe_prefill

    assert_switch_bit_exact(tmp_path, monkeypatch, 1, "MOE_ACT_INT8", moe_prefill, "act_int8",
                            lambda args, kw, out: out,
                            lambda on, asked: len(asked) >= 8 and all(a == bool(on) for a in asked[-8:]))


def test_down_early_equals_waiting(tmp_path, monkeypatch):
    """Two layers: the down's grouped GEMV reading its tiles before its wait (tuning.DOWN_EARLY)
    against it waiting first; a tile read before the router of its step and layer wrote it would
    route the down to another expert."""
    from impnb.gpu import moe_prefill

    assert_switch_bit_exact(tmp_path, monkeypatch, 2, "DOWN_EARLY", moe_prefill, "gemv_dp4a_grouped",
                            lambda args, kw, out: args[13] if len(args) > 13 else kw.get("early", False),
                            lambda on, asked: any(asked) == bool(on))


def test_mmq_trigger_equals_end(tmp_path, monkeypatch):
    """Two layers (layer 0's Q4_K V in Q|K|V's gemm_mmq; layer 1's Q6_K V on its own GEMV after Q|K's
    gemm_mmq, which that GEMV then follows into its wait): gemm_mmq keeping its partials for attention
    and letting the next kernel launch as its blocks start (tuning.MMQ_TRIGGER) against it letting
    it launch at the GEMM's end."""
    from impnb.kernels.gemm import gemm_mmq

    assert_switch_bit_exact(tmp_path, monkeypatch, 2, "MMQ_TRIGGER", gemm_mmq, "gemm_mmq_split",
                            lambda args, kw, out: kw.get("trigger", False),
                            lambda on, asked: sum(asked) >= 2 if on else not any(asked))


@pytest.mark.parametrize("n_seqs", [3, 12])
def test_grouped_expert_gemv_equals_the_tiles(tmp_path, monkeypatch, n_seqs):
    """Decode steps of 3 and 12 rows of one layer of the synthetic Qwen3-30B-A3B Q4_K_M (its
    experts' real shapes): moe_table's int8 paths (3 rows through the grouped decode,
    IMPNB_MOE_GROUPED_MIN_ROWS=2; 12 through moe_ffn) against the same steps with the table giving
    the experts the wgmma tiles (3 rows: the decode's dp4a GEMV a routed slot). One layer, so both
    route every token alike (the router in fp32 on h either way: the router folded into
    attn_output, which the slot-by-slot decode of 2..8 rows would otherwise take, routes on the
    int8 form of attention's output and so picks otherwise between near-tied experts). At 12 rows
    the experts' arithmetic differs (int8 activations in 16-column groups against fp16): logits
    within 2e-2 of the largest, the same greedy tokens where the top two are further apart than
    that. At 3 rows both run the same int8 dot products, grouped by expert or slot by slot: within
    1e-4 (a token or an expert mixed up between tiles moves them by far more), but for a step
    whose near-tied experts went apart, the routers summing in other orders
    (assert_routed_steps_agree). (Alone-against-batch
    on two layers does not hold for routed experts: the second layer's choices flip between
    near-tied experts on the first layer's rounding.)"""
    from impnb.gpu import moe_dispatch

    mf = synthetic_layers(tmp_path, "qwen3-30b-a3b", 1)
    monkeypatch.setenv("IMPNB_MOE_GROUPED_ROWS", "8")
    monkeypatch.setenv("IMPNB_MOE_GROUPED_MIN_ROWS", "2")
    monkeypatch.setenv("IMPNB_ROUTER_FOLD", "0")
    table = moe_dispatch.load_table()
    tiles = {key: {b: "wgmma" for b in by_t} for key, by_t in table.items()}
    got = {}
    for name, t in (("int8", table), ("tiles", tiles)):
        monkeypatch.setattr(moe_dispatch, "load_table", lambda t=t: t)

        def check(engine, name=name):
            ex = engine.m.blk[0].ffn
            paths = moe_dispatch.ffn_paths((ex.gate_up, ex.down), engine.cfg.n_expert, n_seqs)
            assert all((p in moe_dispatch.INT8_PATHS) == (name == "int8") for p in paths), (name, paths)
        got[name] = moe_decode_logits(mf, n_seqs, check)
    assert_routed_steps_agree(got["int8"], got["tiles"], 1e-4 if n_seqs <= 8 else 2e-2, f"B{n_seqs}")


@pytest.mark.parametrize("model, layers", [("qwen3-8b", 2), ("qwen3-30b-a3b", 1)])
def test_batch_fused_norms_equal_unfused(tmp_path, monkeypatch, model, layers):
    """Decode steps of 12 rows (bucket 16, GEMMs on the measured tables' paths at real widths) of
    the synthetic Qwen3-8B and Qwen3-30B-A3B Q4_K_M with the norms in the GEMMs' input casts and
    the residual adds in their reduces (tuning.BATCH_FUSED_NORMS) against the same steps with the
    norm kernels: the same arithmetic but for the order of each row's sum of squares, which moves
    a rounding of the normed input to fp16 or int8 now and then; the random weights' sharp
    attention amplifies those (as in test_int8_gemm_rows_equal_alone): logits within 2e-2 of the
    largest (1.2e-2 seen), the same greedy tokens where the top two are further apart than that.
    A missing norm or residual is off by the logits' own size. With the dense FFN's gate|up
    reduce, GLU and the down's operand in one kernel (BATCH_GLU_REDUCE) and without it the logits
    are equal bit for bit (the same sums in the same order)."""
    from impnb.gpu import forward

    mf = synthetic_layers(tmp_path, model, layers)
    rng = np.random.default_rng(7)
    lengths = rng.integers(3, 120, 12)
    seqs = [rng.integers(100, 20000, n + 6).astype(np.int32) for n in lengths]
    got = {}
    for fused, glu in (("1", "1"), ("1", "0"), ("0", "0")):
        monkeypatch.setenv("IMPNB_BATCH_FUSED_NORMS", fused)
        monkeypatch.setenv("IMPNB_BATCH_GLU_REDUCE", glu)
        engine = CudaBatchEngine(mf, 256, kv_tokens=12 * 256, max_batch=16, graphs=True)
        pages = page_sets(12, 256 // PAGE_SIZE, engine.n_pages, 6)
        for i, (s, n) in enumerate(zip(seqs, lengths)):
            engine.prefill_seq(s[:n], 0, pages[i], GREEDY)
        got[fused + glu] = np.stack([engine.decode_logits([DecodeRow(int(s[n + j]), n + j, pages[i], GREEDY, 0)
                                                           for i, (s, n) in enumerate(zip(seqs, lengths))])
                                     for j in range(6)], 1)
        assert engine.last_step.rows == 16 and forward._batch_fused(engine.m, engine.last_step) == (fused == "1")
        del engine
    assert np.array_equal(got["11"], got["10"])
    errs = []
    for i in range(12):
        a, b = got["11"][i], got["00"][i]
        assert np.isfinite(a).all()
        scale = np.abs(b).max()
        errs.append(np.abs(a - b).max() / scale)
        top2 = np.sort(b, axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2e-2 * scale
        assert np.array_equal(a.argmax(-1)[clear], b.argmax(-1)[clear]), i
    print(f"{model}: max|dlogit|/max|logit| by sequence " + " ".join(f"{e:.1e}" for e in errs))
    assert max(errs) < 2e-2


def two_layer_8b_rows(tmp_path, monkeypatch, runs, eight: bool = False) -> dict:
    """Decode steps of 12 and 24 rows (buckets 16 and 32), and of 8 where eight is given, of the
    synthetic Qwen3-8B Q4_K_M at two layers under each of runs' (name, GEMM table, environment,
    check(engine)) -> {name: each step's logits}; the environment sets IMPNB_GEMM_PAIR_RS_ROWS and
    IMPNB_GEMM_PAIR_MMQ_ROWS (empty where it leaves them out) and whatever else it names."""
    from impnb.gpu import gemm_dispatch

    mf = synthetic_layers(tmp_path, "qwen3-8b", 2)
    rng = np.random.default_rng(13)
    lengths = rng.integers(3, 120, 24)
    seqs = [rng.integers(100, 20000, n + 4).astype(np.int32) for n in lengths]
    got = {}
    for name, tab, env, check in runs:
        monkeypatch.setattr(gemm_dispatch, "load_table", lambda path=None, tab=tab: tab)
        for k, v in {"IMPNB_GEMM_PAIR_RS_ROWS": "", "IMPNB_GEMM_PAIR_MMQ_ROWS": "", **env}.items():
            monkeypatch.setenv(k, v)
        engine = CudaBatchEngine(mf, 256, kv_tokens=24 * 256, max_batch=32, graphs=True)
        check(engine)
        pages = page_sets(24, 256 // PAGE_SIZE, engine.n_pages, 9)
        for i, (s, n) in enumerate(zip(seqs, lengths)):
            engine.prefill_seq(s[:n], 0, pages[i], GREEDY)
        got[name] = [engine.decode_logits([DecodeRow(int(s[n + j]), n + j, pages[i], GREEDY, 0)
                                           for i, (s, n) in enumerate(zip(seqs[:rows], lengths[:rows]))])
                     for rows, j in ((8, 0),) * eight + ((12, 0), (24, 1), (24, 2))]
        del engine
    return got


def assert_logits_close(got, ref, tol):
    """Each step's logits within tol of its rows' largest, the same greedy tokens where the top two
    are further apart."""
    for a, b in zip(got, ref):
        assert np.isfinite(a).all()
        scale = np.abs(b).max(axis=1, keepdims=True)
        assert (np.abs(a - b) / scale).max() < tol
        top2 = np.sort(b, axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > tol * scale[:, 0]
        assert np.array_equal(a.argmax(-1)[clear], b.argmax(-1)[clear])


def wrs_table():
    """The measured GEMM table with every Q4_K and Q6_K shape on "wrs" at 16-64 rows."""
    from impnb.gpu import gemm_dispatch

    table = gemm_dispatch.load_table()
    return table, {**table, **{k: {**v, "16": "wrs", "32": "wrs", "64": "wrs"} for k, v in table.items()
                               if k.split()[0] in ("Q4_K", "Q6_K")}}


def test_register_operand_gemm_rows_equal_the_table(tmp_path, monkeypatch):
    """Every Q4_K and Q6_K GEMM on gemm_wgmma_rs ("wrs": x cast, and gate|up's product written, in
    its column order) against the measured table's paths, Q|K and V apart in both: the same
    products up to the f16x2 decode's rounding of the scales and the int8 GEMM's rounding of x,
    amplified by the random weights' sharp attention (as test_batch_fused_norms_equal_unfused):
    logits within 2e-2 of the largest, the same greedy tokens where the top two are further apart."""
    from gguf import GGMLQuantizationType as T

    def on_wrs(engine):
        assert engine.m.blk[0].ffn.gate_up.gemm_path(24) == "wrs" and engine.m.blk[0].ffn.gate_up.w.ggml_type == T.Q4_K

    table, wrs = wrs_table()
    got = two_layer_8b_rows(tmp_path, monkeypatch, [("table", table, {}, lambda e: None), ("wrs", wrs, {}, on_wrs)])
    assert_logits_close(got["wrs"], got["table"], 2e-2)


def test_pair_launch_equals_two_gemms(tmp_path, monkeypatch):
    """A layer's Q4_K Q|K and Q6_K V in one gemm_wgmma_rs_pair launch against the two on
    gemm_wgmma_rs apart (every Q4_K / Q6_K GEMM on "wrs" in both): the same products but for the
    split-K sums' boundaries, so logits within 5e-3 of the largest; a V's rows written to another
    matrix's columns, or a block left out, moves them by far more."""
    from gguf import GGMLQuantizationType as T

    def mixed(engine):
        att = engine.m.blk[1].attn  # the use_more_bits layer: V in Q6_K
        assert att.qk is not None and att.qk.w.ggml_type == T.Q4_K and att.v.w.ggml_type == T.Q6_K

    _, wrs = wrs_table()
    got = two_layer_8b_rows(tmp_path, monkeypatch, [("apart", wrs, {}, mixed),
                                                    ("pair", wrs, {"IMPNB_GEMM_PAIR_RS_ROWS": "16,32"}, mixed)])
    assert_logits_close(got["pair"], got["apart"], 5e-3)


def test_mmq_pair_equals_qk_and_v_apart(tmp_path, monkeypatch):
    """A layer's Q4_K Q|K and Q6_K V in one gemm_mmq_pair launch at 8, 12 and 24 rows against Q|K
    on gemm_mmq and V on its own path (the int8 GEMM forced at 8 rows, every Q4_K / Q6_K GEMM on
    "mmq" past it): one x̂ either way, but other split-K boundaries move Q, K and V by an ulp, which
    can flip an int8 rounding of a later GEMM's input (every GEMM here is int8): logits within 2e-2
    of the largest (8.0e-3 measured at 24 rows); V's rows in another matrix's columns, or a block
    left out, move them by far more."""
    from gguf import GGMLQuantizationType as T

    from impnb.gpu import gemm_dispatch

    def mixed(engine):
        att = engine.m.blk[1].attn  # the use_more_bits layer: V in Q6_K
        assert att.qk is not None and att.qk.w.ggml_type == T.Q4_K and att.v.w.ggml_type == T.Q6_K

    table = gemm_dispatch.load_table()
    mmq = {**table, **{k: {**v, "16": "mmq", "32": "mmq"} for k, v in table.items()
                       if k.split()[0] in ("Q4_K", "Q6_K")}}
    force = {"IMPNB_GEMV_ROWS_FORCE": "mmq"}
    got = two_layer_8b_rows(tmp_path, monkeypatch, [("apart", mmq, force, mixed),
                                                    ("pair", mmq, {**force, "IMPNB_GEMM_PAIR_MMQ_ROWS": "8,16,32"},
                                                     mixed)], eight=True)
    assert_logits_close(got["pair"], got["apart"], 2e-2)
