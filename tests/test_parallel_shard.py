"""parallel/shard.py: each rank's slices of real quantized blocks, on the numpy side.

Row slices (Q|K|V by heads, gate|up) dequantize to the full matrix's rows bit for bit, and the
row-split matmuls concatenated equal the full one; column slices (attn_output, ffn_down) of every
rank summed equal the full matmul (the all-reduce), for several types and magnitudes; a split
off the block boundary is refused with one message. The tiny qwen3 / qwen3moe files: every rank's
tensors have the per-rank config's shapes, and the ranks' slices put back together are the file's.
"""

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from impnb.errors import UnsupportedError
from impnb.gguf_file import Tensor, open_model_file
from impnb.models.validate import validate_model
from impnb.parallel import shard
from impnb.quants import quant_format
from tests.test_repack import make_weight

TYPES = (T.F32, T.F16, T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K)
PLAIN = {T.F32: np.float32, T.F16: np.float16}


def tensor(ggml_type: T, shape: tuple, rng, std: float) -> Tensor:
    """A Tensor as gguf_file holds it (plain types as their dtype, blocks as bytes); (E, rows,
    cols) shapes are E matrices stacked."""
    rows = int(np.prod(shape[:-1]))
    raw = make_weight(ggml_type, rows, shape[-1], rng, std)
    raw = raw.view(PLAIN[ggml_type]) if ggml_type in PLAIN else raw
    return Tensor("blk.0.test", quant_format(ggml_type), shape, raw.reshape(*shape[:-1], -1))


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("std", [1e-3, 1.0, 30.0])
def test_column_slices_summed_equal_the_full_matmul(ggml_type, std):
    rng = np.random.default_rng([int(ggml_type), int(std * 1000)])
    world, rows, cols = 2, 19, 1024  # 512 columns a rank: whole blocks of 32 and of 256
    t = tensor(ggml_type, (rows, cols), rng, std)
    x = rng.standard_normal((3, cols)).astype(np.float64) * std
    full = x @ t.dequantize().astype(np.float64).T
    parts = np.full((world, 3, rows), np.nan)
    for r in range(world):
        a, b = r * cols // world, (r + 1) * cols // world
        s = shard.slice_cols(t, a, b)
        assert s.shape == (rows, b - a) and s.data.flags.c_contiguous
        w = s.dequantize()
        assert np.array_equal(w, t.dequantize()[:, a:b], equal_nan=True)  # the same values, bit for bit
        parts[r] = x[:, a:b] @ w.astype(np.float64).T
    total = parts.sum(0)
    assert np.isfinite(total).all() and np.abs(full).max() > 0
    np.testing.assert_allclose(total, full, rtol=1e-9, atol=1e-9 * np.abs(full).max())


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_row_slices_are_views_of_the_rows(ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    t = tensor(ggml_type, (3, 37, 256), rng, 0.5)  # 3 experts of 37 rows
    s = shard.slice_rows(t, 11, 30)
    assert s.shape == (3, 19, 256) and np.shares_memory(s.data, t.data)
    assert np.array_equal(s.dequantize(), t.dequantize()[:, 11:30], equal_nan=True)
    x = rng.standard_normal(256)
    np.testing.assert_allclose(s.dequantize() @ x, (t.dequantize() @ x)[:, 11:30], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ggml_type,cols,world", [(T.Q8_0, 96, 2), (T.Q4_K, 512, 4), (T.Q6_K, 768, 2)])
def test_a_split_off_the_block_boundary_is_refused(ggml_type, cols, world):
    t = tensor(ggml_type, (5, cols), np.random.default_rng(0), 1.0)
    width = cols // world
    with pytest.raises(UnsupportedError, match=f"do not fall on whole {ggml_type.name} blocks"):
        shard.slice_cols(t, width, 2 * width)


def test_heads_split_and_replicate():
    cfg = _cfg(n_head=8, n_head_kv=2)
    assert [shard.heads(cfg, 2, r) for r in range(2)] == [shard.Heads(0, 4, 0, 1), shard.Heads(4, 4, 1, 1)]
    # 4 ranks, 2 KV heads: each pair of ranks shares (replicates) the KV head its query heads read
    got = [shard.heads(cfg, 4, r) for r in range(4)]
    assert [(h.q0, h.n_head, h.kv0, h.n_head_kv) for h in got] == [(0, 2, 0, 1), (2, 2, 0, 1),
                                                                    (4, 2, 1, 1), (6, 2, 1, 1)]
    for h in got:  # every query head of a rank reads the KV head the full model gives it
        assert all((q // (8 // 2)) == h.kv0 for q in range(h.q0, h.q0 + h.n_head))
    with pytest.raises(UnsupportedError, match="8 attention heads do not split evenly over 3"):
        shard.heads(cfg, 3, 0)
    with pytest.raises(UnsupportedError, match="6 KV heads"):
        shard.heads(_cfg(n_head=12, n_head_kv=6), 4, 0)
    with pytest.raises(UnsupportedError, match="n_ff = 100 does not split evenly over 3"):
        shard.rank_config(_cfg(n_head=6, n_head_kv=3, n_ff=100), 3)
    with pytest.raises(UnsupportedError, match="qwen35 has no tensor-parallel layout"):
        shard.rank_config(_cfg(arch="qwen35"), 2)


def _cfg(**kw):
    base = dict(arch="qwen3", n_layer=1, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, head_dim_v=16,
                n_ff=128, n_vocab=10, n_ctx=64, eps=1e-6, rope_base=1e4, rope_neox=True, n_rot=16,
                attn_scale=0.25)
    base.update(kw)
    from impnb.models.config import ModelConfig

    return ModelConfig(**base)


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    from impnb.synthetic import tiny_gguf

    made = {}

    def path(arch: str, qtype: str, moe_ff: int = 64):
        if (arch, qtype, moe_ff) not in made:
            made[arch, qtype, moe_ff] = tiny_gguf(arch, qtype, tmp_path_factory.mktemp("tiny"), seed=7,
                                                  moe_ff=moe_ff)[1]
        return made[arch, qtype, moe_ff]
    return path


@pytest.mark.parametrize("arch,qtype", [("qwen3", "Q8_0"), ("qwen3", "F32"), ("qwen3moe", "F32"),
                                        ("qwen3moe", "Q8_0")])
def test_tiny_model_ranks_put_back_together(arch, qtype, tiny_model_path):
    mf = open_model_file(tiny_model_path(arch, qtype))
    cfg = validate_model(mf)
    world = 2
    rcfg = shard.rank_config(cfg, world)
    assert dataclasses.replace(rcfg, n_head=cfg.n_head, n_head_kv=cfg.n_head_kv, n_ff=cfg.n_ff,
                               n_ff_exp=cfg.n_ff_exp) == cfg
    ranks = [shard.RankFile(mf, cfg, world, r).tensors for r in range(world)]
    embd = mf.tensors.get("output.weight", mf.tensors["token_embd.weight"])
    outs = [rk["output.weight"] for rk in ranks]  # the vocabulary split (of token_embd where tied)
    assert all(o.shape == (cfg.n_vocab // world, cfg.n_embd) for o in outs)
    assert np.array_equal(np.concatenate([o.dequantize() for o in outs]), embd.dequantize())
    for name, t in mf.tensors.items():
        if name == "output.weight":
            continue
        rule = shard.split_of(name)
        parts = [rk[name] for rk in ranks]
        if rule is None:
            assert all(p is t for p in parts), name
            continue
        axis = -2 if rule[0] == "rows" else -1
        whole = np.concatenate([p.dequantize() for p in parts], axis=axis)
        if rule[1] in ("k", "v") and cfg.n_head_kv < world:
            continue  # replicated KV heads: not a partition
        assert np.array_equal(whole, t.dequantize()), name
    layer = ranks[0]
    D, Dh = cfg.n_embd, cfg.head_dim
    assert layer["blk.0.attn_q.weight"].shape == (rcfg.n_head * Dh, D)
    assert layer["blk.0.attn_k.weight"].shape == (rcfg.n_head_kv * Dh, D)
    assert layer["blk.0.attn_output.weight"].shape == (D, rcfg.n_head * cfg.head_dim_v)
    if cfg.n_expert:
        assert layer["blk.0.ffn_down_exps.weight"].shape == (cfg.n_expert, D, rcfg.n_ff_exp)
    else:
        assert layer["blk.0.ffn_down.weight"].shape == (D, rcfg.n_ff)


def test_a_split_off_the_kernels_column_groups_is_refused():
    t = tensor(T.F32, (5, 64), np.random.default_rng(1), 1.0)
    with pytest.raises(UnsupportedError, match="not whole groups of 32"):
        shard.slice_cols(t, 16, 32)


def test_tiny_moe_experts_split_whole_where_the_width_does_not(tiny_model_path):
    """qwen3moe's tiny experts 32 wide: 16 columns a rank are not whole Q8_0 blocks, so each rank
    holds 4 of the 8 experts whole (expert parallelism), views of the file's."""
    mf = open_model_file(tiny_model_path("qwen3moe", "Q8_0", moe_ff=32))
    cfg = validate_model(mf)
    assert shard.expert_split(mf.tensors, cfg, 2) == "experts"
    assert shard.rank_config(cfg, 2, "experts").n_ff_exp == cfg.n_ff_exp
    ranks = [shard.RankFile(mf, cfg, 2, r) for r in range(2)]
    assert [r.expert_range for r in ranks] == [(0, 4), (4, 4)]
    for name in ("blk.0.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight"):
        parts = [r.tensors[name] for r in ranks]
        assert all(p.shape == (4,) + mf.tensors[name].shape[1:] for p in parts)
        assert all(np.shares_memory(p.data, mf.tensors[name].data) for p in parts)
        assert np.array_equal(np.concatenate([p.dequantize() for p in parts]), mf.tensors[name].dequantize())
    wide = open_model_file(tiny_model_path("qwen3moe", "Q8_0", moe_ff=64))
    assert shard.expert_split(wide.tensors, validate_model(wide), 2) == "width"
    with pytest.raises(UnsupportedError, match="8 experts do not split evenly over 3"):
        shard.expert_split(mf.tensors, dataclasses.replace(cfg, n_ff_exp=33), 3)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_moe_summed_equals_the_whole(ggml_type, world):
    """The routed experts' FFN with each rank's experts alone (slots made local, others weighted 0)
    summed over the ranks equals the whole layer's (numpy, dequantized blocks)."""
    from impnb.kernels.moe.expert_shard import localize_ref
    from impnb.kernels.moe.reference import route_ref

    rng = np.random.default_rng([int(ggml_type), world])
    E, k, D, F, T_ = 8, 2, 256, 256, 19
    gate, up = (tensor(ggml_type, (E, F, D), rng, 0.05).dequantize() for _ in range(2))
    down = tensor(ggml_type, (E, D, F), rng, 0.05).dequantize()
    h = rng.standard_normal((T_, D)).astype(np.float32)
    experts, weights = route_ref(rng.standard_normal((T_, E)).astype(np.float32) * 3, k, True)

    def ffn(ex, w, g, u, d):
        out = np.zeros((T_, D))
        for t in range(T_):
            for j in range(k):
                a = g[ex[t, j]] @ h[t]
                silu = a * 0.5 * (1 + np.tanh(a / 2))  # a * sigmoid(a), without exp(-a)'s overflow
                out[t] += w[t, j] * (d[ex[t, j]] @ (silu * (u[ex[t, j]] @ h[t])))
        return out
    whole = ffn(experts, weights, gate, up, down)
    n = E // world
    total = np.zeros_like(whole)
    for r in range(world):
        ex, w = localize_ref(experts, weights, r * n, n)
        assert ((w == 0) | (experts // n == r)).all() and ex.max() < n
        sl = slice(r * n, (r + 1) * n)
        total += ffn(ex, w, gate[sl], up[sl], down[sl])
    assert np.abs(whole).max() > 0
    np.testing.assert_allclose(total, whole, rtol=1e-9, atol=1e-9 * np.abs(whole).max())
