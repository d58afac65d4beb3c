"""The multi-token dp4a GEMV (T = 2..8) on the GPU: plain, accumulating, stacked Q|K|V split into
three outputs and gate|up with its activation, every dp4a type, odd row counts, every variant
shape the bench sweeps, and the routed experts' grouped form; through tests/gpu/test_gemv_dp4a.py's checks (the same two references
and bounds: gemv_dp4a_ref of x̂, and the float64 product with x within x̂'s rounding), outputs
NaN-poisoned, x Gaussian at std 0.1, 1 and 10."""

from contextlib import contextmanager

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb import tuning
from impnb.kernels.common import ptx, ptx_sim
from impnb.kernels.gemv.gemv_dp4a import SILU, GELU, gemv_dp4a_ref
from impnb.kernels.gemv.gemv_dp4a_multi import gemv_dp4a_grouped, gemv_dp4a_multi, gemv_dp4a_multi_split
from impnb.kernels.gemv.gemv_dp4a_units import DP4A_TYPES
from impnb.kernels.gemv.gemv_variants import Variant
from impnb.kernels.gemv.quant_x import GROUP, QuantX, quantize_x_ref
from tests.gpu.test_gemv import weight
from impnb.kernels.moe.moe import max_tiles
from impnb.kernels.moe.reference import group_ref
from tests.gpu.test_gemv_dp4a import RTOL, assert_expert_row, check_gemv_dp4a, check_glu, check_quantize_x

pytestmark = pytest.mark.gpu

VARIANTS = [Variant(32, 1, 4), Variant(32, 2, 8), Variant(64, 1, 2), Variant(128, 2, 4)]
GLU_VARIANTS = [Variant(32, 1, 4), Variant(64, 2, 8), Variant(128, 1, 2)]
# (type, K, T, variant, glu) of every launch below, compiled in parallel before the first test
BUILDS = ([(t, 2048, n, Variant(32, 1, 4), 0) for t in DP4A_TYPES for n in (2, 5, 8)]
          + [(T.Q4_K, 4096, n, v, 0) for v in VARIANTS for n in (2, 3, 4, 7, 8)]
          + [(t, K, 6, Variant(32, 2, 8), 0) for t, K in ((T.Q6_K, 12288), (T.Q8_0, 2048), (T.Q4_K, 1024))]
          + [(t, K, n, v, 0) for t in (T.Q4_K, T.Q6_K, T.Q8_0) for v in (Variant(32, 1, 4), Variant(64, 2, 8))
             for K, n in ((2048, 5), (1024, 8))]
          + [(T.Q4_K, 4096, n, v, glu) for glu in (SILU, GELU) for n in (2, 6, 8) for v in GLU_VARIANTS]
          + [(T.Q6_K, 2048, n, Variant(32, 2, 4), glu) for glu in (SILU, GELU) for n in (2, 6, 8)])
# (type, K, tokens a tile, variant, glu) of the grouped launches
GROUPED = [(T.Q4_K, 512, 4, Variant(32, 1, 2), SILU), (T.Q4_K, 512, 8, Variant(32, 1, 4), SILU),
           (T.Q6_K, 768, 4, Variant(32, 1, 4), 0), (T.Q4_K, 768, 1, Variant(32, 1, 4), 0),
           (T.Q8_0, 256, 3, Variant(64, 2, 2), 0), (T.NVFP4, 512, 2, Variant(32, 1, 2), GELU),
           (T.MXFP4, 256, 8, Variant(128, 1, 2), 0), (T.Q4_K, 2048, 1, Variant(32, 1, 8), SILU),
           (T.Q6_K, 768, 1, Variant(32, 1, 8), 0), (T.Q6_K, 768, 1, Variant(8, 2, 8), 0),
           (T.Q4_K, 768, 1, Variant(8, 1, 8), 0), (T.Q4_K, 2048, 1, Variant(16, 2, 8), SILU)]
GROUPED_INT8 = [(T.Q4_K, 2048, SILU), (T.Q6_K, 768, 0), (T.Q4_K, 512, GELU)]  # a token a tile, Variant(32, 1, 8)
# (type, K, variant) of the downs that read their tiles before the wait (early), a token a tile
GROUPED_EARLY = [(T.Q6_K, 768, Variant(8, 2, 8)), (T.Q4_K, 768, Variant(8, 1, 8)), (T.Q6_K, 768, Variant(32, 1, 8))]
PLAIN_L2 = [(T.Q4_K, 0), (T.Q6_K, 0), (T.Q4_K, SILU), (T.Q8_0, 0)]  # (type, glu) with the L2 prefetches, K 4096


@pytest.fixture(scope="module", autouse=True)
def precompiled():
    """Every kernel the tests launch, compiled by worker processes first (one at a time they
    take minutes): a dry run of one launch each records them. Under pytest-xdist one worker
    compiles them (its process pool on every core) while the others wait on a lock in the kernel
    cache, then find them there."""
    import fcntl

    from impnb.kernels.gemv.quant_x import quant_x_buffers
    from impnb.launch.cache import cache_dir
    from impnb.launch.cubin import arch_cc
    from impnb.launch.precompile import compile_all, record

    with record(arch_cc(cuda.get_current_device().compute_capability)) as rec:
        for t, K, n, v, glu in BUILDS:
            w = weight(t, 8, K)[2]
            y = cuda.device_array((n, 4 if glu else 8), np.float32)
            gemv_dp4a_multi(w, quant_x_buffers(n, K), y, 0, v, glu=glu)
        for t, K, n, v, glu in GROUPED:
            w = weight(t, 16, K)[2]  # one expert of 16 rows: as many as a group's of any variant here
            i1, tiles = cuda.device_array(1, np.int32), cuda.device_array((1, 3), np.int32)
            gemv_dp4a_grouped(w, 16, quant_x_buffers(1, K), cuda.device_array((1, 8 if glu else 16), np.float32),
                              tiles, i1, i1, 1, 0, v, n, glu)
        for t, K, glu in GROUPED_INT8:  # with the output's int8 form: 32 rows, whole groups a block
            w = weight(t, 32, K)[2]
            i1, tiles = cuda.device_array(1, np.int32), cuda.device_array((1, 3), np.int32)
            N = 16 if glu else 32
            gemv_dp4a_grouped(w, 32, quant_x_buffers(1, K), cuda.device_array((1, N), np.float32),
                              tiles, i1, i1, 1, 0, Variant(32, 1, 8), 1, glu, quant_x_buffers(1, N))
        for t, K, v in GROUPED_EARLY:
            w = weight(t, 16, K)[2]
            i1, tiles = cuda.device_array(1, np.int32), cuda.device_array((1, 3), np.int32)
            gemv_dp4a_grouped(w, 16, quant_x_buffers(1, K), cuda.device_array((1, 16), np.float32),
                              tiles, i1, i1, 0, 0, v, 1, early=True)
        for t, glu in PLAIN_L2:
            gemv_dp4a_multi(weight(t, 8, 4096)[2], quant_x_buffers(8, 4096),
                            cuda.device_array((8, 4 if glu else 8), np.float32), 0, Variant(32, 1, 4), glu=glu,
                            l2=True)
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "test_gemv_dp4a_multi.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        compile_all(rec.missing())


def multi(w, xq, y, stream, accumulate=False, variant=None, glu=0, l2=None):
    """gemv_dp4a_multi in gemv_dp4a's argument order (the shared checks call it so)."""
    gemv_dp4a_multi(w, xq, y, stream, variant, accumulate=accumulate, glu=glu, l2=l2)


@contextmanager
def prefetch_record():
    """In the simulator, the L2 prefetches sent within (a list of ptx_sim's records); else None."""
    if not ptx.SIM:
        yield None
        return
    ptx_sim.prefetched = sent = []
    try:
        yield sent
    finally:
        ptx_sim.prefetched = None


def prefetch_cover(w, sent) -> list:
    """For each part of packed weight w, the 16-byte lines (from the part's start) the recorded
    prefetches cover; a prefetch of any other array fails."""
    bases = [ptx_sim._host(p).__array_interface__["data"][0] for p in w.parts]
    lines = [set() for _ in bases]
    for base, byte0, nbytes in sent:
        assert base in bases, "a prefetch of an array that is not the weight's"
        lines[bases.index(base)].update(range(byte0 // 16, (byte0 + nbytes) // 16))
    return lines


def prefetch_lines(w, rows) -> list:
    """For each part of w, the 16-byte lines its rows `rows` touch (but a part's last partial line,
    which a prefetch leaves out)."""
    out = []
    for p in w.parts:
        nbytes = ptx_sim._host(p).nbytes
        per_row = nbytes // w.rows
        lines = set()
        for r in rows:
            lines.update(range(r * per_row // 16, -(-(r + 1) * per_row // 16)))
        out.append({i for i in lines if 16 * (i + 1) <= nbytes})
    return out


def check_case(ggml_type, rows, cols, n_tok, std, seed, variant, accumulate=False, l2=None, glu=0):
    """check_gemv_dp4a (check_glu with glu) through gemv_dp4a_multi; l2: whether its build
    prefetches W's rows into L2 (default tuning's), which in the simulator must then cover every
    row (prefetch_cover) and else none."""
    raw, wabs, w = weight(ggml_type, rows, cols)
    run = lambda *a, **kw: multi(*a, **kw, l2=l2)  # noqa: E731
    with prefetch_record() as sent:
        if glu:  # x drawn there from the same seed
            check_glu(ggml_type, rows // 2, cols, n_tok, glu, seed=seed, variant=variant, run=run, w=(raw, wabs, w),
                      std=std)
        else:
            rng = np.random.default_rng(seed)
            x = (rng.standard_normal((n_tok, cols)) * std).astype(np.float32)
            check_gemv_dp4a(raw, wabs, w, x, accumulate=accumulate, variant=variant, rng=rng, run=run)
    if sent is not None:
        every = tuning.L2_PREFETCH_ROWS if l2 is None else l2
        assert prefetch_cover(w, sent) == prefetch_lines(w, range(rows) if every else []), "L2 prefetches"


def check_split(ggml_type, sizes, cols, n_tok, std, seed, variant):
    """Stacked rows (sum of sizes, cols) into len(sizes) outputs: each its rows of gemv_dp4a_ref."""
    raw, wabs, w = weight(ggml_type, sum(sizes), cols)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_tok, cols)) * std).astype(np.float32)
    xq, (q, d, _) = check_quantize_x(x)
    ys = [cuda.to_device(np.full((n_tok, n), np.nan, np.float32)) for n in sizes]
    gemv_dp4a_multi_split(w, xq, ys, 0, variant)
    got = np.concatenate([y.copy_to_host() for y in ys], axis=1).astype(np.float64)
    assert np.isfinite(got).all(), "non-finite output"
    ref = gemv_dp4a_ref(raw, ggml_type, q, d)
    xhat = np.abs((q.view(np.int8).reshape(n_tok, -1, GROUP) * d[:, :, None]).reshape(n_tok, cols))
    bound = RTOL * (xhat @ wabs.T)
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err / np.maximum(bound, 1e-30)), err.shape)
    assert (err <= bound).all(), f"err {err[worst]:.3e} > {bound[worst]:.3e} at {worst}"


@pytest.mark.parametrize("ggml_type", DP4A_TYPES)
@pytest.mark.parametrize("n_tok", [2, 5, 8])
def test_every_type(ggml_type, n_tok):
    check_case(ggml_type, 111, 2048, n_tok, 1.0, seed=n_tok, variant=Variant(32, 1, 4))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("n_tok,std", [(2, 0.1), (3, 10.0), (4, 1.0), (7, 1.0), (8, 10.0)])
def test_variants(variant, n_tok, std):
    check_case(T.Q4_K, 989, 4096, n_tok, std, seed=10 + n_tok, variant=variant)


@pytest.mark.parametrize("ggml_type,rows,cols", [(T.Q6_K, 19, 12288), (T.Q8_0, 4099, 2048), (T.Q4_K, 8, 1024)])
def test_accumulate_shapes(ggml_type, rows, cols):
    check_case(ggml_type, rows, cols, 6, 1.0, seed=3, variant=Variant(32, 2, 8), accumulate=True)


@pytest.mark.parametrize("variant", [Variant(32, 1, 4), Variant(32, 1, 8), Variant(32, 2, 4)], ids=lambda v: v.name)
@pytest.mark.parametrize("ggml_type,rows,cols,n_tok", [
    (T.Q4_1, 1536, 576, 8),     # SmolLM2's gate|up rows: 18 of a warp's 32 chunks
    (T.Q4_1, 577, 1536, 5),     # its down's width, odd rows
    (T.Q8_0, 4099, 576, 8),     # its tied logits' width
    (T.Q8_0, 2051, 640, 4),     # Gemma3's logits' width (20 chunks)
    (T.Q4_K, 333, 768, 7),      # a K-quant of 24 chunks
])
def test_narrow_rows(ggml_type, rows, cols, n_tok, variant):
    """Rows of fewer 32-column chunks than a row group's lanes (the real models' widths)."""
    check_case(ggml_type, rows, cols, n_tok, 1.0, seed=rows + n_tok, variant=variant)


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K, T.Q8_0])
@pytest.mark.parametrize("variant", [Variant(32, 1, 4), Variant(64, 2, 8)], ids=lambda v: v.name)
def test_split_qkv(ggml_type, variant):
    """Q|K|V boundaries inside row groups (sizes not multiples of the group's rows)."""
    check_split(ggml_type, (131, 37, 37), 2048, 5, 1.0, seed=4, variant=variant)
    check_split(ggml_type, (1029, 515), 1024, 8, 10.0, seed=5, variant=variant)


@pytest.mark.parametrize("glu", [SILU, GELU])
@pytest.mark.parametrize("n_tok", [2, 6, 8])
def test_glu(glu, n_tok):
    for v in GLU_VARIANTS:
        check_glu(T.Q4_K, 257, 4096, n_tok, glu, seed=n_tok, variant=v, run=multi, std=1.0 if n_tok < 8 else 0.1)
    check_glu(T.Q6_K, 99, 2048, n_tok, glu, seed=20 + n_tok, variant=Variant(32, 2, 4), run=multi)


def check_grouped(ggml_type, E, n_rows, cols, n_tok, k, tm, glu, variant, seed, x_div=True, std=1.0, quant=False,
                  early=False, slot_order=False):
    """The grouped GEMV over n_tok tokens' k routed slots (a third of the tokens sharing one
    token's experts, so some experts take several tiles), tiles of at most tm rows in expert
    order, the tile array's rows past n_tiles poisoned: each grouped row against its slot's
    expert (assert_expert_row). x_div: x̂ of the tokens (row order[r] // k), else of the grouped
    rows themselves (the down's act). Grouped rows are NaN-poisoned first. quant: the output's int8
    form too (poisoned first), equal bit for bit to quantize_x's of the output. early: the kernel
    that reads its tiles before its wait. slot_order (tm 1): each slot its own tile and row
    (router_batch's OWN), the tiles fastest in launch order (tile_x)."""
    raw, wabs, w = weight(ggml_type, E * n_rows, cols)
    rng = np.random.default_rng(seed)
    experts = np.argsort(rng.random((n_tok, E)), axis=1)[:, :k].astype(np.int32)
    experts[::3] = experts[0]
    slots = experts.reshape(-1)
    S = slots.shape[0]
    order = np.argsort(slots, kind="stable").astype(np.int32)
    _, tiles = group_ref(slots, E, tm)
    if slot_order:
        assert tm == 1
        order = np.arange(S, dtype=np.int32)
        tiles = np.stack([slots, order, np.ones(S, np.int32)], 1)
    padded = np.full((max_tiles(S, E, tm), 3), -1, np.int32)
    padded[:len(tiles)] = tiles
    x = (rng.standard_normal((n_tok if x_div else S, cols)) * std).astype(np.float32)
    xq, (q, d, _) = check_quantize_x(x)
    out_rows = n_rows // 2 if glu else n_rows
    d_y = cuda.to_device(np.full((S, out_rows), np.nan, np.float32))
    y_q = None
    if quant:
        y_q = QuantX(cuda.to_device(np.full((S, out_rows // 4), 0xDEADBEEF, np.uint32)),
                     *(cuda.to_device(np.full((S, out_rows // GROUP), np.nan, np.float32)) for _ in "ds"))
    gemv_dp4a_grouped(w, n_rows, xq, d_y, cuda.to_device(padded), cuda.to_device(np.array([len(tiles)], np.int32)),
                      cuda.to_device(order), k if x_div else 0, 0, variant, tm, glu, y_q, early, slot_order)
    y = d_y.copy_to_host()
    if quant:
        for name, a, want in zip("qds", y_q, quantize_x_ref(y)):
            assert np.array_equal(a.copy_to_host(), want), f"the output's int8 {name} differs from quantize_x's"
    for r in range(S):
        e = slots[order[r]]
        assert_expert_row(y[r], raw, wabs, ggml_type, e, n_rows, q, d, order[r] // k if x_div else r, glu,
                          f"grouped row {r} (slot {order[r]}, expert {e})")
    return [y] + ([a.copy_to_host() for a in y_q] if quant else [])


def plain_y(ggml_type, rows, cols, n_tok, std, seed, variant, glu=0):
    """gemv_dp4a_multi's y (n_tok, rows, or rows / 2 with glu) of Gaussian x at std (NaN-poisoned
    first), after check_case's checks of the same inputs."""
    check_case(ggml_type, rows, cols, n_tok, std, seed, variant, glu=glu)
    _, _, w = weight(ggml_type, rows, cols)
    x = (np.random.default_rng(seed).standard_normal((n_tok, cols)) * std).astype(np.float32)
    xq, _ = check_quantize_x(x)
    d_y = cuda.to_device(np.full((n_tok, rows // 2 if glu else rows), np.nan, np.float32))
    gemv_dp4a_multi(w, xq, d_y, 0, variant, glu=glu)
    return [d_y.copy_to_host()]


def check_x_flat(monkeypatch, run):
    """run() (-> output arrays) with x̂'s scales and sums read at flat offsets (tuning.X_FLAT) and
    by 2-D indexing: the outputs equal bit for bit."""
    outs = []
    for flat in (False, True):
        monkeypatch.setattr(tuning, "X_FLAT", flat)
        outs.append(run())
    for a, b in zip(*outs):
        assert a.tobytes() == b.tobytes(), "X_FLAT changed an output"


@pytest.mark.parametrize("ggml_type,K,glu", GROUPED_INT8)
def test_grouped_int8_output(ggml_type, K, glu):
    """A token a tile writing its output's int8 form too (the down's x̂), at three magnitudes."""
    n_rows = 2 * 48 if glu else 64  # whole groups of 16 in every block
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_grouped(ggml_type, 9, n_rows, K, 13, 4, 1, glu, Variant(32, 1, 8), seed=i + K, x_div=glu != 0, std=std,
                      quant=True)


@pytest.mark.parametrize("span", [8, 16])
def test_grouped_int8_output_spans_within_a_warp(span):
    """gate|up at a token a tile over groups of span lanes writing its int8 form, at three magnitudes."""
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_grouped(T.Q4_K, 9, 2 * 128, 2048, 13, 4, 1, SILU, Variant(span, 1, 8), seed=i + span, std=std,
                      quant=True)


@pytest.mark.parametrize("span", [8, 16, 32])
def test_grouped_in_slot_order(span):
    """The 30B-A3B's batch after router_batch's OWN grouping: gate|up (SILU, its int8 form too) and
    the early down of each type over tiles in slot order, the tiles fastest in launch order."""
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_grouped(T.Q4_K, 9, 2 * 128, 2048, 13, 4, 1, SILU, Variant(span, 1, 8), seed=60 + i + span, std=std,
                      quant=True, slot_order=True)
        for j, ggml_type in enumerate((T.Q4_K, T.Q6_K)):
            check_grouped(ggml_type, 9, 77, 768, 13, 4, 1, 0, Variant(span, 1 + j, 8), seed=70 + i + span, x_div=False,
                          std=std, early=True, slot_order=True)


@pytest.mark.parametrize("ggml_type,K,variant", GROUPED_EARLY, ids=lambda a: getattr(a, "name", str(a)))
def test_grouped_down_early(ggml_type, K, variant):
    """The down's GEMV (x̂ of the grouped rows) that reads its tiles and first chunk before its
    wait, a token a tile, odd output rows, at three magnitudes (its ordering against gate|up's
    launch: test_engine_batch's test_down_early_equals_waiting)."""
    for i, std in enumerate((0.1, 1.0, 10.0)):
        check_grouped(ggml_type, 9, 77, K, 13, 4, 1, 0, variant, seed=30 + i, x_div=False, std=std, early=True)


@pytest.mark.parametrize("ggml_type,K,tm,variant,glu", GROUPED, ids=lambda a: getattr(a, "name", str(a)))
def test_grouped(ggml_type, K, tm, variant, glu):
    n_rows = 2 * 51 if glu else 77  # odd output rows: the last group starts early
    check_grouped(ggml_type, 9, n_rows, K, 13, 4, tm, glu, variant, seed=tm + K, x_div=glu != 0)
    check_grouped(ggml_type, 16, n_rows, K, 30, 8, tm, glu, variant, seed=tm, x_div=glu == 0, std=10.0)


@pytest.mark.parametrize("ggml_type,glu", PLAIN_L2)
def test_plain_l2_prefetches(ggml_type, glu):
    """The plain multi-token GEMV with its rows prefetched before its wait, at odd rows (the last
    block's clamped) and 8 tokens."""
    check_case(ggml_type, 2 * 1023 if glu else 2047, 4096, 8, 1.0, seed=50, variant=Variant(32, 1, 4), l2=True,
               glu=glu)


@pytest.mark.parametrize("case", ["attn_output", "qkv_glu", "gate_up", "down_q6_k", "down_q4_k"])
def test_x_flat_equals_indexed(case, monkeypatch):
    """The 30B-A3B's shapes at a batch of 8: attn_output (Q4_K 2048 x 4096 at 8 rows), a GLU at 5
    rows, the grouped gate|up with its int8 output and both downs over 8 lanes (the Q6_K one
    reading its tiles early), with x̂'s scales read flat and indexed: the same bits."""
    runs = {
        "attn_output": lambda: plain_y(T.Q4_K, 2048, 4096, 8, 1.0, 31, Variant(32, 1, 2)),
        "qkv_glu": lambda: plain_y(T.Q4_K, 2 * 96, 512, 5, 0.5, 32, Variant(32, 2, 4), glu=SILU),
        "gate_up": lambda: check_grouped(T.Q4_K, 16, 2 * 768, 2048, 8, 8, 1, SILU, Variant(32, 1, 8), seed=33,
                                         std=0.1, quant=True),
        "down_q6_k": lambda: check_grouped(T.Q6_K, 16, 2048, 768, 8, 8, 1, 0, Variant(8, 2, 8), seed=34,
                                           x_div=False, std=10.0, early=True),
        "down_q4_k": lambda: check_grouped(T.Q4_K, 16, 2048, 768, 8, 8, 1, 0, Variant(8, 1, 8), seed=35,
                                           x_div=False, early=True),
    }
    check_x_flat(monkeypatch, runs[case])
