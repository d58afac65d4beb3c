"""Which cache pages and window each gemma4 layer's attention reads, on the simulator with every
launch recorded and none run (launch_trace): tiny models of impnb/synthetic_full_gemma4.TINY_SHAPES
after a prompt chunk past the sliding window, on prefill and on the short and split decode
kernels. Every layer attends over its kv_layer's pools (a KV-shared layer over its source's
pages, the same arrays), with its own window (the sliding layers') and scale 1, heads of 512 on
FA2's decode form at a one-token step (DECODE_TC; attention_wide with IMPNB_DECODE_TC=0 and at
steps of more rows) and on FA2 in prefill; only the layers that own their K/V write them,
into their own pools, before they attend."""

import types as pytypes

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.sampling import SamplingParams
from impnb.synthetic_full_gemma4 import TINY_SHAPES, write_full_gguf
from tests.sim.launch_trace import FakeCublas, Recorder
from tests.sim.test_tp_trace import record_launches

# launcher -> (its module, the positions of scale and window in its arguments); K and V pools
# are every launcher's arguments 1 and 2
ATTENTION = {"attention_decode_short": ("impnb.gpu.forward", 6, 7),
             "attention_decode": ("impnb.kernels.attention.attention_decode", 9, 10),
             "attention_fa2": ("impnb.kernels.attention.attention_fa2", 6, 7),
             "attention_wgmma": ("impnb.kernels.attention.attention_wgmma", 6, 7),
             "attention_wide": ("impnb.kernels.attention.attention_wide", 8, 9),
             "attention_fa2_decode": ("impnb.kernels.attention.attention_fa2_decode", 8, 9)}
WRITES = {"qkv_post": -3, "kv_write": -3}  # forward_gemma4's K/V writes: K pool at this position, V after it
PROMPT = 20  # past every tiny model's window (8, 16)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    out = {}
    for v in ("dense", "wide"):
        out[v] = tmp_path_factory.mktemp("g4") / f"{v}.gguf"
        write_full_gguf(out[v], TINY_SHAPES[v], seed=3, workers=1)
    return out


def record_calls(monkeypatch, calls: list) -> None:
    """The attention launchers and forward_gemma4's K/V writes -> (name, args) into calls, run never."""
    import importlib

    import impnb.gpu.forward_gemma4 as fg
    from impnb.kernels.attention import qkv_post

    def recorder(name):
        return lambda *args, **kwargs: calls.append((name, args))
    for name, (module, _, _) in ATTENTION.items():
        monkeypatch.setattr(importlib.import_module(module), name, recorder(name))
    monkeypatch.setattr(qkv_post, "qkv_post", recorder("qkv_post"))
    monkeypatch.setattr(fg, "kv_write", recorder("kv_write"))


def check_layers(m, calls: list, kernels: set, wide: str = "attention_wide") -> None:
    """One forward's calls: each layer's writes (own K/V only) then its attention, as the
    docstring says; wide: the kernel of heads of 512."""
    cfg = m.cfg
    attends = [(i, name, args) for i, (name, args) in enumerate(calls) if name in ATTENTION]
    assert len(attends) == cfg.n_layer, [c[0] for c in calls]
    writes = [(i, name, args) for i, (name, args) in enumerate(calls) if name in WRITES]
    owners = [il for il in range(cfg.n_layer) if cfg.kv_layer(il) == il]
    assert len(writes) == len(owners)
    for (at, _, wargs), il in zip(writes, owners):
        k_at = WRITES[calls[at][0]]
        assert wargs[k_at] is m.kv.k[il] and wargs[k_at + 1] is m.kv.v[il]
        assert at < attends[il][0] and (il == 0 or at > attends[il - 1][0]), f"layer {il} writes out of place"
    for il, (_, name, args) in enumerate(attends):
        src = cfg.kv_layer(il)
        _, i_scale, i_window = ATTENTION[name]
        assert args[1] is m.kv.k[src] and args[2] is m.kv.v[src], f"layer {il} reads another layer's pages"
        assert args[i_window] == cfg.window(il) and args[i_scale] == 1.0, (il, args[i_window], args[i_scale])
        assert name == wide if cfg.head_dims(il)[0] == 512 else name in kernels, (il, name)


@pytest.mark.parametrize("variant", ["dense", "wide"])
@pytest.mark.parametrize("short", [True, False], ids=["short", "split"])
def test_layers_read_their_kv_layers_pages_and_window(paths, monkeypatch, variant, short):
    from impnb.engine_cuda import CudaEngine

    if not short:
        monkeypatch.setenv("IMPNB_SHORT_DECODE_MAX", "0")
    monkeypatch.setenv("IMPNB_DECODE_TC", "0")  # heads of 512 on attention_wide (FA2's decode form: below)
    engine = CudaEngine(open_model_file(paths[variant]), 64, graphs=False)
    m = engine.m
    cfg = m.cfg
    assert any(cfg.kv_layer(il) != il for il in range(cfg.n_layer)) or variant == "wide"
    holder = [Recorder()]
    record_launches(holder, monkeypatch)
    m.cublas = m.mm.cublas = FakeCublas(holder[0])
    m.ctx.device = pytypes.SimpleNamespace(compute_capability=(9, 0))  # prefill attention on wgmma
    calls: list = []
    record_calls(monkeypatch, calls)
    engine.reset(SamplingParams(temperature=0))
    engine.logits(list(range(1, PROMPT + 1)))
    check_layers(m, calls, {"attention_wgmma", "attention_fa2"}, "attention_fa2")  # wgmma at heads of 64 and 128
    calls.clear()
    engine.logits([5])
    assert bool(engine.last_step.short_blocks) == short
    check_layers(m, calls, {"attention_decode_short" if short else "attention_decode"})
    calls.clear()
    engine.logits([6, 7, 8])  # a decode step of three rows (look-ahead's shape)
    check_layers(m, calls, {"attention_decode_short" if short else "attention_decode"})


@pytest.mark.parametrize("variant", ["dense", "wide"])
@pytest.mark.parametrize("ring", [True, False], ids=["ring", "whole-pools"])
def test_window_layers_decode_short_on_their_own_pages(paths, monkeypatch, variant, ring):
    """Past the short kernel's range (IMPNB_SHORT_DECODE_MAX 256, a 300-token context at n_ctx
    1024) the sliding layers decode on the short kernel over their window (WINDOW_SHORT) and the
    global ones split (attention_wide at heads of 512); with IMPNB_WINDOW_RING every sliding
    layer's K/V writes and reads go through the ring's block table (position p on page
    (p // page) mod its pages) and its pools hold the ring's pages, the global layers' through the
    whole pools' table."""
    monkeypatch.setenv("IMPNB_SHORT_DECODE_MAX", "256")
    monkeypatch.setenv("IMPNB_WINDOW_RING", "1" if ring else "0")
    monkeypatch.setenv("IMPNB_DECODE_TC", "0")  # heads of 512 on attention_wide (FA2's decode form: below)
    engine, calls = prefilled(paths[variant], monkeypatch)
    m = engine.m
    cfg = m.cfg
    assert m.kv.windowed == [ring and cfg.window(il) is not None for il in range(cfg.n_layer)]
    ring_pages = m.kv.window_pages(cfg, m.kv.n_pages, 1, True, 512)
    for il in range(cfg.n_layer):
        assert m.kv.k[il].shape[0] == (ring_pages if m.kv.windowed[il] else m.kv.n_pages)
    check_layers(m, calls, {"attention_wgmma", "attention_fa2"}, "attention_fa2")
    check_tables(m, calls)
    calls.clear()
    engine.logits([5])
    step = engine.last_step
    assert step.ctx_bucket == 1024 and step.short_blocks == 0 and step.window_blocks > 0
    check_layers(m, calls, {"attention_decode_short", "attention_decode"})
    attends = [name for name, _ in calls if name in ATTENTION]
    for il, name in enumerate(attends):
        if cfg.head_dims(il)[0] != 512:
            assert name == ("attention_decode_short" if cfg.window(il) else "attention_decode"), (il, name)
    check_tables(m, calls)


def prefilled(path, monkeypatch) -> tuple:
    """(engine, calls): a CudaEngine of context 1024 with every launch recorded and none run (prompt
    chunks of 512: the MoE's own 2048 would need a ring past 1024 positions) after a 300-token
    prompt, and record_calls' list holding that prompt's calls."""
    from impnb.engine_cuda import CudaEngine

    engine = CudaEngine(open_model_file(path), 1024, graphs=False, chunk=512)
    holder = [Recorder()]
    record_launches(holder, monkeypatch)
    engine.m.cublas = engine.m.mm.cublas = FakeCublas(holder[0])
    engine.m.ctx.device = pytypes.SimpleNamespace(compute_capability=(9, 0))
    calls: list = []
    record_calls(monkeypatch, calls)
    engine.reset(SamplingParams(temperature=0))
    engine.logits([1 + i % 50 for i in range(300)])
    return engine, calls


def check_tables(m, calls: list) -> None:
    """Each layer's writes and attention read its layer's block table: the ring's (page j at j mod
    its pages) for a windowed layer, else the whole pools' (page j at j)."""
    cfg = m.cfg
    attends = [args for name, args in calls if name in ATTENTION]
    writes = [(name, args) for name, args in calls if name in WRITES]
    owners = [il for il in range(cfg.n_layer) if cfg.kv_layer(il) == il]
    seen = [(il, args[3]) for il, args in enumerate(attends)] + \
        [(il, args[WRITES[name] - 1]) for il, (name, args) in zip(owners, writes)]
    for il, table in seen:
        row = np.atleast_2d(table.copy_to_host())[0]
        pages = m.kv.k[cfg.kv_layer(il)].shape[0]
        assert np.array_equal(row, np.arange(row.size) % pages), (il, row[:40], pages)


@pytest.mark.parametrize("ring", [True, False], ids=["ring", "whole-pools"])
def test_decode_on_fa2s_decode_form(paths, monkeypatch, ring):
    """IMPNB_DECODE_TC=256,512 (26B-A4B's head dims): a one-token decode step's every layer attends
    on attention_fa2_decode, over its kv_layer's pools and block table (the ring's for a windowed
    layer), with its window, in decode_splits' splits for its keys (the window's, or the context
    bucket's); a step of three rows keeps the other kernels."""
    from impnb.kernels.attention.attention_fa2_decode import decode_splits
    from impnb.kernels.gemv import gemv_stream

    monkeypatch.setenv("IMPNB_DECODE_TC", "256,512")
    monkeypatch.setenv("IMPNB_WINDOW_RING", "1" if ring else "0")
    engine, calls = prefilled(paths["wide"], monkeypatch)
    m = engine.m
    cfg = m.cfg
    calls.clear()
    engine.logits([5])
    check_layers(m, calls, {"attention_fa2_decode"}, "attention_fa2_decode")
    check_tables(m, calls)
    bucket = engine.last_step.ctx_bucket
    for il, (name, args) in enumerate(calls[i] for i in range(len(calls)) if calls[i][0] in ATTENTION):
        window, Hkv, D = cfg.window(il), m.kv.k[il].shape[2], cfg.head_dims(il)[0]
        assert args[7] == decode_splits(min(bucket, window) if window else bucket, Hkv, D, gemv_stream.sm_count())
        assert args[0].shape == (1, cfg.n_head, D) and args[6].shape[1:] == (1, cfg.n_head, D + 2)
    calls.clear()
    engine.logits([6, 7, 8])
    assert not any(name == "attention_fa2_decode" for name, _ in calls)
