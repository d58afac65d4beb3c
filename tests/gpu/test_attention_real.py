"""Prefill attention on Q/K/V captured from real SmolLM2 and Gemma3 layers: the numpy reference
model runs a real prompt and hands over each chosen layer's roped Q, K and V; FA2 (every head dim)
and the wgmma kernel (its head dims) run them from a paged fp16 cache and from a bf16 one; each
is held to the float64 reference on the cached K/V.

Tolerance: max |error| <= 1e-2 max |V| with fp16, 8e-2 with bf16 (the output is a convex
combination of V's rows; Q and P rounded to fp16 as tensor-core operands cost ~1e-3 of it on
these layers, bf16's unit roundoff is 8x fp16's), and no NaN.
"""

import numpy as np
import pytest
from numba import cuda

from impnb.gguf_file import open_model_file
from impnb.kernels.attention import attention_wgmma
from impnb.kernels.attention.attention import attention_ref
from impnb.kernels.attention.attention_fa2 import attention_fa2
from impnb.kernels.attention.kv_cache import bf16_bits, bf16_values, kv_gather_ref, kv_write_ref, pages_needed
from impnb.models import load_reference
from impnb.tokenizer import Tokenizer

pytestmark = pytest.mark.gpu

PROMPT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
          "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
          "from 1887 to 1889. Locally nicknamed the Iron Lady, it was constructed as the centrepiece "
          "of the 1889 World's Fair, and to crown the centennial anniversary of the French Revolution. ")
TOL = {"f16": 1e-2, "bf16": 8e-2}


def captured(path, n_layers_picked=3, repeat=6):
    """(cfg, {layer: (q, k, v, pos)}) of the first, middle and last layers on PROMPT x repeat."""
    mf = open_model_file(path)
    ids = np.array(Tokenizer.from_metadata(mf.metadata).encode(PROMPT * repeat), np.int32)
    ref = load_reference(mf)
    layers = sorted({0, ref.cfg.n_layer // 2, ref.cfg.n_layer - 1})[:n_layers_picked]
    got = {}
    attention = ref.ops.attention

    def capture(q, k, v, pos, il, cache):
        if il in layers:
            got[il] = (q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), pos.astype(np.int32))
        return attention(q, k, v, pos, il, cache)

    ref.ops.attention = capture
    ref.forward(ids, ref.new_cache(len(ids)))
    return ref.cfg, got


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def layers(request, smollm2_path, gemma3_path):
    return captured(smollm2_path if request.param == "smollm2" else gemma3_path)


def run(kernel, q, k, v, pos, scale, window, kv="f16", page_size=16):
    """kernel's output on q (T, H, D) over k, v (T, Hkv, D) written into a shuffled paged cache of
    kv's type (f16 or bf16), and the cached K/V as float32."""
    T, Hkv, D = k.shape
    n_pages = pages_needed(T, page_size) + 1
    table = np.random.default_rng(T).permutation(n_pages + 2)[:n_pages].astype(np.int32)
    k_pool = np.full((n_pages + 2, page_size, Hkv, D), np.nan, np.float16)
    v_pool = np.full_like(k_pool, np.nan)
    kv_write_ref(k_pool, v_pool, table, k, v, pos)
    if kv == "bf16":  # the same slots, rounded from float32 to bf16
        slots = table[pos // page_size], pos % page_size
        k_pool, v_pool = bf16_bits(k_pool.astype(np.float32)), bf16_bits(v_pool.astype(np.float32))
        k_pool[slots], v_pool[slots] = bf16_bits(k), bf16_bits(v)
    out = np.full(q.shape, np.nan, np.float32)
    stream = cuda.stream()
    dev = [cuda.to_device(a, stream=stream) for a in (q, k_pool, v_pool, table, pos, out)]
    kernel(*dev, scale, window, None, stream)
    got = dev[5].copy_to_host(stream=stream)
    stream.synchronize()
    k_c, v_c = kv_gather_ref(k_pool, table, T), kv_gather_ref(v_pool, table, T)
    return (got, bf16_values(k_c), bf16_values(v_c)) if kv == "bf16" else (got, k_c, v_c)


def kernels(D):
    yield "fa2", attention_fa2
    if D in attention_wgmma.HEAD_DIMS:
        yield "wgmma", attention_wgmma.attention_wgmma


def test_prefill_attention_on_real_layers(layers):
    cfg, got = layers
    assert got, "no layer captured"
    for il, (q, k, v, pos) in got.items():
        window = cfg.window(il)
        for (name, kernel), kv in [(kn, kv) for kn in kernels(q.shape[2]) for kv in ("f16", "bf16")]:
            out, k_c, v_c = run(kernel, q, k, v, pos, cfg.attn_scale, window, kv)
            want = attention_ref(q, k_c, v_c, pos, cfg.attn_scale, window, None)
            err = np.abs(out - want).max()
            bound = TOL[kv] * np.abs(v_c).max()
            name = f"{name} {kv}"
            print(f"{cfg.arch} layer {il} {name}: T={len(pos)} H={q.shape[1]}/{k.shape[1]} D={q.shape[2]} "
                  f"window={window} err {err:.2e} (bound {bound:.2e})")
            assert np.isfinite(out).all(), f"layer {il} {name}: non-finite output"
            assert err <= bound, f"layer {il} {name}: {err:.3e} > {bound:.3e}"
