"""The tensor-parallel layout on the numpy reference: each rank's slices (parallel/shard.py) run
through the reference's own layer functions with the rank's config, their attention and FFN
outputs summed (the all-reduce) and their logits concatenated (the all-gather), give the whole
model's logits on the tiny qwen3 (2 ranks, and 4: one query head a rank, KV heads replicated)
and qwen3moe (experts split by width). What the GPU ranks compute, less the kernels."""

import numpy as np
import pytest

from impnb.gguf_file import open_model_file
from impnb.models import layers, load_reference
from impnb.models.kv_cache import KVCache
from impnb.models.numpy_ops import NumpyOps
from impnb.models.validate import validate_model
from impnb.parallel import shard
from impnb.synthetic import tiny_gguf


def tp_forward(mf, world: int, tokens: np.ndarray, n_ctx: int = 64) -> np.ndarray:
    """The layer graph of models/layers.forward, run rank by rank and reduced."""
    cfg = validate_model(mf)
    files = [shard.RankFile(mf, cfg, world, r) for r in range(world)]
    assert all(f.expert_split in (None, "width") for f in files)
    rcfg = shard.rank_config(cfg, world, files[0].expert_split)
    ops = [NumpyOps(f, rcfg) for f in files]
    caches = [KVCache(rcfg, n_ctx) for _ in range(world)]
    specs = load_reference(mf).layers
    pos = np.arange(len(tokens))
    x = ops[0].embed(tokens)  # token_embd whole on every rank
    for il, spec in enumerate(specs):
        p = f"blk.{il}."
        x = x + sum(layers.MIXERS[spec.mixer](o, rcfg, il, o.norm(x, p + "attn_norm"), pos, c)
                    for o, c in zip(ops, caches))
        x = x + sum(layers.FFNS[spec.ffn](o, il, o.norm(x, p + spec.ffn_norm)) for o in ops)
    return np.concatenate([o.output(x) for o in ops], axis=-1)


@pytest.mark.parametrize("arch,world", [("qwen3", 2), ("qwen3", 4), ("qwen3moe", 2)])
def test_ranks_reduced_equal_the_whole_model(arch, world, tmp_path):
    _, path = tiny_gguf(arch, "F32", tmp_path, seed=9, moe_ff=64)
    mf = open_model_file(path)
    ref = load_reference(mf)
    tokens = np.random.default_rng(world).integers(0, ref.cfg.n_vocab, 23)
    want = ref.forward(tokens, ref.new_cache(64))
    got = tp_forward(mf, world, tokens)
    assert got.shape == want.shape and np.isfinite(got).all()
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel < 1e-4, rel
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
