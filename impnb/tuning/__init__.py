"""Every measured choice and threshold of the GPU path, and its A/B override: one place.

Each constant says in one line why it has its value; the measurements behind it are in
docs/EXPERIMENTS.md ("Decode and load-time choices"). Tables that scripts measure lie beside
this file: gemm_table.json (scripts/tune_gemm.py), moe_table.json (scripts/tune_moe.py) and
gemv_rows_table.json (scripts/bench_gemv_rows.py).
Overrides: IMPNB_<SWITCH>=0 turns a choice off for an A/B run (anything else leaves it on; the
kernel tables also take entries, IMPNB_FOLD_T1=NVFP4=s32u2r4,Q4_K=s64u1r4, in place of theirs);
integer ones are parsed by `env_ints` / `env_number`, a malformed value a ParameterError (one
line from the CLI). The model-level ones are read when a model loads (`Overrides.from_env`),
the kernel tables' (IMPNB_EXPERTS_T1, IMPNB_FOLD_T1) at import, as their builds need them; so are
the paths of the measured tables (IMPNB_MOE_TABLE=PATH runs another moe_table.json).
Variants are (span, unroll, rows) of kernels/gemv/gemv_variants.Variant. Decode attention's
choices are in tuning/attention.py and the environment's readers in tuning/env.py, both read
through this module.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType as T

from impnb.errors import ParameterError
# decode attention's choices, and the environment's readers, live in modules of their own
from impnb.tuning.attention import (  # noqa: F401  (tuning.X is how the GPU path reads them)
    BATCH_LOOKAHEAD, BATCH_MMA_ATTENTION, BATCH_MMA_DEEP_RING, BATCH_MMA_POST, BATCH_MMA_POST_PARTS, BATCH_MMA_WARPS,
    DECODE_TC, FUSED_POST, SHORT_DECODE_CLUSTER, SHORT_DECODE_CLUSTER_HEADS, SHORT_DECODE_MAX, SHORT_DECODE_MAX_BATCH,
    SHORT_DECODE_MAX_BATCH_NO_MMA, WGMMA_HEAD_DIMS, WIDE_TILED, WINDOW_RING, WINDOW_SHORT, fuses_post, short_cluster)
from impnb.tuning.env import (  # noqa: F401
    env_choice, env_ints, env_number, env_path, env_table, env_types, env_variant, switch)


TABLE_DIR = Path(__file__).parent
# The measured tables, each replaceable by another file of its form (IMPNB_GEMM_TABLE,
# IMPNB_MOE_TABLE, IMPNB_GEMV_ROWS_TABLE; read at import, validated at first use)
GEMM_TABLE = env_path("GEMM_TABLE", TABLE_DIR / "gemm_table.json")  # prefill GEMM path per (type, N x K, M bucket)
MOE_TABLE = env_path("MOE_TABLE", TABLE_DIR / "moe_table.json")  # expert GEMM path per (type, N x K, T bucket)
# T = 2..8 decode GEMV variant per (type, N x K, use, T)
GEMV_ROWS_TABLE = env_path("GEMV_ROWS_TABLE", TABLE_DIR / "gemv_rows_table.json")
# What scripts/tune_gemm.py writes into GEMM_TABLE (gpu/gemm_dispatch.table_choice): an impnb path
# where it beats cuBLAS by more than GEMM_MARGIN; and at prompt chunks of up to GEMM_SHORT_ROWS rows
# the fastest impnb path within GEMM_SHORT_FACTOR of cuBLAS's time, so that a short prompt needs no
# cuBLAS handle: nvmath's import and cublasCreate take half a second of a process's first prompt,
# while such a chunk's GEMMs lose microseconds (tens of µs a prompt on the small models).
GEMM_MARGIN = 1.03
GEMM_SHORT_ROWS = 32
GEMM_SHORT_FACTOR = 1.6


# -- shapes of a step ------------------------------------------------------------------------
PAGE_SIZE = 32  # KV cache page (tokens): a size both decode kernels and the FA2 tiles take
GEMV_MAX_ROWS = 8  # up to this many tokens a step runs GEMVs (decode), past it GEMMs (prefill)
# Prompt tokens a forward call takes at most (prefill_chunk). Long prompts prefilled faster in
# larger chunks (bench -p 4096 by IMPNB_MAX_PREFILL_CHUNK): a dense model's GEMMs run more rows a
# launch, and a mixture of experts' chunk routes more rows to each expert, whose grouped GEMMs fill
# their 64-row tiles only past 64 rows (512 tokens give 128 experts 32 each at top 8); the MoE
# models gained up to their largest chunk measured. IMPNB_MAX_PREFILL_CHUNK sets every model's for
# a whole process (read at import).
PREFILL_CHUNK = 2048
PREFILL_CHUNK_MOE = 4096
_PREFILL_CHUNK_ENV = int(env_number("IMPNB_MAX_PREFILL_CHUNK", 0))
if os.environ.get("IMPNB_MAX_PREFILL_CHUNK") is not None and _PREFILL_CHUNK_ENV < 16:
    raise ParameterError(f"IMPNB_MAX_PREFILL_CHUNK must be at least 16, got {_PREFILL_CHUNK_ENV}")


def prefill_chunk(cfg) -> int:
    """The prompt tokens one forward call of cfg's model takes at most."""
    return _PREFILL_CHUNK_ENV or (PREFILL_CHUNK_MOE if cfg.n_expert else PREFILL_CHUNK)


# A decode graph per bucket of keys. 128 apart from 256: a chat turn's reply past a 128-token
# prompt decodes at 129..256 keys, where head dim 64's short kernel runs faster on two blocks a
# row and 1..128 on one (SHORT_DECODE_CLUSTER).
DECODE_CTX_BUCKETS = (128, 256, 1024, 4096, 16384, 65536, 262144)

# -- decode GEMVs ----------------------------------------------------------------------------
# Weights of at least DP4A_MIN_MB and DP4A_MIN_K columns of a dp4a type run their decode GEMVs
# on dp4a after one quantize_x launch: below, x is short and the launch costs more than it saves.
# IMPNB_DP4A_MIN_MB / IMPNB_DP4A_MIN_K override them (a huge value: never).
DP4A_MIN_MB = 8.0
DP4A_MIN_K = 2048
# Decode GEMVs on dp4a with a residual tail (Gemma 4's attn_output and down) take gemv_dp4a's
# tail kernel (gemv_dp4a.gemv_dp4a_residual) rather than gemv.py's (gemv_residual): off, no
# faster on Gemma 4 Q4_K_M (docs/EXPERIMENTS.md; the NVFP4 model, whose tails run on FP4's float
# decoder without it, not measured yet); IMPNB_DP4A_TAIL=1 turns it on.
DP4A_TAIL = False
# A MoE layer's routed experts' down on dp4a writes the next layer's Q|K|V input, RMSNorm(x) * its
# norm, in int8 from its grid's last block (gemv_tail.quant_tail) where that GEMV takes int8, so
# no quantize_x launch comes between (the FP4 and Q8_0 models' Q|K|V on dp4a): faster decode on
# the 30B NVFP4 and MXFP4 (docs/EXPERIMENTS.md); IMPNB_DOWN_QUANT_TAIL=0 turns it off.
DOWN_QUANT_TAIL = True
# Types whose decode GEMVs take dp4a whatever the weight's size (K >= DP4A_MIN_K still): gemv.py's
# FP4 decoder (a table lookup and a byte widening a weight) is slower than quantize_x and dp4a
# together: the 30B-A3B's 5120x2048 Q|K|V took 16.2 µs on it; its NVFP4 tg128 471 -> 518 with
# them on dp4a, where Q4_K_M's went 533 -> 509 (H200). IMPNB_DP4A_ANY_SIZE (type names) overrides.
DP4A_ANY_SIZE = (T.NVFP4, T.MXFP4)
# T = 1 plain GEMVs over at least this many rows take gemv_stream (K <= 1024): the big logits
# GEMV reached 92% of HBM bandwidth against gemv's 65%; smaller ones were even.
STREAM_MIN_ROWS = 131072
# gemv.py, T = 1, K >= WIDE_K and a WIDE_TYPES type: two warps a group over twice the rows beat
# the one-chunk default; under WIDE_MIN_ROWS rows four warps a group (under two blocks an SM else).
WIDE_K = 4096
WIDE_TYPES = (T.Q8_0, T.Q4_1, T.Q4_K, T.Q6_K)
WIDE_MIN_ROWS = 4096
# gemv_dp4a at T = 1, by type: (variant for K < DP4A_LONG_K, for K >= DP4A_LONG_K), the fastest
# of a bench_gemv.py sweep with the first chunk's loads before griddepcontrol.wait.
DP4A_LONG_K = 8192
DP4A_T1_VARIANTS = {
    T.Q8_0: ((128, 2, 4), (128, 2, 2)),
    T.Q4_K: ((64, 1, 4), (128, 1, 8)),
    T.Q5_K: ((64, 1, 4), (128, 1, 8)),  # Q4_K's, not measured
    T.Q4_1: ((128, 1, 4), (64, 3, 2)),
    T.Q4_0: ((128, 1, 4), (128, 1, 4)),
    T.Q5_0: ((128, 1, 4), (128, 1, 4)),
    T.Q6_K: ((64, 1, 8), (128, 1, 8)),
    # NVFP4 in the signed form: the best back-to-back rate over 4096x4096, 12288x4096 and
    # 14336x4096 (K < DP4A_LONG_K) and at 4096x14336 of a scripts/bench_gemv.py --dp4a sweep;
    # MXFP4 shares its decoder (its quants in NVFP4's order) and takes its variants, not measured
    T.MXFP4: ((128, 1, 8), (64, 1, 4)),
    T.NVFP4: ((128, 1, 8), (64, 1, 4)),
}
# FP4 types whose one-token dp4a dots take the signed form (gemv_dp4a_units.SIGNED_T1: positive
# and negative magnitudes in two dp4a, no select permutes): 79-88% of the copy rate back to back
# at the 8B's shapes against the select form's 67-71%; IMPNB_FP4_SIGNED_T1 (type names,
# comma-separated, or empty) overrides it, read at import.
FP4_SIGNED_T1 = env_types("IMPNB_FP4_SIGNED_T1", "MXFP4,NVFP4")
# gemv_dp4a at T = 1, (type, GLU, K >= DP4A_LONG_K): (variant, register cap, fewest output rows),
# from K = 4096 on. Q4_K: a cap of 80 changed the schedule and gained tg128 on Qwen3-8B's gate|up.
# FP4: at 64 registers s128u1r4's 8 blocks an SM hold every block of a 4096-row weight at once,
# 92% of the copy rate back to back at 4096x14336 against s64u1r4's 76%; s128u1r8 at 80 was the
# best compromise over 4096x4096 (+9%), 12288x4096 (-1%) and 14336x4096 (+3%) (bench_gemv, H200).
DP4A_T1_CAPPED = {(T.Q4_K, False, False): ((128, 1, 4), 80, 8192),
                  (T.Q4_K, True, False): ((64, 1, 4), 80, 1),
                  **{(t, False, long): (v, cap, 1) for t in (T.NVFP4, T.MXFP4)
                     for long, v, cap in ((False, (128, 1, 8), 80), (True, (128, 1, 4), 64))}}
# gemv_dp4a at T = 1 on plain rows (no GLU) of fewer than 4096 columns, by type: FP4 s64u1r4,
# at the 30B-A3B's 5120x2048 Q|K|V 2.89 µs back to back (6.69 alone) against T1_VARIANTS' s64u1r8
# 3.21 (7.17); MXFP4 2.80 (6.62) against 3.15 (6.94) (bench_gemv.py --dp4a, H200).
DP4A_T1_SHORT = {T.NVFP4: (64, 1, 4), T.MXFP4: (64, 1, 4)}
# The routed experts' gate|up on dp4a at K < DP4A_LONG_K, by type: two chunks a thread, the
# second's loads out during the first's dots, beat choose_dp4a's. IMPNB_EXPERTS_T1=0: choose_dp4a's.
# NVFP4: s64u1r4 6.41 µs against choose_dp4a's s64u1r8 8.44 on the 30B-A3B's 8 experts
# (bench_moe_decode.py --quant NVFP4, H200); MXFP4 shares its decoder and takes it, not measured.
EXPERTS_T1 = env_table("EXPERTS_T1", {T.Q4_K: (32, 2, 4), T.NVFP4: (64, 1, 4), T.MXFP4: (64, 1, 4)})
# router_fold's attn_output GEMV at T = 1 and K < DP4A_LONG_K, by type (its loads after the wait,
# not to crowd decode attention before it). IMPNB_FOLD_T1=0: choose_dp4a's.
FOLD_T1 = env_table("FOLD_T1", {T.Q4_K: (32, 2, 4)})


# Decode steps of MOE_GROUPED_MIN_ROWS..MOE_GROUPED_ROWS rows (a batch) run the routed experts
# grouped by expert (gpu/moe.moe_ffn) in the layers moe_table gives an int8 grouped path at that T
# (gpu/forward.py): faster than a GEMV a routed slot at 8 rows, slower at 2 and 4 (the 30B-A3B's
# batch, docs/PERFORMANCE.md). IMPNB_MOE_GROUPED_ROWS, IMPNB_MOE_GROUPED_MIN_ROWS override.
MOE_GROUPED_ROWS = 8
MOE_GROUPED_MIN_ROWS = 5
# A batched decode step of more than GEMV_MAX_ROWS rows (on GEMMs) takes the decode's fused norms
# (gpu/forward._forward_fused) too: each GEMM's input cast or quantization reads RMSNorm(x) * w
# itself and attn_output and the down add into x in their split-K reduce, where the layers had a
# norm kernel after each residual add. IMPNB_BATCH_FUSED_NORMS=0 keeps those kernels.
BATCH_FUSED_NORMS = True
# There, a dense FFN's stacked gate|up leaves its split-K partial products unreduced and one kernel
# (kernels/gemm/reduce_glu.py) adds them, applies the activation and writes the down's fp16 or int8
# operand, in place of the reduce, the GLU and the cast or quantization. IMPNB_BATCH_GLU_REDUCE=0
# keeps those three.
BATCH_GLU_REDUCE = True
# At these GEMM row buckets a layer's Q|K (Q4_K) and its V of another type (Q6_K, as Q4_K_M stores
# some layers') take one gemm_wgmma_rs launch and one split-K reduce (gemm_wgmma_rs_pair) in place
# of two GEMMs on their own table paths, each with its input cast or quantization and its reduce;
# measured faster at 16 and 32 rows, slower at 64 (docs/PERFORMANCE.md, 'Batched decode').
# IMPNB_GEMM_PAIR_RS_ROWS=16,32,64 overrides (empty: never).
GEMM_PAIR_RS_ROWS = (16, 32)
# At these row buckets (GEMV_MAX_ROWS for a decode of up to that many rows whose Q|K the gemv rows
# table gives the int8 GEMM, else gemm_dispatch's GEMM buckets) a layer's Q|K and its V of another
# type take one gemm_mmq launch on one x̂ and one split-K reduce (gemm_mmq_pair), in place of Q|K
# on gemm_mmq and V on its own path; a bucket here and in GEMM_PAIR_RS_ROWS takes this pair. Not
# yet measured in the engine, so none by default. IMPNB_GEMM_PAIR_MMQ_ROWS=8,16 sets them.
GEMM_PAIR_MMQ_ROWS = ()
# gemm_wgmma_rs's kernels (and its pair's) at these token tiles (gemm_wgmma_rs_block.nt_for) launch
# after the kernel before them ends, not programmatically beside it: placed while that kernel's
# blocks still hold SMs, the GEMM's blocks spread unevenly; measured faster at 32 (the synthetic
# Qwen3-8B's B = 32; docs/EXPERIMENTS.md, 'Early launches'), not measured at the others.
# IMPNB_WRS_PLAIN_TOKENS overrides (empty: every tile programmatic).
# gemm_mmq's Q4_K W through its cp.async ring with x̂, each row's scales decoded once there
# (kernels/gemm/gemm_mmq.py, W_RING_TYPES), instead of a group ahead in registers (the Qwen3-8B's
# B = 16; level at its B = 32 and the 30B-A3B's B = 8 and 16). IMPNB_MMQ_W_RING=0 turns it off.
MMQ_W_RING = switch("MMQ_W_RING", True)
# gemm_mmq's split count: one wave of the build's resident blocks (gemm_mmq.splits_for);
# IMPNB_MMQ_WAVE_SPLITS=0 takes about two blocks an SM instead.
MMQ_WAVE_SPLITS = switch("MMQ_WAVE_SPLITS", True)
# gemm_mmq's Q|K|V whose partials attention adds up (MatMul.split's keep_parts) lets the kernel after
# it launch as its blocks start (griddepcontrol.launch_dependents) instead of at its end: attention's
# reads before its wait (or a pair's V GEMV's) then run beside the GEMM's blocks: the Qwen3-30B-A3B's
# B = 8 +2.0-2.6% (docs/PERFORMANCE.md, 'Batched decode'). gemm_mmq is launched after the kernel before
# it has finished, so the kernel after it still starts only once that one has. Not where the reduce
# follows. IMPNB_MMQ_TRIGGER=0: at its end.
MMQ_TRIGGER = True
WRS_PLAIN_TOKENS = env_ints("IMPNB_WRS_PLAIN_TOKENS")
WRS_PLAIN_TOKENS = (32,) if WRS_PLAIN_TOKENS is None else WRS_PLAIN_TOKENS
# The multi-token dp4a GEMV's and router_batch's blocks send their weight rows to L2 before
# griddepcontrol.wait (kernels/common/prefetch.py), so they stream while the kernel before them
# (attention, the attn_output GEMV) runs: the Qwen3-30B-A3B's B = 8 +0.4%, level at 16
# (docs/EXPERIMENTS.md, 'L2 prefetches'). The grouped expert GEMVs' blocks prefetching theirs after
# the wait were slower (there). IMPNB_L2_PREFETCH_ROWS=0 turns it off.
L2_PREFETCH_ROWS = switch("L2_PREFETCH_ROWS", True)
# router_batch's threads load their first columns of the router's rows and of the norm's weights
# into registers before griddepcontrol.wait (no kernel writes them). IMPNB_ROUTER_EARLY=0: after it.
ROUTER_EARLY = switch("ROUTER_EARLY", True)
# router_batch's grouping of a token a tile (router_batch.SCAN 0, OWN 1, RANKED 2). OWN: the slots in
# their own order, each slot its own tile and row, written by the routing warps, in place of the
# scans, and the grouped GEMVs then run their tiles fastest in launch order (gemv_dp4a_grouped's
# tile_x); RANKED: by expert, each slot's row its rank. Neither measured clearly faster than the
# scans at the 30B-A3B's B = 8 and 16 (docs/EXPERIMENTS.md, 'router_batch's grouping in slot order').
# IMPNB_ROUTER_DIRECT overrides.
ROUTER_DIRECT = env_choice("ROUTER_DIRECT", (0, 1, 2), 0)
# The one-token dp4a dots of Q4_K (a row-chunk against one token: gemv_dp4a at T = 1, the routed
# experts' GEMVs, the grouped ones at a token a tile) meet the high nibbles masked in place, one
# shift a sum where the nibbles' shifts take four (gemv_dp4a_units.q4_k_dot_t1): the 30B-A3B's
# B = 8 / 16 +0.3% (docs/EXPERIMENTS.md). IMPNB_NIBBLE_HI16=0: shifted nibbles.
NIBBLE_HI16 = switch("NIBBLE_HI16", True)
# The multi-token dp4a GEMV's x̂ scales and group sums read at flat offsets of the build's row
# length (gemv_dp4a_multi's token_dots) rather than by 2-D indexing with the arrays' runtime
# strides and negative-index wrap: fewer address instructions a chunk (the 30B-A3B's attn_output
# at 8 rows and grouped gate|up, docs/EXPERIMENTS.md); the same loads, the same sums. Default off:
# not yet measured on a GPU. IMPNB_X_FLAT=1: on.
X_FLAT = switch("X_FLAT", False)
# A batch's grouped MoE layer (router_batch's path) ends in one launch that adds the routed experts
# into x and writes the next layer's Q|K|V input in gemm_mmq's int8 form (kernels/moe/combine_next.py)
# where that layer's Q|K|V take gemm_mmq, in place of moe_combine and the next layer's quantize_x32:
# faster at the Qwen3-30B-A3B's B = 8 and 16 (docs/PERFORMANCE.md, 'Batched decode').
# IMPNB_COMBINE_NEXT=0: the two launches.
COMBINE_NEXT = True
# There, where the next layer's V is of another type than its Q|K and takes the dp4a GEMV (the
# Qwen3-30B-A3B's Q6_K V layers), the combine writes V's input in quant_x's form too, in place of its
# quantize_x launch. IMPNB_COMBINE_NEXT_V=0: V quantizes its own input.
COMBINE_NEXT_V = True
# There, where gate|up's grouped dp4a GEMV writes the down's int8 input itself, the down's GEMV reads
# its tiles and first weight chunk before it waits for gate|up (the tiles are the router's, which
# gate|up waited for before it let the down launch). IMPNB_DOWN_EARLY=0: the down waits first.
DOWN_EARLY = True
# moe_combine_next there reads the slots' rows and weights (the router's) and x before it waits for
# the down. IMPNB_COMBINE_EARLY=0: it waits first.
COMBINE_EARLY = True
# A batch's grouped MoE layer (moe_ffn_grouped_decode; no shared expert, an F32 router) of up to this
# many rows routes in one launch (kernels/moe/router_batch.py: the norm, the router's product, top-k,
# the grouping of the slots and h in int8) in place of five to six kernels: faster at 8 and 16 rows,
# slower at 32 (docs/PERFORMANCE.md, 'Batched decode'). IMPNB_ROUTER_BATCH_ROWS overrides (0: never;
# router_batch.MAX_T at most).
ROUTER_BATCH_ROWS = 16

# -- Gated DeltaNet prefill ------------------------------------------------------------------
# Prompt chunks of at least this many rows run the delta rule on the tensor cores in chunks of
# 64 (kernels/deltanet/gdn_chunked.py), shorter ones token by token (gdn_prefill.py): on the
# synthetic Qwen3.6-35B-A3B's 512-row chunks it gave pp512 1.80x and pp4096 1.66x the token-by-token
# prefill; shorter chunks are not measured yet. IMPNB_GDN_CHUNKED_MIN_ROWS overrides it (0: never).
GDN_CHUNKED_MIN_ROWS = 512


# Bytes of fp16 copies of the weights that a GEMM reads through cuBLAS (the table's "cublas" at
# some row bucket), dequantized once at load and kept, so that a prompt chunk reads them instead
# of dequantizing each one again: where all of a model's fit in this (a small model's), and the
# device has room for them past the cache. IMPNB_W16_RESIDENT_MB overrides (0: never).
W16_RESIDENT_MB = 1024


@dataclass(frozen=True)
class Overrides:
    """The model-level choices as the environment leaves them, read once when a model loads."""

    gemv_tail: bool = True  # decode GEMVs before a residual update run it as their tail: a norm launch fewer
    stack_mixed: bool = True  # Q, K, V (gate, up) of types one holds exactly stacked in it; else Q|K alone
    gemv_pair: bool = True  # Q|K and a V of another type with the pre-norm: one GEMV launch of two types
    attn_dp4a: bool = True  # decode attention (short; a batch's mma in one split) writes int8 for attn_output
    router_fold: bool = True  # qwen3moe: the router folded through W_o into attn_output's launch
    shared_gate_fold: bool = True  # moe_shared: the shared gate's row under the router's, its sigmoid in the down
    gemv_stream: bool = True  # T = 1 plain GEMVs of STREAM_MIN_ROWS rows and more on gemv_stream
    moe_down_dp4a: bool = True  # dp4a-type experts' down projection on dp4a (act made int8 in it)
    moe_act_int8: bool = True  # a batch's grouped gate|up GEMV writes the down GEMV's int8 act itself
    gemv_rows: bool = True  # T = 2..8 GEMVs on gemv_dp4a_multi where gemv_rows_table.json has the shape
    moe_grouped_rows: int = MOE_GROUPED_ROWS  # IMPNB_MOE_GROUPED_ROWS
    moe_grouped_min_rows: int = MOE_GROUPED_MIN_ROWS  # IMPNB_MOE_GROUPED_MIN_ROWS
    gdn_chunked_min_rows: int = GDN_CHUNKED_MIN_ROWS  # IMPNB_GDN_CHUNKED_MIN_ROWS
    # IMPNB_GEMV_ROWS_FORCE=s32u1r4 (or mmq): that path for every int8-x weight (tests, A/B)
    gemv_rows_force: str | None = None
    dp4a_min_mb: float = DP4A_MIN_MB
    dp4a_min_k: int = DP4A_MIN_K
    dp4a_any_size: tuple = DP4A_ANY_SIZE  # IMPNB_DP4A_ANY_SIZE: type names
    dp4a_tail: bool = DP4A_TAIL  # dp4a GEMVs with a residual tail on gemv_dp4a's tail kernel
    down_quant_tail: bool = DOWN_QUANT_TAIL  # the experts' dp4a down writes the next Q|K|V's int8 input
    short_decode_max: int | None = None  # IMPNB_SHORT_DECODE_MAX: every head dim's bound
    short_decode_max_batch: int = SHORT_DECODE_MAX_BATCH  # IMPNB_SHORT_DECODE_MAX_BATCH
    short_decode_max_batch_no_mma: int = SHORT_DECODE_MAX_BATCH_NO_MMA  # IMPNB_SHORT_DECODE_MAX_BATCH_NO_MMA
    short_cluster: int | None = None  # IMPNB_SHORT_CLUSTER: every bucket's blocks a row
    window_short: bool = WINDOW_SHORT  # sliding-window layers' decode kernel by their window's keys
    wide_tiled: bool = WIDE_TILED  # attention_wide's decode on its tiled kernel
    decode_tc: tuple[int, ...] = DECODE_TC  # head dims of one sequence's decode attention on FA2's decode form
    batch_lookahead: bool = BATCH_LOOKAHEAD  # the batched engine queues its next decode step ahead
    batch_mma_attention: bool = BATCH_MMA_ATTENTION  # a batch's split-kernel decode attention on attention_decode_mma
    batch_mma_deep_ring: bool = BATCH_MMA_DEEP_RING  # there, each warp's ring as deep as its SM's shared memory holds
    batch_mma_warps: int = BATCH_MMA_WARPS  # there, warps a block where each block owns an SM
    batch_mma_post: bool = BATCH_MMA_POST  # there, qkv_post in front of the kernel
    batch_mma_post_parts: bool = BATCH_MMA_POST_PARTS  # and Q|K|V's split-K partials added up there
    batch_fused_norms: bool = BATCH_FUSED_NORMS  # a batch's GEMM decode steps read the norms in their inputs' casts
    batch_glu_reduce: bool = BATCH_GLU_REDUCE  # there, gate|up's reduce, GLU and the down's operand in one kernel
    router_batch_rows: int = ROUTER_BATCH_ROWS  # up to these rows a batch's grouped MoE routes in one launch
    combine_next: bool = COMBINE_NEXT  # there, the combine writes the next layer's gemm_mmq input
    combine_next_v: bool = COMBINE_NEXT_V  # and its V's dp4a input
    down_early: bool = DOWN_EARLY  # there, the down's GEMV loads its first chunk before its wait
    combine_early: bool = COMBINE_EARLY  # and the combine reads the router's outputs and x before its wait
    mmq_trigger: bool = MMQ_TRIGGER  # gemm_mmq's Q|K|V partials for attention: the next kernel launches as it starts
    gemm_pair_rs: tuple[int, ...] = GEMM_PAIR_RS_ROWS  # row buckets where Q|K and V take gemm_wgmma_rs_pair
    gemm_pair_mmq: tuple[int, ...] = GEMM_PAIR_MMQ_ROWS  # row buckets where Q|K and V take gemm_mmq_pair
    window_ring: bool = WINDOW_RING  # one sequence's sliding-window layers keep only their window's pages
    fused_post_dims: tuple[int, ...] | None = None  # IMPNB_FUSED_POST_DIMS: head dims that fuse
    w16_resident_mb: float = W16_RESIDENT_MB  # IMPNB_W16_RESIDENT_MB

    @classmethod
    def from_env(cls) -> "Overrides":
        short_max, cluster = env_ints("IMPNB_SHORT_DECODE_MAX"), env_ints("IMPNB_SHORT_CLUSTER")
        pair_rs, pair_mmq = env_ints("IMPNB_GEMM_PAIR_RS_ROWS"), env_ints("IMPNB_GEMM_PAIR_MMQ_ROWS")
        return cls(gemv_tail=switch("GEMV_TAIL"), stack_mixed=switch("STACK_MIXED"),
                   gemv_pair=switch("GEMV_PAIR"), attn_dp4a=switch("ATTN_DP4A"),
                   router_fold=switch("ROUTER_FOLD"), shared_gate_fold=switch("SHARED_GATE_FOLD"),
                   gemv_stream=switch("GEMV_STREAM"),
                   moe_down_dp4a=switch("MOE_DOWN_DP4A"), moe_act_int8=switch("MOE_ACT_INT8"),
                   gemv_rows=switch("GEMV_ROWS"),
                   gemv_rows_force=env_variant("IMPNB_GEMV_ROWS_FORCE"),
                   moe_grouped_rows=int(env_number("IMPNB_MOE_GROUPED_ROWS", MOE_GROUPED_ROWS)),
                   moe_grouped_min_rows=int(env_number("IMPNB_MOE_GROUPED_MIN_ROWS", MOE_GROUPED_MIN_ROWS)),
                   gdn_chunked_min_rows=int(env_number("IMPNB_GDN_CHUNKED_MIN_ROWS", GDN_CHUNKED_MIN_ROWS)),
                   dp4a_min_mb=env_number("IMPNB_DP4A_MIN_MB", DP4A_MIN_MB),
                   dp4a_min_k=int(env_number("IMPNB_DP4A_MIN_K", DP4A_MIN_K)),
                   dp4a_any_size=env_types("IMPNB_DP4A_ANY_SIZE", ",".join(t.name for t in DP4A_ANY_SIZE)),
                   dp4a_tail=switch("DP4A_TAIL", DP4A_TAIL),
                   down_quant_tail=switch("DOWN_QUANT_TAIL", DOWN_QUANT_TAIL),
                   short_decode_max=short_max[0] if short_max else None,
                   short_decode_max_batch=int(env_number("IMPNB_SHORT_DECODE_MAX_BATCH", SHORT_DECODE_MAX_BATCH)),
                   short_decode_max_batch_no_mma=int(env_number("IMPNB_SHORT_DECODE_MAX_BATCH_NO_MMA",
                                                                SHORT_DECODE_MAX_BATCH_NO_MMA)),
                   short_cluster=cluster[0] if cluster else None, window_short=switch("WINDOW_SHORT", WINDOW_SHORT),
                   wide_tiled=switch("WIDE_TILED", WIDE_TILED), window_ring=switch("WINDOW_RING", WINDOW_RING),
                   fused_post_dims=env_ints("IMPNB_FUSED_POST_DIMS"),
                   decode_tc=env_ints("IMPNB_DECODE_TC") or DECODE_TC,
                   batch_lookahead=switch("BATCH_LOOKAHEAD", BATCH_LOOKAHEAD),
                   batch_mma_attention=switch("BATCH_MMA_ATTENTION", BATCH_MMA_ATTENTION),
                   batch_mma_deep_ring=switch("BATCH_MMA_DEEP_RING", BATCH_MMA_DEEP_RING),
                   batch_mma_warps=int(env_number("IMPNB_BATCH_MMA_WARPS", BATCH_MMA_WARPS)),
                   batch_mma_post=switch("BATCH_MMA_POST", BATCH_MMA_POST),
                   batch_mma_post_parts=switch("BATCH_MMA_POST_PARTS", BATCH_MMA_POST_PARTS),
                   batch_fused_norms=switch("BATCH_FUSED_NORMS", BATCH_FUSED_NORMS),
                   batch_glu_reduce=switch("BATCH_GLU_REDUCE", BATCH_GLU_REDUCE),
                   router_batch_rows=int(env_number("IMPNB_ROUTER_BATCH_ROWS", ROUTER_BATCH_ROWS)),
                   combine_next=switch("COMBINE_NEXT", COMBINE_NEXT),
                   combine_next_v=switch("COMBINE_NEXT_V", COMBINE_NEXT_V),
                   down_early=switch("DOWN_EARLY", DOWN_EARLY),
                   combine_early=switch("COMBINE_EARLY", COMBINE_EARLY),
                   mmq_trigger=switch("MMQ_TRIGGER", MMQ_TRIGGER),
                   gemm_pair_rs=GEMM_PAIR_RS_ROWS if pair_rs is None else pair_rs,
                   gemm_pair_mmq=GEMM_PAIR_MMQ_ROWS if pair_mmq is None else pair_mmq,
                   w16_resident_mb=env_number("IMPNB_W16_RESIDENT_MB", W16_RESIDENT_MB))
