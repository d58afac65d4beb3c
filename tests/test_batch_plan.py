"""The batched engine's step plans and buckets (gpu/plan.py, engine_batch.py), without a GPU."""

import pytest

from impnb.engine_batch import BATCH_BUCKETS, batch_bucket
from impnb.gpu.plan import LoadPlan
from impnb.kernels.attention import attention_decode
from impnb.models.config import ModelConfig
from impnb.models.spec import LayerSpec
from impnb.tuning import SHORT_DECODE_MAX_BATCH, SHORT_DECODE_MAX_BATCH_NO_MMA, Overrides

LAYERS = (LayerSpec(),) * 2


def cfg_of(head_dim: int) -> ModelConfig:
    return ModelConfig(arch="qwen3", n_layer=2, n_embd=4096, n_head=32, n_head_kv=8, head_dim=head_dim,
                       head_dim_v=head_dim, n_ff=128, n_vocab=512, n_ctx=40960, eps=1e-6, rope_base=1e6,
                       rope_neox=True, n_rot=head_dim, attn_scale=head_dim ** -0.5)


def test_batch_buckets():
    assert [batch_bucket(n, 256) for n in (1, 2, 3, 5, 9, 33, 129, 256)] == [1, 2, 4, 8, 16, 64, 256, 256]
    assert batch_bucket(5, 6) == 6 and batch_bucket(1, 6) == 1
    assert list(BATCH_BUCKETS) == sorted(BATCH_BUCKETS)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("batch", [2, 8, 64, 256])
def test_batch_decode_step(head_dim, batch):
    """A batch of up to SHORT_DECODE_MAX_BATCH sequences (SHORT_DECODE_MAX_BATCH_NO_MMA at heads
    attention_decode_mma does not take) takes the short kernel at one block a row where one
    sequence would (its rows fill the GPU), a larger one (GQA here) the split kernel always, at
    the split count for its size; one sequence is unchanged."""
    plan = LoadPlan.make(cfg_of(head_dim), 8192, Overrides(), LAYERS)
    most = SHORT_DECODE_MAX_BATCH if head_dim in (64, 128) else SHORT_DECODE_MAX_BATCH_NO_MMA
    for length in (1, 300, 1025, 5000, 8192):
        one, many = plan.decode_step(length), plan.decode_step(length, 1, batch)
        assert (many.batch, many.n_tokens, many.rows, many.ctx_bucket) == (batch, 1, batch, one.ctx_bucket)
        assert many.short_blocks == (1 if one.short_blocks and batch <= most else 0)
        assert many.splits == attention_decode.num_splits(one.ctx_bucket, 32, 8, 1, batch, head_dim=head_dim)
        assert many.splits <= one.splits
        assert plan.decode_step(length, 1, 1) == one
        # the split kernel's layers of a batch past SHORT_DECODE_MAX_BATCH on attention_decode_mma at
        # its head dims; not one sequence's, nor a batch of several tokens a sequence
        assert many.mma == (head_dim in (64, 128) and batch > SHORT_DECODE_MAX_BATCH)
        assert not one.mma and not plan.decode_step(length, 2, batch).mma
        assert many.split_on_mma(None) == (many.mma and not many.short_blocks)


def test_batch_mma_attention_override():
    """IMPNB_BATCH_MMA_ATTENTION=0 (Overrides.batch_mma_attention) keeps the split kernel."""
    plan = LoadPlan.make(cfg_of(128), 8192, Overrides(batch_mma_attention=False), LAYERS)
    assert not plan.decode_step(300, 1, 64).mma


def test_large_batch_without_gqa_keeps_the_short_kernel():
    """Without shared KV heads the split kernel's grouping saves nothing: a large batch keeps the
    short kernel where one sequence takes it."""
    cfg = cfg_of(128)
    cfg = type(cfg)(**{**cfg.__dict__, "n_head_kv": 32})
    plan = LoadPlan.make(cfg, 8192, Overrides(), LAYERS)
    assert plan.decode_step(300).short_blocks and plan.decode_step(300, 1, 64).short_blocks == 1


def test_short_decode_max_batch_override():
    """IMPNB_SHORT_DECODE_MAX_BATCH (Overrides.short_decode_max_batch): a batch past it takes the
    split kernel's layers on attention_decode_mma, one within it the short kernel."""
    plan = LoadPlan.make(cfg_of(128), 8192, Overrides(short_decode_max_batch=2), LAYERS)
    four, two = plan.decode_step(300, 1, 4), plan.decode_step(300, 1, 2)
    assert four.mma and not four.short_blocks and four.split_on_mma(None)
    assert two.short_blocks == 1 and not two.mma
    default = LoadPlan.make(cfg_of(128), 8192, Overrides(), LAYERS)
    assert default.decode_step(300, 1, SHORT_DECODE_MAX_BATCH).short_blocks == 1
    assert default.decode_step(300, 1, 2 * SHORT_DECODE_MAX_BATCH).mma


@pytest.mark.parametrize("n_sm", [132, 114])
def test_mma_splits(n_sm):
    """attention_decode_mma.num_splits: one split where the batch's blocks (a sequence's KV head
    each) fill every SM; else splits of at least SPLIT_MIN_KEYS keys, never past MAX_SPLITS or
    about three blocks an SM."""
    from impnb.kernels.attention import attention_decode_mma as mma

    for hkv in (1, 4, 8):
        for batch in (2, 4, 8, 16, 32, 64, 128, 256):
            blocks = hkv * batch
            for bucket in (64, 256, 512, 1024, 4096, 32768):
                s = mma.num_splits(bucket, hkv, batch, n_sm=n_sm)
                assert 1 <= s <= mma.MAX_SPLITS and (s == 1 or blocks * (s - 1) < 3 * n_sm), (hkv, batch, bucket, s)
                assert s == 1 or bucket // s >= mma.SPLIT_MIN_KEYS
                if blocks >= n_sm:
                    assert s == 1
                else:
                    assert s == min(-(-3 * n_sm // blocks), max(1, bucket // mma.SPLIT_MIN_KEYS), mma.MAX_SPLITS)
            assert mma.num_splits(512, hkv, batch, window=100, n_sm=n_sm) == 1  # a window of 100 keys


@pytest.mark.parametrize("n_sm", [132, 114])
def test_mma_ring_stages(n_sm):
    """attention_decode_mma.ring_stages: the deepest listed ring whose blocks an SM fit its shared
    memory together, the default depth where none does (three blocks an SM and more)."""
    from impnb.kernels.attention import attention_decode_mma as mma

    for D in mma.HEAD_DIMS:
        assert mma.STAGES[D] in mma.STAGE_CHOICES[D]
        depths = []
        for blocks in (1, 32, n_sm, n_sm + 1, 2 * n_sm, 2 * n_sm + 1, 3 * n_sm, 4 * n_sm, 10 * n_sm):
            st = mma.ring_stages(D, blocks, n_sm)
            per_sm = -(-blocks // n_sm)
            assert st in mma.STAGE_CHOICES[D], (D, blocks, st)
            fits = per_sm * (mma.ring_bytes(D, st) + 1024) <= mma.SM_SHARED
            deeper = [d for d in mma.STAGE_CHOICES[D] if d > st]
            assert (fits and all(per_sm * (mma.ring_bytes(D, d) + 1024) > mma.SM_SHARED for d in deeper)) \
                or (not fits and st == mma.STAGES[D]), (D, blocks, st)
            depths.append(st)
        assert depths == sorted(depths, reverse=True)  # more blocks an SM, never a deeper ring
        assert depths[0] == max(mma.STAGE_CHOICES[D]) and depths[-1] == mma.STAGES[D]
    assert mma.ring_stages(128, 128, n_sm=132) == 4 and mma.ring_stages(128, 256, n_sm=132) == 2


@pytest.mark.parametrize("n_sm", [132, 114])
def test_mma_ring_plan(n_sm):
    """attention_decode_mma.ring_plan: blocks of WIDE_WARPS warps only where asked and every block
    owns an SM, their rings then WIDE_STAGES deep and within an SM's shared memory; else four
    warps at ring_stages' depth."""
    from impnb.kernels.attention import attention_decode_mma as mma

    for D in mma.HEAD_DIMS:
        assert mma.ring_bytes(D, mma.WIDE_STAGES[D], mma.WIDE_WARPS) + 1024 <= mma.SM_SHARED
        for blocks in (1, 32, n_sm, n_sm + 1, 3 * n_sm):
            assert mma.ring_plan(D, blocks, n_sm) == (mma.ring_stages(D, blocks, n_sm), mma.WARPS)
            wide = mma.ring_plan(D, blocks, n_sm, mma.WIDE_WARPS)
            assert wide == ((mma.WIDE_STAGES[D], mma.WIDE_WARPS) if blocks <= n_sm else
                            (mma.ring_stages(D, blocks, n_sm), mma.WARPS)), (D, blocks, wide)
            assert wide in mma.layouts(D)
