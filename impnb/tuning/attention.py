"""Decode and prefill attention's measured choices (impnb/tuning re-exports them, with the rest of
the GPU path's choices and their overrides): which kernel a step's attention takes by head dim,
context bucket and batch, the short kernel's clusters, qkv_post's fusion."""


# Head dim: the largest context bucket whose decode attention takes the one-block-a-row short
# kernel (faster than split-K up to there); IMPNB_SHORT_DECODE_MAX overrides (0: never).
SHORT_DECODE_MAX = {64: 4096, 128: 1024, 256: 4096}
# A batched decode step of more sequences than this takes the split kernel whatever the bucket
# where KV heads are shared (GQA): its blocks own a KV head's query rows and read the K/V once,
# where the short kernel's one block a query row reads them once a head (on the synthetic
# Qwen3-8B at 128-256 keys, B = 64 / 128 decoded 1.26x / 1.34x faster, B = 8 1.05x on
# attention_decode_mma in one split; the Qwen3-30B-A3B's B = 8 level). IMPNB_SHORT_DECODE_MAX_BATCH.
SHORT_DECODE_MAX_BATCH = 4
# Where attention_decode_mma does not take the head dim (Gemma3's 256), a batch of up to this many
# sequences keeps the short kernel (past it: the split kernel with qkv_post apart): Gemma3 270M at
# B = 8 / 16 decoded 8559 / 11773 tok/s against 7793 / 10834 (docs/PERFORMANCE.md, 'Batched
# decode'). IMPNB_SHORT_DECODE_MAX_BATCH_NO_MMA.
SHORT_DECODE_MAX_BATCH_NO_MMA = 16
# Sliding-window layers pick decode attention's kernel by the bucket of their window's keys (the
# short kernel where that is within SHORT_DECODE_MAX) rather than the context's, which past the
# window sends them to the split kernel. IMPNB_WINDOW_SHORT=0 turns it off.
WINDOW_SHORT = True
# One sequence's sliding-window layers keep only their window's KV pages (gpu/kv.PagedKV's ring),
# decoding as fast as with whole pools; IMPNB_WINDOW_RING=0 gives them every position's pages.
WINDOW_RING = True
# Decode attention at heads past the tiled kernels' (Gemma 4's 512) on attention_wide_tiled (K/V
# widened to float32 once a block in shared memory) rather than attention_wide's kernel (each
# warp widening them): faster at every context and split count bench_decode_attention.py
# --wide-tiled measured; IMPNB_WIDE_TILED=0 turns it off.
WIDE_TILED = True
# Head dims whose one-sequence decode attention (a token a step) runs on FA2's tensor-core tiles in
# their decode form (attention_fa2_decode.py: a block's tile rows the query heads of one KV head,
# the keys split over the SMs, attention_wide's merge) rather than the CUDA-core kernels above:
# Gemma 4's global heads of 512, where it made tg128 at depth 4096 faster than attention_wide_tiled;
# not 256, where Gemma 4's sliding layers (1024 keys) run faster on the short kernel
# (docs/EXPERIMENTS.md); IMPNB_DECODE_TC=256,512 picks head dims, IMPNB_DECODE_TC=0 none.
DECODE_TC: tuple[int, ...] = (512,)
# The batched engine queues its next decode step on the device's own inputs before the host reads
# a step's tokens (engine_batch.py, "Look-ahead"): the host's work on a step (scheduler, stops,
# streams) then runs beside the GPU's next one; IMPNB_BATCH_LOOKAHEAD=0 turns it off.
BATCH_LOOKAHEAD = True
# A batched decode step of more than SHORT_DECODE_MAX_BATCH sequences, where it would take the split
# kernel, on the tensor-core kernel (attention_decode_mma.py: a block a sequence's KV head, its query
# heads one m16 tile's rows): faster on the synthetic Qwen3-8B's batches of 16, 64 and 128 at 256
# keys, level at 32; smaller batches, not measured on it, keep the split kernel past SHORT_DECODE_MAX.
# IMPNB_BATCH_MMA_ATTENTION=0 keeps the split kernel.
BATCH_MMA_ATTENTION = True
# attention_decode_mma's warps keep four tiles in their rings at head dim 128 where a block owns an SM
# (attention_decode_mma.ring_stages), not the two that three blocks an SM leave (STAGES): a batch of
# few sequences has few blocks, each streaming its keys (the Qwen3-30B-A3B's B = 16 faster, the
# Qwen3-8B's level). IMPNB_BATCH_MMA_DEEP_RING=0 keeps STAGES.
BATCH_MMA_DEEP_RING = True
# attention_decode_mma's blocks of eight warps rather than four where each block owns an SM
# (attention_decode_mma.ring_plan; their rings three tiles deep at head dim 128): a warp's chain of
# 16-key tiles half as long (the Qwen3-30B-A3B's B = 8 a little faster, its B = 16 and the Qwen3-8B's
# level: docs/EXPERIMENTS.md). IMPNB_BATCH_MMA_WARPS=4 keeps four.
BATCH_MMA_WARPS = 8
# qkv_post in front of attention_decode_mma at a batch's decode step (its Post), in place of its
# launch, the cached keys' first tiles sent before the kernel's wait (the Qwen3-8B's B = 16 and 32 and
# the Qwen3-30B-A3B's 8 and 16 4-6% faster: docs/PERFORMANCE.md). IMPNB_BATCH_MMA_POST=0 keeps qkv_post.
BATCH_MMA_POST = True
# There, Q|K|V's split-K partial products (gemm_mmq, gemm_wgmma_rs and its pair) added up by the
# attention kernel's qkv_post rather than by their reduce launch (both models' batches 2-5% faster:
# docs/PERFORMANCE.md). IMPNB_BATCH_MMA_POST_PARTS=0 keeps the reduce.
BATCH_MMA_POST_PARTS = True
# (head dim, bucket): the short kernel's blocks a query row (a thread-block cluster splitting the
# keys), 1 where not listed: clusters won at 1024-4096 keys, and two blocks at head dim 64's
# 129..256 keys (SmolLM2); one block won at 1..128; IMPNB_SHORT_CLUSTER.
SHORT_DECODE_CLUSTER = {(64, 256): 2, (64, 1024): 8, (64, 4096): 8, (128, 1024): 2, (256, 1024): 8,
                        (256, 4096): 8}
# (head dim, bucket, query heads): where a model's head count measured another cluster than the
# table's above: Gemma-4-26B-A4B's sliding layers (16 heads on 8 KV heads of 256) run faster on 4
# blocks a row than on 8, Gemma3's 4 heads on 8 (docs/EXPERIMENTS.md, WINDOW_SHORT).
SHORT_DECODE_CLUSTER_HEADS = {(256, 1024, 16): 4}


def short_cluster(head_dim: int, bucket: int, n_head: int) -> int:
    """The short decode kernel's blocks a query row at this head dim, context bucket and head count."""
    return SHORT_DECODE_CLUSTER_HEADS.get((head_dim, bucket, n_head), SHORT_DECODE_CLUSTER.get((head_dim, bucket), 1))
# Head dim: the most query heads a KV head at which the short kernel takes qkv_post fused in
# front (one launch a layer fewer); past it every block's norm and RoPE prologue costs more than
# the launch. IMPNB_FUSED_POST_DIMS (head dims, any GQA) overrides it.
FUSED_POST = {64: 32, 128: 4}
# Prefill attention head dims on the wgmma kernel (sm_90 only): it beat FA2 at every length.
WGMMA_HEAD_DIMS = (64, 128)


def fuses_post(head_dim: int, n_head: int, n_head_kv: int) -> bool:
    """Whether decode attention takes qkv_post fused in front at this shape (FUSED_POST)."""
    return n_head // n_head_kv <= FUSED_POST.get(head_dim, 0)
