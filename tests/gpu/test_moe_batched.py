"""The MoE prefill's cuBLAS fallback (kernels/moe/moe_batched.py, gpu/moe_prefill.py) on the GPU: the
gather and pointer kernels against their numpy references (bit for bit; rows of tiles past n_tiles
untouched), the expert GEMMs on every mix of paths against float64 on the dequantized weights and
against the grouped tiles, and a captured graph's replay equal to eager.

check_gather / check_pointers run one case; tests/sim/test_moe_batched.py runs them in the simulator.
Tolerances: each expert GEMM as tests/gpu/test_gemm_tc.py (fp32 accumulation of exact fp16
products: (K/16 + 16) 2^-22 |A| @ |W|ᵀ per output), carried through silu(gate) * up as in
tests/gpu/test_moe.py, plus the act's fp16 rounding (the reference saturated at +-65504 as the
device's act is); y against the fp16 act the device fed the down GEMM; fallback against tiles:
both bounds plus |Δact16| @ |W_down|ᵀ for y.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from impnb.kernels.elementwise.cast import F16_MAX, cast_f16_ref
from impnb.kernels.gemm.dequant import dequant_ref
from impnb.kernels.moe.gemm_grouped import BM
from impnb.kernels.moe.moe import max_tiles
from impnb.kernels.moe.moe_batched import gather_ref, moe_gather, moe_pointers, pointers_ref
from impnb.kernels.common.repack import repack
from tests.gpu.test_moe import host_order, routed
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu
STDS = (0.1, 1.0, 10.0)
POISON16 = np.uint16(0x7E01)  # a NaN


def routing(rng, T_, E, k, kind: str) -> np.ndarray:
    """(T * k,) int32 slots: "random", "empty" (experts 0 and E // 2 get no token) or "same"
    (every token on the same k experts, so one expert spans several tiles)."""
    if kind == "empty":
        others = np.setdiff1d(np.arange(E), [0, E // 2])
        return others[routed(rng, T_, E - 2, k)].astype(np.int32).reshape(-1)
    return routed(rng, T_, E, k, same=kind == "same").reshape(-1)


def check_gather(rng, T_, E, k, K, kind="random"):
    slots = routing(rng, T_, E, k, kind)
    S, n_max = slots.size, max_tiles(slots.size, E, BM)
    order, tiles = host_order(slots, E, BM)
    n = len(tiles)
    x = (rng.standard_normal((T_, K)) * 3).astype(np.float16)
    d_xg = cuda.to_device(np.full((n_max * BM, K), POISON16).view(np.float16))
    d_tp = cuda.to_device(np.full((n_max, 3), -7, np.int32))
    d_sr = cuda.to_device(np.full(S, -7, np.int32))
    d_tiles = cuda.to_device(np.concatenate([tiles, np.full((n_max - n, 3), -1, np.int32)]))
    moe_gather(cuda.to_device(x), cuda.to_device(order), d_tiles, cuda.to_device(np.array([n], np.int32)), k,
               d_xg, d_tp, d_sr, 0)
    xg, tiles_pad, slot_row = d_xg.copy_to_host().view(np.uint16), d_tp.copy_to_host(), d_sr.copy_to_host()
    ref_xg, ref_tp, ref_sr = gather_ref(x, order, tiles, k)
    assert np.array_equal(xg[:n * BM], ref_xg.view(np.uint16)), "gathered rows differ"
    assert (xg[n * BM:] == POISON16).all(), "rows of tiles past n_tiles were written"
    assert np.array_equal(tiles_pad[:n], ref_tp) and (tiles_pad[n:] == -7).all(), "padded tiles differ"
    assert np.array_equal(slot_row, ref_sr), "slot rows differ"


def check_pointers(rng, n_tiles, n_max, E):
    experts = rng.integers(0, E, n_tiles).astype(np.int32)
    tiles = np.full((n_max, 3), -1, np.int32)
    tiles[:n_tiles, 0] = experts
    bases = tuple(int(b) for b in rng.integers(1 << 40, 1 << 47, 8) & ~15)
    d_ptrs = cuda.to_device(np.full((3, n_max), -1, np.int64))
    moe_pointers(cuda.to_device(tiles), cuda.to_device(np.array([n_tiles], np.int32)), bases, d_ptrs, 0)
    assert np.array_equal(d_ptrs.copy_to_host(), pointers_ref(experts, n_max, *bases))


@pytest.mark.parametrize("T_,E,k,K", [(17, 8, 2, 512), (111, 16, 8, 2048), (300, 128, 8, 768), (1, 128, 8, 256)])
@pytest.mark.parametrize("kind", ["random", "empty", "same"])
def test_gather(T_, E, k, K, kind):
    check_gather(np.random.default_rng([T_, E, k]), T_, E, k, K, kind)


@pytest.mark.parametrize("n_tiles,n_max", [(0, 5), (1, 1), (77, 130), (192, 192), (3, 300)])
def test_pointers(n_tiles, n_max):
    check_pointers(np.random.default_rng([n_tiles, n_max]), n_tiles, n_max, 128)


# ---------------------------------------------------------------- the expert GEMMs

MIXES = [("tiles", "tiles"), ("cublas", "cublas"), ("tiles", "cublas"), ("cublas", "tiles")]  # glu, down


@pytest.fixture(scope="module")
def dev():
    """What gpu/moe_prefill.py reads of a DeviceModel: ctx, arena, cublas."""
    from impnb.gpu.buffers import Arena
    from impnb.gpu.context import GpuContext
    from impnb.gpu.cublas_gemm import Cublas

    ctx = GpuContext()
    yield SimpleNamespace(ctx=ctx, arena=Arena(ctx), cublas=Cublas(ctx))
    ctx.sync()


class Experts:
    """Random weights of E experts (model dim D, FFN dim F): gate|up stacked per expert, or gate and
    up apart, then down; their fp16 dequantization (E, N, K) as float64, and on the device."""

    def __init__(self, dev, rng, glu_types, down_type, E=16, D=512, F=256):
        self.E, self.D, self.F = E, D, F
        rows = (2 * F if len(glu_types) == 1 else F,) * len(glu_types) + (D,)
        cols = (D,) * len(glu_types) + (F,)
        types = (*glu_types, down_type)
        raw = self.raw = [make_weight(t, E * n, c, rng) for t, n, c in zip(types, rows, cols)]
        self.types = types
        self.w16 = [dequant_ref(r, t).reshape(E, -1, c).astype(np.float64) for r, t, c in zip(raw, types, cols)]
        self.dev = [repack(r, t).to_device(dev.ctx.nb_stream) for r, t in zip(raw, types)]

    def glu(self, x, slots, k):
        """float64 (gate, up) per slot (S, F) and their bounds."""
        F, xs = self.F, x.astype(np.float64)[np.arange(slots.size) // k]
        outs = [per_slot(w, slots, xs) for w in self.w16[:-1]]
        bounds = [gemm_bound(self.D) * per_slot(np.abs(w), slots, np.abs(xs)) for w in self.w16[:-1]]
        if len(outs) == 1:
            return (outs[0][:, :F], outs[0][:, F:]), (bounds[0][:, :F], bounds[0][:, F:])
        return tuple(outs), tuple(bounds)

    def prefill(self, dev, d_x, d_slots, k, paths):
        from impnb.gpu.moe_prefill import experts_prefill

        return experts_prefill(dev, d_x, tuple(self.dev[:-1]), self.dev[-1], d_slots, k, self.E, paths)


def gemm_bound(K: int) -> float:
    """Per output, relative to |A| @ |W|ᵀ (tests/gpu/test_gemm_tc.py)."""
    return (K / 16 + 16) * 2.0 ** -22


def per_slot(w, slots, xs):
    """(S, N) float64: row s = w[slots[s]] (N, K) @ xs[s]."""
    out = np.empty((slots.size, w.shape[1]))
    for e in np.unique(slots):
        idx = np.flatnonzero(slots == e)
        out[idx] = xs[idx] @ w[e].T
    return out


def run_prefill(dev, experts, x, slots, k, paths):
    """(act, y) per slot (S, F), (S, D) from experts_prefill, its outputs poisoned first."""
    s, S = dev.ctx.nb_stream, slots.size
    R = max_tiles(S, experts.E, BM) * BM if "cublas" in paths else S  # rows of the padded or grouped layout
    for name, cols, dt in (("moe_act16", experts.F, np.float16), ("moe_y", experts.D, np.float32)):
        dev.arena.get(name, (R, cols), dt).copy_to_device(np.full((R, cols), np.nan, dt), stream=s)
    act, y, rows = experts.prefill(dev, dev.ctx.upload(x), dev.ctx.upload(slots), k, paths)
    dev.ctx.sync()
    r = rows.copy_to_host()
    return act.copy_to_host()[r].astype(np.float64), y.copy_to_host()[r].astype(np.float64)


def act_ref(gate_up, bounds):
    """float64 silu(gate) * up and its bound (the GEMMs' bounds carried through the product, and
    the fp16 rounding of the act the device writes: 2^-11 relative)."""
    (g, u), (bg, bu) = gate_up, bounds
    sg = g / (1 + np.exp(-g))
    return sg * u, bg * np.abs(u) * 1.1 + bu * np.abs(sg) + np.abs(sg * u) * 2.0 ** -10 + 1e-30


def y_ref(experts, act, slots):
    """float64 y (S, D) from the fp16 act the device fed the down GEMM, its bound, and that act."""
    a16 = cast_f16_ref(act.astype(np.float32)).astype(np.float64)
    wd = experts.w16[-1]
    return per_slot(wd, slots, a16), gemm_bound(experts.F) * per_slot(np.abs(wd), slots, np.abs(a16)) + 1e-30, a16


def check_case(dev, experts, rng, T_, k, kind, std, mixes=MIXES):
    """Every mix of paths against the references, and the mixes using cuBLAS against the tiles."""
    slots = routing(rng, T_, experts.E, k, kind)
    x = (rng.standard_normal((T_, experts.D)) * std).astype(np.float16)
    ref_act, act_bound = act_ref(*experts.glu(x, slots, k))
    ref_act = np.clip(ref_act, -F16_MAX, F16_MAX)  # the device's act is the down GEMM's fp16 A, saturated
    n, got = len(experts.dev), {}
    for glu_path, down_path in mixes:
        paths = (glu_path,) * (n - 1) + (down_path,)
        what = f"T={T_} k={k} {kind} std={std} {paths}"
        act, y = got[paths] = run_prefill(dev, experts, x, slots, k, paths)
        assert np.isfinite(act).all() and np.isfinite(y).all(), f"{what}: non-finite outputs (poison left?)"
        err = np.abs(act - ref_act)
        assert (err <= act_bound).all(), f"{what}: act max err/bound {np.max(err / act_bound):.3g}"
        ref, bound, _ = y_ref(experts, act, slots)
        err = np.abs(y - ref)
        assert (err <= bound).all(), f"{what}: y max err/bound {np.max(err / bound):.3g}"
    tiles = ("tiles",) * n
    if tiles not in got:
        return
    act_t, y_t = got[tiles]
    _, bound_t, a16_t = y_ref(experts, act_t, slots)
    for paths, (act, y) in got.items():  # the cuBLAS mixes against the grouped tiles
        assert (np.abs(act - act_t) <= 2 * act_bound).all(), f"{paths}: act differs from the tiles'"
        _, bound, a16 = y_ref(experts, act, slots)
        dy = per_slot(np.abs(experts.w16[-1]), slots, np.abs(a16 - a16_t)) + bound + bound_t
        assert (np.abs(y - y_t) <= dy).all(), f"{paths}: y differs from the tiles'"


@pytest.mark.parametrize("types", [((T.Q4_K,), T.Q6_K), ((T.Q4_K,), T.Q4_K), ((T.Q8_0,), T.Q8_0),
                                   ((T.Q8_0, T.Q4_K), T.Q6_K)], ids=["Q4_K+Q6_K", "Q4_K", "Q8_0", "split"])
@pytest.mark.parametrize("T_,k", [(17, 2), (111, 8), (300, 8), (300, 2)])
def test_fallback_matches_reference_and_tiles(dev, types, T_, k):
    rng = np.random.default_rng([T_, k, len(types[0])])
    experts = Experts(dev, rng, *types)
    for std, kind in zip(STDS, ("random", "empty", "same")):
        check_case(dev, experts, rng, T_, k, kind, std)


INT8_CASES = [(8, 8, ("gemv2s32u2r8", "gemv2s32u1r8")), (17, 2, ("gemv4s64u1r4", "gemv8s32u1r2")),
              (32, 8, ("gemv8s32u2r2", "gemv4s32u2r4")), (8, 8, ("mmq", "mmq")), (32, 8, ("mmq", "gemv2s32u1r8")),
              (17, 2, ("gemv4s32u1r4", "mmq"))]


def int8_of(x, path):
    """(q, d) of x's int8 form as `path` makes it, d in 16-column groups (the grouped int8 GEMM's
    32-column scales repeated), for tests/gpu/test_gemv_dp4a.assert_expert_row."""
    from impnb.gpu import moe_dispatch
    from impnb.kernels.gemm.quant_x32 import quantize_x32_ref
    from impnb.kernels.gemv.quant_x import quantize_x_ref

    if path != moe_dispatch.MMQ:
        return quantize_x_ref(x)[:2]
    q, ds = quantize_x32_ref(x)
    return q, np.repeat(ds[:, :, 0].T, 2, axis=1)


@pytest.mark.parametrize("types", [((T.Q4_K,), T.Q6_K), ((T.Q4_K,), T.Q4_K), ((T.Q8_0,), T.Q8_0)],
                         ids=["Q4_K+Q6_K", "Q4_K", "Q8_0"])
@pytest.mark.parametrize("T_,k,paths", INT8_CASES, ids=[f"T{c[0]}k{c[1]}-{c[2][0]}-{c[2][1]}" for c in INT8_CASES])
def test_grouped_int8_paths(dev, types, T_, k, paths):
    """experts_int8 (the grouped dp4a GEMVs and the grouped int8 GEMM, tile sizes of gate|up and
    down equal or not): act per slot against its expert's gate|up on x̂ = h's int8 form as the
    path makes it, y against its expert's down on the int8 form of the act the device wrote (each
    within the dp4a bound, tests/gpu/test_gemv_dp4a.assert_expert_row); act and y NaN-poisoned
    first; random, two experts empty, and every token on the same experts."""
    from impnb.gpu.moe_prefill import experts_int8
    from impnb.kernels.gemv.gemv import SILU
    from tests.gpu.test_gemv_dp4a import assert_expert_row

    rng = np.random.default_rng([T_, k])
    ex = Experts(dev, rng, *types)
    E, D, F, S, s = ex.E, ex.D, ex.F, T_ * k, dev.ctx.nb_stream
    wabs = [np.abs(dequant_ref(r, t).astype(np.float64)) for r, t in zip(ex.raw, ex.types)]
    for std, kind in zip(STDS, ("random", "empty", "same")):
        slots = routing(rng, T_, E, k, kind)
        h = (rng.standard_normal((T_, D)) * std).astype(np.float32)
        for name, cols in (("moe_gemv_act", F), ("moe_y", D)):
            dev.arena.get(name, (S, cols)).copy_to_device(np.full((S, cols), np.nan, np.float32), stream=s)
        y, rows = experts_int8(dev, dev.ctx.upload(h), ex.dev[0], ex.dev[1], dev.ctx.upload(slots), k, E, paths, SILU)
        dev.ctx.sync()
        act = dev.arena.get("moe_gemv_act", (S, F)).copy_to_host()  # grouped order
        y, r = y.copy_to_host(), rows.copy_to_host()
        q, d = int8_of(h, paths[0])
        qa, da = int8_of(act, paths[1])
        what = f"T={T_} k={k} {kind} std={std} {paths}"
        for slot, e in enumerate(slots):
            assert_expert_row(act[r[slot]], ex.raw[0], wabs[0], ex.types[0], e, 2 * F, q, d, slot // k, SILU,
                              f"{what}: act of slot {slot}")
            assert_expert_row(y[r[slot]], ex.raw[1], wabs[1], ex.types[1], e, D, qa, da, r[slot], 0,
                              f"{what}: y of slot {slot}")


def test_graph_replay_equals_eager(dev):
    """The fallback captured into a CUDA graph (after an eager warm-up), replayed on new tokens and
    a new routing written into the same buffers, equals an eager run bit for bit."""
    from impnb.graphs.capture import Graph

    rng = np.random.default_rng(9)
    experts = Experts(dev, rng, (T.Q4_K,), T.Q6_K)
    T_, k, s = 111, 8, dev.ctx.nb_stream
    d_x = dev.ctx.upload(np.zeros((T_, experts.D), np.float16))
    d_slots = dev.ctx.upload(np.zeros(T_ * k, np.int32))

    def body():
        return experts.prefill(dev, d_x, d_slots, k, ("cublas", "cublas"))

    def load(seed):
        r = np.random.default_rng(seed)
        d_x.copy_to_device(r.standard_normal((T_, experts.D)).astype(np.float16), stream=s)
        d_slots.copy_to_device(routing(r, T_, experts.E, k, "random"), stream=s)

    def result(outs):
        dev.ctx.sync()
        act, y, rows = outs
        r = rows.copy_to_host()
        return act.copy_to_host()[r], y.copy_to_host()[r]

    load(1)
    outs = body()  # warm-up: compiles, allocates
    dev.arena.frozen = True
    try:
        graph = Graph(dev.ctx.handle, body)
    finally:
        dev.arena.frozen = False
    for seed in (2, 3):
        load(seed)
        eager = result(body())
        for buf in outs[:2]:
            buf.copy_to_device(np.full(buf.shape, np.nan, buf.dtype), stream=s)
        graph.replay()
        replayed = result(outs)
        assert all(np.array_equal(e, g) for e, g in zip(eager, replayed)), "graph replay differs from eager"
    graph.close()
