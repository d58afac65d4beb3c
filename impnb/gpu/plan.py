"""What a model decides once at load (LoadPlan) and what each forward step is told (StepPlan).

The load plan holds every choice that depends on the model's shape and the environment's A/B
overrides (impnb/tuning); which kernels each weight takes lives on its Linear (gpu/weights.py).
A StepPlan is made by the engine for each forward call and passed to gpu/forward.py: nothing
about a step is written onto the model.
"""

from dataclasses import dataclass

from impnb.kernels.attention import attention_decode, attention_decode_mma
from impnb.models.config import ModelConfig
from impnb.models.spec import LayerSpec
from impnb.tuning import (DECODE_CTX_BUCKETS, SHORT_DECODE_MAX, Overrides, fuses_post,
                          short_cluster)


@dataclass(frozen=True)
class StepPlan:
    """One forward call: n_tokens rows a sequence, batch sequences (decode steps only), and
    decode attention's kernel for contexts up to ctx_bucket keys: the short kernel with
    short_blocks blocks a query row, or (short_blocks 0) the split kernel in `splits` splits;
    sliding-window layers, whose keys are at most their window's, the short kernel with
    window_blocks blocks a row (0: the split kernel). Prefill steps (n_tokens >
    attention_decode.MAX_T) take neither."""

    n_tokens: int
    ctx_bucket: int
    short_blocks: int
    splits: int
    batch: int = 1
    window_blocks: int = 0
    mma: bool = False  # a batch past tuning.SHORT_DECODE_MAX_BATCH: its split-kernel layers on attention_decode_mma

    def split_on_mma(self, window: int | None) -> bool:
        """Whether a layer of this window that takes the split kernel takes attention_decode_mma."""
        return self.mma and not self.short_for(window)

    def short_for(self, window: int | None) -> int:
        """The short kernel's blocks a query row for a layer of this window (None: the whole
        context), 0 where it takes the split kernel."""
        return self.short_blocks if window is None else self.window_blocks

    @property
    def rows(self) -> int:
        """The step's activation rows: n_tokens of each sequence, sequence by sequence."""
        return self.batch * self.n_tokens


@dataclass(frozen=True)
class LoadPlan:
    """The model's load-time choices: context buckets and decode attention's rules for them,
    qkv_post's fusion, and the environment's overrides (impnb/tuning.Overrides)."""

    cfg: ModelConfig
    n_ctx: int
    tuning: Overrides
    decode_post: bool  # the short decode kernel takes qkv_post fused in front (FUSED_POST)
    fuse_norms: bool  # decode fuses each pre-norm into the GEMVs after it (see forward.py)
    short_max: int  # decode attention takes the short kernel for context buckets up to this
    max_decode_splits: int  # the split kernel's partials are sized for this many splits
    head_dim: int  # the head dim decode attention's rules are read at (tiled_head_dim)

    @classmethod
    def make(cls, cfg: ModelConfig, n_ctx: int, tuning: Overrides, layers: tuple[LayerSpec, ...]) -> "LoadPlan":
        """The plan for cfg's model at n_ctx; norms fuse into the decode GEMVs where every layer's
        linears add straight into the residual (attn_output and ffn_down then accumulate into x,
        and the next GEMVs read RMSNorm(x) themselves), which a post-norm in between rules out."""
        D = tiled_head_dim(cfg)
        post = (D in tuning.fused_post_dims if tuning.fused_post_dims is not None
                else fuses_post(D, cfg.n_head, cfg.n_head_kv))
        short_max = (tuning.short_decode_max if tuning.short_decode_max is not None
                     else SHORT_DECODE_MAX.get(D, 0))
        max_splits = attention_decode.num_splits(n_ctx, cfg.n_head, cfg.n_head_kv, head_dim=D)
        fuse = all(spec.adds_into_residual for spec in layers)
        return cls(cfg, n_ctx, tuning, post, fuse, short_max, max_splits, D)  # ctx_bucket(n_ctx) is n_ctx

    def ctx_bucket(self, length: int) -> int:
        """The smallest of DECODE_CTX_BUCKETS holding length keys, at most n_ctx."""
        return min(self.n_ctx, next((b for b in DECODE_CTX_BUCKETS if b >= length), self.n_ctx))

    def splits_for(self, length: int) -> int:
        """Decode attention's split count for contexts up to ctx_bucket(length)."""
        cfg = self.cfg
        return attention_decode.num_splits(self.ctx_bucket(length), cfg.n_head, cfg.n_head_kv,
                                           head_dim=self.head_dim)

    def decode_step(self, length: int, n_tokens: int = 1, batch: int = 1) -> StepPlan:
        """A decode step of n_tokens rows a sequence for contexts up to ctx_bucket(length): the
        short kernel where the bucket is within short_max, else split; sliding-window layers by
        the bucket of their window's keys where that is smaller (WINDOW_SHORT). One sequence
        takes the short kernel's measured cluster (tuning.short_cluster); a batch one block a
        row (its sequences fill the GPU) and splits for its size, and a batch of more than
        tuning.SHORT_DECODE_MAX_BATCH sequences with shared KV heads the split kernel (of more
        than SHORT_DECODE_MAX_BATCH_NO_MMA where attention_decode_mma does not take the heads)."""
        bucket = self.ctx_bucket(length)
        window = self.cfg.sliding_window
        keys = (min(bucket, self.ctx_bucket(window + n_tokens - 1))
                if window and self.tuning.window_short else bucket)
        splits = self.splits_for(bucket) if batch == 1 else attention_decode.num_splits(
            bucket, self.cfg.n_head, self.cfg.n_head_kv, n_tokens, batch, head_dim=self.head_dim)
        mma = (batch > self.tuning.short_decode_max_batch and n_tokens == 1 and self.tuning.batch_mma_attention
               and attention_decode_mma.supports(self.head_dim, self.cfg.n_head, self.cfg.n_head_kv))
        return StepPlan(n_tokens, bucket, self._short_blocks(bucket, batch), splits, batch,
                        self._short_blocks(keys, batch), mma)

    def _short_blocks(self, bucket: int, batch: int) -> int:
        """The short kernel's blocks a query row for contexts up to bucket keys, 0: the split kernel."""
        cfg, t = self.cfg, self.tuning
        if batch > 1:
            mma = t.batch_mma_attention and attention_decode_mma.supports(self.head_dim, cfg.n_head, cfg.n_head_kv)
            most = t.short_decode_max_batch if mma else max(t.short_decode_max_batch, t.short_decode_max_batch_no_mma)
            short = bucket <= self.short_max and (batch <= most or cfg.n_head == cfg.n_head_kv)
            return 1 if short else 0
        row = next((b for b in DECODE_CTX_BUCKETS if b >= bucket), bucket)  # n_ctx may cut the bucket
        blocks = t.short_cluster if t.short_cluster is not None else short_cluster(self.head_dim, row, cfg.n_head)
        return blocks if bucket <= self.short_max else 0

    def prefill_step(self, n_tokens: int) -> StepPlan:
        """A prompt chunk: chunks of up to attention_decode.MAX_T rows take the split kernel at the
        largest split count (any context), longer ones the prefill attention."""
        return StepPlan(n_tokens, self.n_ctx, 0, self.max_decode_splits)


def tiled_head_dim(cfg: ModelConfig) -> int:
    """The largest of the layers' head dims the tiled decode attention kernels take (cfg.head_dim
    where the layers share one; gemma4's global 512 decodes on attention_wide, which has rules of
    its own)."""
    dims = {cfg.head_dims(il)[0] for il in range(cfg.n_layer)} & set(attention_decode.HEAD_DIMS)
    return max(dims, default=cfg.head_dim)
