"""gemma4 loaded for the GPU on the simulator's device arrays (tiny models of
impnb/synthetic_full_gemma4.TINY_SHAPES): KV-shared layers hold their source layer's pools (the
same pages), every pool has its layer's shape, each layer's RoPE table its width, base and the
global layers' rope_freqs factors, the plan's decode rules read at the tiled kernels' head dim,
and the batched engine refuses the model before loading it."""

import numpy as np
import pytest

from impnb.errors import UnsupportedError
from impnb.gguf_file import open_model_file
from impnb.gpu.kv import PagedKV
from impnb.gpu.model import DeviceModel
from impnb.kernels.attention.rope import rope_inv_freq
from impnb.synthetic_full_gemma4 import TINY_SHAPES, write_full_gguf


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for v in ("dense", "wide"):
        path = tmp_path_factory.mktemp("g4") / f"{v}.gguf"
        write_full_gguf(path, TINY_SHAPES[v], seed=3, workers=1)
        out[v] = open_model_file(path)
    return out


def test_shared_layers_read_their_source_pages(models):
    m = DeviceModel(models["dense"], 64)
    cfg = m.cfg
    shared = [il for il in range(cfg.n_layer) if cfg.kv_layer(il) != il]
    assert shared == [4, 5]
    for il in range(cfg.n_layer):
        src = cfg.kv_layer(il)
        assert m.kv.k[il] is m.kv.k[src] and m.kv.v[il] is m.kv.v[src]
        assert m.kv.k[il].shape[2:] == (cfg.kv_heads(il), cfg.head_dims(il)[0])
        assert m.blk[il].kv_layer == src
        assert (m.blk[il].attn.k is None and m.blk[il].attn.qk is None and m.blk[il].attn.qkv is None) == (src != il)
    own = {id(p) for p in m.kv.k}
    assert len(own) == cfg.n_layer - len(shared)
    assert PagedKV.nbytes(cfg, 64) == sum(2 * p.nbytes for p in {id(p): p for p in m.kv.k}.values())


def test_rope_tables_per_layer(models):
    m = DeviceModel(models["wide"], 64)
    cfg = m.cfg
    factors = models["wide"].tensors["rope_freqs.weight"].dequantize()
    for il in range(cfg.n_layer):
        got = m.inv_freq[il].copy_to_host()
        if cfg.is_swa(il):
            want = rope_inv_freq(cfg.head_dim_swa, cfg.rope_base_swa)
        else:
            want = rope_inv_freq(cfg.head_dim, cfg.rope_base, factors)
            n_rot = int(np.sum(factors == 1))
            assert 0 < n_rot < got.shape[1] and np.all(np.abs(got[0, n_rot:]) < 1e-20)  # held still
        assert np.array_equal(got, want)


def test_plan_reads_the_tiled_head_dim(models):
    m = DeviceModel(models["wide"], 64)
    assert (m.cfg.head_dim, m.plan.head_dim) == (512, 256)
    assert m.stack is not None


def test_batched_engine_refuses(models):
    from impnb.engine_batch import CudaBatchEngine

    with pytest.raises(UnsupportedError, match="one sequence at a time"):
        CudaBatchEngine(models["dense"], 64, 256, 4)
