"""The load plan and step plans (gpu/plan.py), the Linears' kernel choices (gpu/weights.py) and
each layer's weights by role (gpu/layer_weights.py) on the simulator's device arrays, against the
rules they were written from (impnb/tuning)."""

import pytest

from impnb.gguf_file import open_model_file
from impnb.gpu import gemm_dispatch
from impnb.gpu.model import DeviceModel
from impnb.gpu.plan import LoadPlan
from impnb.kernels.attention import attention_decode
from impnb.kernels.common.repack import PackedWeight
from impnb.kernels.gemv.gemv_dp4a_units import DOTS
from impnb.kernels.moe import gemv_moe_dp4a
from impnb.models.config import ModelConfig
from impnb.models.spec import LayerSpec
from impnb.synthetic import tiny_gguf
from impnb.tuning import DECODE_CTX_BUCKETS, SHORT_DECODE_CLUSTER, SHORT_DECODE_MAX, Overrides, short_cluster

PRE_NORM = (LayerSpec(),) * 2
GEMMA = (LayerSpec(post_attn_norm="post_attention_norm", post_ffn_norm="post_ffw_norm"),) * 2


def cfg_of(head_dim: int, n_head: int = 32, n_head_kv: int = 8) -> ModelConfig:
    return ModelConfig(arch="qwen3", n_layer=2, n_embd=4096, n_head=n_head, n_head_kv=n_head_kv,
                       head_dim=head_dim, head_dim_v=head_dim, n_ff=128, n_vocab=512, n_ctx=40960,
                       eps=1e-6, rope_base=1e6, rope_neox=True, n_rot=head_dim, attn_scale=head_dim ** -0.5)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("n_ctx", [64, 1000, 4096, 40960])
def test_decode_step_follows_the_tables(head_dim, n_ctx):
    cfg = cfg_of(head_dim)
    plan = LoadPlan.make(cfg, n_ctx, Overrides(), PRE_NORM)
    assert plan.max_decode_splits == attention_decode.num_splits(n_ctx, 32, 8, head_dim=head_dim)
    for length in (1, 10, 255, 256, 257, 1000, 1024, 1025, 4096, 5000, 40960):
        if length > n_ctx:
            continue
        step = plan.decode_step(length)
        bucket = min(n_ctx, next(b for b in DECODE_CTX_BUCKETS if b >= length))
        row = next(b for b in DECODE_CTX_BUCKETS if b >= bucket)
        short = SHORT_DECODE_CLUSTER.get((head_dim, row), 1) if bucket <= SHORT_DECODE_MAX[head_dim] else 0
        assert (step.n_tokens, step.ctx_bucket, step.short_blocks, step.batch) == (1, bucket, short, 1)
        assert step.splits == attention_decode.num_splits(bucket, 32, 8, head_dim=head_dim)
    chunk = plan.prefill_step(5)
    assert (chunk.short_blocks, chunk.splits, chunk.n_tokens) == (0, plan.max_decode_splits, 5)


@pytest.mark.parametrize("window_short", [True, False])
def test_window_layers_decode_by_their_windows_keys(window_short):
    """Gemma-4-26B-A4B's sliding layers (1024 keys, heads of 256): past the short kernel's range the
    context's layers take the split kernel and the window's the short kernel at the window's bucket
    (WINDOW_SHORT; off: both the context's choice); within the window both are the same."""
    from dataclasses import replace

    cfg = replace(cfg_of(256, 16, 8), sliding_window=1024, swa_layers=(True, False))
    plan = LoadPlan.make(cfg, 16384, Overrides(window_short=window_short), PRE_NORM)
    for length, n_tok in ((8000, 1), (5000, 3), (4097, 8)):
        step = plan.decode_step(length, n_tok)
        assert step.short_blocks == 0 and step.short_for(None) == 0 and step.splits > 1
        want = short_cluster(256, plan.ctx_bucket(1024 + n_tok - 1), 16) if window_short else 0  # T - 1 keys more
        assert step.window_blocks == step.short_for(1024) == want
    for length in (100, 1000):
        step = plan.decode_step(length)
        assert step.window_blocks == step.short_blocks > 0
    step = plan.decode_step(3000)  # both short: the context's at 4096 keys, the window's at 1024
    assert (step.short_blocks, step.window_blocks) == (
        short_cluster(256, 4096, 16), short_cluster(256, 1024 if window_short else 4096, 16))
    assert short_cluster(256, 1024, 16) != SHORT_DECODE_CLUSTER[256, 1024]  # the head count's own entry
    batch = plan.decode_step(8000, 1, 4)
    assert (batch.short_blocks, batch.window_blocks) == (0, 1 if window_short else 0)
    assert plan.prefill_step(40).short_for(1024) == 0


@pytest.mark.parametrize("head_dim", [128, 256])
def test_batches_keep_the_short_kernel_where_mma_takes_no_heads(head_dim):
    """A batch past SHORT_DECODE_MAX_BATCH takes the split kernel (on attention_decode_mma) where
    that takes the head dim; at 256 (Gemma3's) the short kernel up to SHORT_DECODE_MAX_BATCH_NO_MMA."""
    from impnb.tuning import SHORT_DECODE_MAX_BATCH, SHORT_DECODE_MAX_BATCH_NO_MMA

    plan = LoadPlan.make(cfg_of(head_dim, 4, 1), 1024, Overrides(), GEMMA)
    most = SHORT_DECODE_MAX_BATCH if head_dim == 128 else SHORT_DECODE_MAX_BATCH_NO_MMA
    assert SHORT_DECODE_MAX_BATCH < 8 <= SHORT_DECODE_MAX_BATCH_NO_MMA < 32
    for batch in (2, SHORT_DECODE_MAX_BATCH, 8, SHORT_DECODE_MAX_BATCH_NO_MMA, 32):
        step = plan.decode_step(200, 1, batch)
        assert step.short_blocks == (1 if batch <= most else 0), batch
        assert step.mma == (batch > SHORT_DECODE_MAX_BATCH and head_dim == 128)
    plan = LoadPlan.make(cfg_of(256, 4, 1), 1024, Overrides(short_decode_max_batch_no_mma=0), GEMMA)
    assert plan.decode_step(200, 1, 8).short_blocks == 0


def test_step_plan_overrides():
    plan = LoadPlan.make(cfg_of(64), 4096, Overrides(short_decode_max=0), PRE_NORM)
    assert plan.decode_step(100).short_blocks == 0
    plan = LoadPlan.make(cfg_of(64), 4096, Overrides(short_cluster=2), PRE_NORM)
    assert plan.decode_step(100).short_blocks == 2 and plan.decode_step(2000).short_blocks == 2
    assert not LoadPlan.make(cfg_of(128), 64, Overrides(fused_post_dims=()), PRE_NORM).decode_post
    assert LoadPlan.make(cfg_of(256), 64, Overrides(fused_post_dims=(256,)), PRE_NORM).decode_post


@pytest.mark.parametrize("qtype", ["Q8_0", "Q8_0_V_Q4_1", "F32"])
@pytest.mark.parametrize("all_dp4a", [False, True])
def test_linear_choices(tmp_path, monkeypatch, qtype, all_dp4a):
    """Each Linear's decode kernels follow the rule: dp4a for a dp4a type at least DP4A_MIN_MB and
    DP4A_MIN_K (both 0 with all_dp4a), gemv_stream for none of a tiny model's (too few rows)."""
    if all_dp4a:
        monkeypatch.setenv("IMPNB_DP4A_MIN_MB", "0")
        monkeypatch.setenv("IMPNB_DP4A_MIN_K", "0")
    _, path = tiny_gguf("qwen3moe", qtype, tmp_path, seed=1)
    m = DeviceModel(open_model_file(path), 64)
    assert set(m.lin) == {name for name, w in m.w.items() if isinstance(w, PackedWeight)}
    for name, lin in m.lin.items():
        w = lin.w
        assert lin.w is m.w[name] and not lin.stream
        assert lin.int8_x == (w.ggml_type in DOTS and w.cols >= m.tuning.dp4a_min_k)
        assert lin.dp4a == (lin.int8_x and w.nbytes >= m.tuning.dp4a_min_mb * 1e6)
        assert lin.gemm_path(300) == gemm_dispatch.choose(w.ggml_type, w.rows, w.cols, 300)
    assert bool(m.dp4a_linears()) == (all_dp4a and qtype != "F32")
    assert (len(m.router_folds) == m.cfg.n_layer) == (all_dp4a and qtype != "F32")


def test_norms_fuse_where_every_layer_adds_into_the_residual():
    assert LoadPlan.make(cfg_of(64), 64, Overrides(), PRE_NORM).fuse_norms
    assert LoadPlan.make(cfg_of(64), 64, Overrides(), (LayerSpec(ffn="moe"),) * 2).fuse_norms
    assert not LoadPlan.make(cfg_of(256), 64, Overrides(), GEMMA).fuse_norms
    assert not LoadPlan.make(cfg_of(64), 64, Overrides(), (LayerSpec(), GEMMA[0])).fuse_norms


@pytest.mark.parametrize("all_dp4a", [False, True])
def test_layer_weights_by_role(tmp_path, monkeypatch, all_dp4a):
    """Q|K stacked with V apart (its type differs) in one launch unless either is on dp4a; the
    routed experts' decode kernels and the router fold as the Linears allow."""
    if all_dp4a:
        monkeypatch.setenv("IMPNB_DP4A_MIN_MB", "0")
        monkeypatch.setenv("IMPNB_DP4A_MIN_K", "0")
    _, path = tiny_gguf("qwen3moe", "Q8_0_V_Q4_1", tmp_path, seed=1)
    m = DeviceModel(open_model_file(path), 64)
    for il, lw in enumerate(m.blk):
        p = f"blk.{il}."
        att, ex = lw.attn, lw.ffn
        assert att.qkv is None and att.qk is m.lin[p + "attn_qk"] and att.v is m.lin[p + "attn_v"]
        assert att.pair == (not all_dp4a) and att.o is m.lin[p + "attn_output"]
        assert att.q_norm is m.w[p + "attn_q_norm"] and att.post_norm is None and ex.post_norm is None
        assert ex.router is m.lin[p + "ffn_gate_inp"] and ex.gate_up is m.w[p + "ffn_gate_up_exps"]
        assert ex.gate_up_dp4a == all_dp4a and (ex.fold is not None) == all_dp4a
        assert ex.down_dp4a == (m.cfg.n_embd >= gemv_moe_dp4a.ROWS)  # Q8_0 down: dp4a where its rows fit
        assert lw.next_norm is m.w[f"blk.{il + 1}.attn_norm" if il + 1 < m.cfg.n_layer else "output_norm"]
    assert m.output is m.lin["output"]
