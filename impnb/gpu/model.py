"""A model resident on the GPU: quantized weights, the paged KV cache, buffers and `linear`.

Weights stay in their GGUF type (kernel layout from impnb/kernels/common/repack.py); 1-D norm
weights are float32. `linear` is GEMV with fused dequantization for up to GEMV_MAX_ROWS
tokens (on dp4a with int8 activations for the weights DP4A_MIN_MB / DP4A_MIN_K pick), else the
GEMM gpu/gemm_dispatch.py picks: tensor-core tiles on the stored weight, or dequantization to
fp16 and cuBLAS (the fallback). The stacked Q|K|V always takes cuBLAS.
"""

import logging
import os

import numpy as np
from gguf import GGMLQuantizationType as T

from impnb.errors import ParameterError, UnsupportedError
from impnb.cuda_support import GPU_ARCHS
from impnb.gguf_file import ModelFile
from impnb.gpu.buffers import Arena
from impnb.gpu import gemm_dispatch
from impnb.gpu.context import GpuContext
from impnb.gpu.cublas_gemm import Cublas
from impnb.kernels.elementwise import activations
from impnb.kernels.attention import attention_decode, kv_cache
from impnb.kernels.gemv import gemv, gemv_dp4a, gemv_stream
from impnb.kernels.common import repack
from impnb.kernels.gemm.dequant import dequant
from impnb.kernels.gemv.gemv_tail import Residual
from impnb.kernels.gemv.quant_x import GROUP, QuantX, quantize_x
from impnb.kernels.elementwise.cast import cast_f16
from impnb.kernels.moe.moe import check_experts
from impnb.kernels.gemm.gemm_tc_quant import gemm_quant
from impnb.kernels.gemm.gemm_wgmma_quant import gemm_wgmma_quant
from impnb.kernels.attention.rope import rope_inv_freq
from impnb.kernels.moe.router_fold import Fold, fold_ref
from impnb.models import model_config
from impnb.quant_promote import common_type, promote

log = logging.getLogger("impnb.gpu")
PAGE_SIZE = 32
GEMV_MAX_ROWS = 8
MAX_PREFILL_CHUNK = 512
DECODE_CTX_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144)  # decode graphs per bucket
# decode attention for context buckets up to this (by head dim) takes attention_decode_short,
# else the split kernel; SHORT_DECODE_CLUSTER gives its blocks a query row (a thread-block
# cluster splitting the keys) by (head dim, bucket), 1 where not listed. Measured on the H100
# (2026-11-24, µs a call, split kernel / short at 1 / short at the cluster chosen): at 1024 keys
# SmolLM2 (D 64) 10.3 / 9.3 / 5.1 (8), Qwen3-30B-A3B (D 128) 17.2 / 16.1 / 11.6 (2), Gemma3
# (D 256) 14.5 / 29.0 / 8.4 (8); at 4096 keys SmolLM2 10.3 / 32.8 / 8.1 (8), Gemma3 25.3 / 124.6
# / 20.1 (8), Qwen3-30B-A3B 21 / 63.7 / 34.2 (8: split stays); at 131-256 keys clusters lose at
# D 64 and 128 and break even at D 256 (tg128 in one run: Gemma3 1368 / 1365). tg128 at depth
# 700: SmolLM2 1293 -> 1462, Gemma3 1084 (split) -> 1261.
# IMPNB_SHORT_DECODE_MAX / IMPNB_SHORT_CLUSTER override them for A/B runs (0: never).
SHORT_DECODE_MAX = {64: 4096, 128: 1024, 256: 4096}
SHORT_DECODE_CLUSTER = {(64, 1024): 8, (64, 4096): 8, (128, 1024): 2, (256, 1024): 8, (256, 4096): 8}
# short decode attention takes qkv_post fused in front (one kernel a layer fewer) at these head
# dims, up to the given query heads a KV head. Measured on the H100 (tg128 in one run, fused /
# separate): SmolLM2 (D 64, 3 a KV head) 1664 / 1606 and Gemma3 (D 256, 4) 1341 / 1362
# (2026-11-24), where every block's norm and RoPE prologue costs more than the kernel it saves;
# synthetic Qwen3-8B Q4_K_M (D 128, 4) 371.0, 371.4 / 367.1, 366.9, Qwen3-30B-A3B (D 128, 8)
# 364.4, 364.4 / 373.3, 373.2 (2026-11-25). IMPNB_FUSED_POST_DIMS (head dims, any GQA) overrides
# it for A/B runs. Where neither fuses it, qkv_post stays a kernel of its own: as the Q|K|V GEMVs'
# tail instead (the last block to store a head's rows normalizing, rotating and writing it, a
# ticket a head) Qwen3-30B-A3B Q4_K_M tg128 went 401.0, 400.0 -> 383.5, 384.1 (H100, 2026-11-26
# 21:49 UTC; the Q|K GEMV 6.0 -> 10.9 µs in profile_step.py): the tail's fence, ticket and
# dependent loads outlast the kernel it saves. Tried and removed. Re-measured after decode
# attention became a programmatic launch (2026-11-27 01:53 UTC, tg128 in one call, fused /
# separate): Qwen3-30B-A3B 445.6 / 460.2, synthetic Qwen3-8B Q4_K_M 386.0 / 387.7 (even); the
# fused path working out its rotation and norm weights before the wait (shared tables) and
# loading V beside q and k gave 383.5 on the 8B: removed. As the tail of thread-block clusters
# instead (the GEMV's blocks in clusters of 16 whose rows are one head; after a cluster barrier,
# no fence or ticket, the first block normalizes, rotates and writes it; bit-equal to the two
# launches in its GPU test) Qwen3-30B-A3B Q4_K_M tg128 went 504.4, 504.2 -> 463.6, 463.7 (H100,
# 2026-11-27 07:52 UTC, one call): clusters of 16 blocks and the tail's 96 registers (80 in the
# GEMV alone) cost more than the launch they save. Removed; .dev/gemv_qkv_post.patch.
# Also tried on that model and removed (H100, 2026-11-26, tg128 against the tree before in the
# same call): the next layer's Q|K|V, attn_output and router weights prefetched into L2
# (cp.async.bulk.prefetch.L2) from a graph branch forked after attn_output and joined before the
# next Q|K|V, 401.1, 401.3 -> 342.0, 340.6. Issued inside the kernels instead (2026-11-27 19:44 UTC,
# tg128 interleaved in one call, the same tree without them 517.6, 521.3): attn_output's and the
# folded router's weights by qkv_post's blocks after their wait, while attention leaves HBM idle,
# 476.1, 476.5; the next layer's Q|K|V by the experts' down kernel after its wait 516.8, 519.1.
FUSED_POST = {64: 32, 128: 4}
# decode GEMVs followed by a residual update run it as their tail (gemv_tail.py) rather than a
# norm kernel after them. Measured on the H100 (2026-11-24, Gemma3 tg128, two runs each): 1378,
# 1380 with it, 1368, 1365 without. IMPNB_GEMV_TAIL=0 turns it off for A/B runs.
GEMV_TAIL = os.environ.get("IMPNB_GEMV_TAIL", "1") != "0"
# a layer's Q, K, V (gate, up) of mixed types that one type holds exactly (Q5_0 and Q8_0 as
# Q8_0: quant_promote.py) are stacked in it, one GEMV for three; where none does, Q and K alone
# (attn_qk), one GEMV for two. Measured on the H100 (2026-11-24, Gemma3 tg128, two runs each; 9
# of its 18 layers have Q5_0 Q and K, Q8_0 V): 1464.7, 1466.1 with promotion, 1363.7, 1363.7
# without (131 -> 113 graph nodes); synthetic Qwen3-30B-A3B Q4_K_M tg128 (Q|K apart from a Q6_K V
# in 24 of 48 layers): 291.1, 291.1 with it, 287.3 without. IMPNB_STACK_MIXED=0 (one type only)
# for A/B runs.
STACK_MIXED = os.environ.get("IMPNB_STACK_MIXED", "1") != "0"
# where Q|K and V stay apart (V of a type neither holds), their decode GEMVs with the pre-norm
# fused run as one launch of two weight types (gemv.gemv_pair): one kernel a layer fewer.
# Measured on the H100 (2026-11-27 01:34 UTC, synthetic Qwen3-30B-A3B Q4_K_M, Q4_K Q|K and Q6_K V
# in 24 of 48 layers; tg128 in one call): 439.1, 441.4 without, 460.6, 459.9 with.
# IMPNB_GEMV_PAIR=0 for A/B runs.
GEMV_PAIR = os.environ.get("IMPNB_GEMV_PAIR", "1") != "0"
# decode attention on the short kernel writes its output's int8 form beside it where attn_output
# is of a dp4a type at least DP4A_MIN_K wide, which then takes gemv_dp4a without a quantize_x
# launch (H100, 2026-11-27, bench_gemv.py, cold weights, back to back: Qwen3-30B-A3B's 2048x4096
# Q4_K 5.10 µs on gemv's best variant, 4.07 on dp4a). tg128 (H100, 2026-11-27 02:16 UTC, one
# call, synthetic Q4_K_M): Qwen3-30B-A3B 468.6, 467.7 without, 500.0, 501.6 with; Qwen3-8B (its
# attn_output already on dp4a after a quantize_x launch) 385.4 -> 395.8 with this and the
# GEMV_PAIR and gemv_variants.WIDE_MIN_ROWS changes. IMPNB_ATTN_DP4A=0 for A/B runs.
ATTN_DP4A = os.environ.get("IMPNB_ATTN_DP4A", "1") != "0"
# qwen3moe decode runs attn_output (on dp4a, ATTN_DP4A) and the MoE router as one launch
# (kernels/moe/router_fold.py: the router's logits are linear in the layer's input and attention's
# output but for the norm's scale, so its rows are folded through W_o at load, 1.5 MB a layer of
# F16 on Qwen3-30B-A3B, and run beside attn_output's). Measured on the H100 (2026-11-27, synthetic
# Qwen3-30B-A3B Q4_K_M, tg128 interleaved in one call, folded / not): the grid's last block
# ranking, normalizing and quantizing 513.1, 512.6 / 500.7, 499.2 tok/s (11:32 UTC); the router
# blocks' last one ranking while the GEMV runs 517.8, 517.9 / 500.6, 502.7 (11:46 UTC); with a's
# loads after the wait free of branches and the tail's loads in one round 518.9, 516.3 / 498.6,
# 499.6 (11:59 UTC; even with the one before).
# profile_step.py --by-grid (11:48 UTC): the folded kernel 10.5 µs a layer alone, against
# attn_output's 3.5 and the router's 7.6 before. IMPNB_ROUTER_FOLD=0 for A/B runs.
# Tried and removed (H100, 2026-11-27, tg128 in one call, with / without): the experts' gate|up
# starting on a flag the fold's ranking block sets (its thread 0 spinning, then reading the slot's
# expert and loading its weights before griddepcontrol.wait, the last block past the flag clearing
# it) rather than at the fold's end: 501.2, 502.3 / 516.7, 516.8 (14:34 UTC, an acquiring load a
# round); 504.4, 504.6 / 514.9, 517.0 (14:41, relaxed loads, one acquire, the ticket after the
# loads). The weights' early loads (14 MB) crowd the fold's own critical path; .dev/experts_early.patch.
ROUTER_FOLD = os.environ.get("IMPNB_ROUTER_FOLD", "1") != "0"
# T = 1 GEMVs of plain x (no fused norm, accumulation or tail) over at least STREAM_MIN_ROWS
# rows that gemv_stream serves (K <= 1024) take it. Measured on the H100 (2026-11-24,
# scripts/bench_gemv.py --stream, µs back to back): Gemma3's 262144x640 Q8_0 logits 65.4 (91.8%
# of 2.97 TB/s) against gemv's 93.1 (64.5%); 49152x576 Q8_0 18.7 against 18.6 (even).
# IMPNB_GEMV_STREAM=0 for A/B runs.
STREAM_MIN_ROWS = 131072
GEMV_STREAM = os.environ.get("IMPNB_GEMV_STREAM", "1") != "0"
# decode GEMVs (T <= 8) of weights of at least DP4A_MIN_MB and DP4A_MIN_K columns run on dp4a
# (gemv_dp4a.py) after one quantize_x launch for their input (the fused pre-norm folded into it).
# Measured on the H100 (2026-11-25):
# - scripts/bench_gemv.py --dp4a, µs back to back, T = 1 on 4096x14336: Q4_K 19.8 -> 15.9, Q8_0
#   31.7 -> 23.7, Q4_1 21.0 -> 16.1, Q5_K 25.0 -> 19.4, Q6_K 25.0 -> 25.9 (lost; Q6_K at K > 8192
#   stayed on gemv); quantize_x 1.8. With K built into the kernel (15:03 UTC, choose_dp4a's
#   variants): Q4_K 19.8 -> 13.8, Q8_0 31.8 -> 22.3, Q4_1 21.1 -> 15.0, Q6_K 24.8 -> 18.5 (won).
# - tg128, synthetic Qwen3-8B Q4_K_M: 278.5 tok/s on gemv alone, 312.4 with dp4a on weights of
#   32 MB and more, 330.9 from 12 MB, 332.8 for every weight of a dp4a type; 337.3 with this rule
#   before K was built into the kernel (Q6_K at K > 8192 then on gemv), 343.7 after, 366.5-367.2
#   with the first loads before griddepcontrol.wait (2026-11-25 evening; Q6_K on dp4a).
# - tg128, synthetic Qwen3-30B-A3B Q4_K_M: 310.1 -> 315.8 (its logits and routed gate|up).
# - tg128 with every weight on dp4a: SmolLM2 (K 576) 1676 -> 1454, Gemma3 (K 640) 1516 -> 1471,
#   where x is short and the GEMVs small: those keep gemv.
# IMPNB_DP4A_MIN_MB and IMPNB_DP4A_MIN_K override them for A/B runs (a huge size: never).
# What int8 x costs the reference (scripts/int8_sensitivity.py, CPU, 2026-11-27; teacher-forced
# top-1 against float x, Q|K|V's input rounded / every GEMV's but the router's and the logits'):
# SmolLM2 on 90 tokens of English 0.978 / 0.989, Gemma3 1.000 / 1.000, tiny qwen3moe Q8_0 seed 3
# 1.000 / 1.000, seed 11 0.984 / 0.992; x rounded to fp16 instead (--fp16) 1.000 everywhere,
# errors 2e-4 to 1e-3 of the largest logit. The models this rule puts Q|K|V on dp4a for (Qwen3-8B's
# 6144 x 4096) had no real GGUF here to measure.
# Tried and removed (2026-11-27, on an H200): normed GEMVs on dp4a whose blocks each quantize
# x * w into shared memory themselves (no quantize_x launch; outputs scaled by 1 / rms(x) from
# sums of x² made beside). bench_gemv.py, µs back to back, that kernel / gemv's normed / quantize_x
# + gemv_dp4a: Q4_K 4608x2048 5.26 / 6.84 / 2.34 + 3.49, 6144x4096 10.37 / 10.27 / 2.53 + 6.07,
# 24576x4096 38.91 / 33.28 / 2.54 + 17.39: every block rereads x and w from L2, 8 bytes a column,
# more than its own rows of weights at K 4096. tg128: synthetic Qwen3-30B-A3B Q4_K_M 536.0, 535.6
# -> 547.3, 547.6 (its Q|K|V), Qwen3-8B 458.8 -> 405.1; and int8 Q|K|V inputs took the tiny
# qwen3moe's all-dp4a teacher-forced top-1 agreement to 98.4%, under the 99% its test asks.
DP4A_MIN_MB = 8.0
DP4A_MIN_K = 2048


def fuses_post(head_dim: int, n_head: int, n_head_kv: int) -> bool:
    """Whether decode attention takes qkv_post fused in front at this shape (FUSED_POST)."""
    return n_head // n_head_kv <= FUSED_POST.get(head_dim, 0)


def env_ints(name: str) -> tuple[int, ...] | None:
    """The comma-separated integers of environment variable `name` (an A/B override), None where
    it is unset; ParameterError (one line from the CLI) where it is not integers."""
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise ParameterError(f"{name}={value!r}: expected integers separated by commas") from None


class DeviceModel:
    """Everything one sequence needs on the device, allocated at load."""

    def __init__(self, mf: ModelFile, n_ctx: int, ctx: GpuContext | None = None):
        self.cfg = cfg = model_config(mf)
        if cfg.arch not in GPU_ARCHS:
            raise UnsupportedError(f"architecture {cfg.arch} has no GPU path yet "
                                   f"(GPU: {', '.join(GPU_ARCHS)}); use --device cpu")
        if cfg.n_expert:
            check_experts(cfg)
        self.ctx = ctx or GpuContext()
        self.n_ctx = n_ctx
        self.ctx.check_fits(self._bytes_needed(mf, n_ctx), "the weights and KV cache")
        self.w = self._upload_all(mf)
        self.streamed = {name for name, w in self.w.items()  # their T = 1 GEMVs take gemv_stream
                         if GEMV_STREAM and isinstance(w, repack.PackedWeight)
                         and w.rows >= STREAM_MIN_ROWS and gemv_stream.fits(w, 1)}
        for name in sorted(self.streamed):
            log.debug("%s: T = 1 GEMV on gemv_stream", name)
        min_mb = float(os.environ.get("IMPNB_DP4A_MIN_MB", DP4A_MIN_MB))
        min_k = int(os.environ.get("IMPNB_DP4A_MIN_K", DP4A_MIN_K))
        self.dp4a = {name for name, w in self.w.items()  # their decode GEMVs may take gemv_dp4a
                     if isinstance(w, repack.PackedWeight) and w.ggml_type in gemv_dp4a.DOTS
                     and w.nbytes >= min_mb * 1e6 and w.cols >= min_k and name not in self.streamed}
        self.dp4a_min_k = min_k
        for name in sorted(self.dp4a):
            log.debug("%s: decode GEMV on gemv_dp4a", name)
        self.router_folds = self._router_folds(mf)
        self.inv_freq = [self.ctx.upload(rope_inv_freq(cfg.n_rot, cfg.rope_base_for(il)))
                         for il in range(cfg.n_layer)]
        n_pages = kv_cache.pages_needed(n_ctx, PAGE_SIZE)
        self.k_pool = [self.ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, cfg.n_head_kv, cfg.head_dim),
                                      np.float16) for _ in range(cfg.n_layer)]
        self.v_pool = [self.ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, cfg.n_head_kv, cfg.head_dim_v),
                                      np.float16) for _ in range(cfg.n_layer)]
        self.block_table = self.ctx.upload(kv_cache.contiguous_block_table(1, n_pages)[0])
        # decode attention: per context bucket (the graph of a bucket keeps its own) the
        # short-context kernel's blocks a row (0: none) or a split count; the partials are sized
        # for the largest
        self.max_decode_splits = self.decode_splits = self.splits_for(n_ctx)
        self.decode_short = 0
        self.short_max_env = env_ints("IMPNB_SHORT_DECODE_MAX")
        self.short_cluster_env = env_ints("IMPNB_SHORT_CLUSTER")
        post_dims = env_ints("IMPNB_FUSED_POST_DIMS")
        self.decode_post = (cfg.head_dim in post_dims if post_dims is not None
                            else fuses_post(cfg.head_dim, cfg.n_head, cfg.n_head_kv))
        self.gemv_tail = GEMV_TAIL
        self.ids = self.ctx.empty(MAX_PREFILL_CHUNK, np.int32)
        self.pos = self.ctx.empty(MAX_PREFILL_CHUNK, np.int32)
        self.arena = Arena(self.ctx)
        self.cublas = None if self.ctx.simulator else Cublas(self.ctx)

    def ctx_bucket(self, length: int) -> int:
        """The smallest of DECODE_CTX_BUCKETS holding length keys, at most n_ctx."""
        return min(self.n_ctx, next((b for b in DECODE_CTX_BUCKETS if b >= length), self.n_ctx))

    def decode_plan(self, length: int) -> tuple[int, int]:
        """(the short-context kernel's blocks a query row, 0 for the split kernel; the split
        count) of decode attention for contexts up to ctx_bucket(length)."""
        bucket, D = self.ctx_bucket(length), self.cfg.head_dim
        bound = self.short_max_env[0] if self.short_max_env else SHORT_DECODE_MAX.get(D, 0)
        row = next((b for b in DECODE_CTX_BUCKETS if b >= bucket), bucket)  # n_ctx may cut the bucket
        blocks = (self.short_cluster_env[0] if self.short_cluster_env
                  else SHORT_DECODE_CLUSTER.get((D, row), 1))
        return blocks if bucket <= bound else 0, self.splits_for(bucket)

    def splits_for(self, length: int) -> int:
        """Decode attention's split count for contexts up to ctx_bucket(length)."""
        cfg = self.cfg
        return attention_decode.num_splits(self.ctx_bucket(length), cfg.n_head, cfg.n_head_kv,
                                           head_dim=cfg.head_dim)

    def _upload_all(self, mf: ModelFile) -> dict:
        """Every tensor by its GGUF name less ".weight"; a layer's Q, K, V (and gate, up) of one
        type, or of types one holds exactly (quant_promote.common_type), are stacked into one
        matrix, attn_qkv (ffn_gate_up), read by one GEMV; else Q and K alone (attn_qk) where they
        can be."""
        tensors = {name.removesuffix(".weight"): t for name, t in mf.tensors.items()}
        w = {}
        for il in range(self.cfg.n_layer):
            p = f"blk.{il}."
            for fused, parts in (("attn_qkv", ("attn_q", "attn_k", "attn_v")),
                                 ("attn_qk", ("attn_q", "attn_k")),  # where V's type differs
                                 ("ffn_gate_up", ("ffn_gate", "ffn_up")),
                                 ("ffn_gate_up_exps", ("ffn_gate_exps", "ffn_up_exps"))):
                ts = [tensors.get(p + n) for n in parts]
                if not all(ts) or len({t.shape[-1] for t in ts}) != 1:
                    continue
                types = {t.ggml_type for t in ts}
                if not STACK_MIXED and (len(types) > 1 or fused == "attn_qk"):
                    continue
                common = common_type(types)
                if common is not None:
                    w[p + fused] = self._upload_matrix(p + fused, ts, common)
                    for n in parts:
                        del tensors[p + n]
        for name, t in tensors.items():
            w[name] = self.ctx.upload(t.dequantize()) if len(t.shape) == 1 else self._upload_matrix(name, [t])
        return w

    def _router_folds(self, mf: ModelFile) -> dict:
        """router_fold's weights (Wx, Wa) by layer prefix, for the qwen3moe layers whose attn_output
        can take gemv_dp4a on attention's int8 output and whose routed gate|up take it too
        (ROUTER_FOLD); the fold runs where attn_xq gives those buffers."""
        cfg, folds = self.cfg, {}
        if not (ROUTER_FOLD and ATTN_DP4A and cfg.n_expert):
            return folds
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            w_o = self.w[p + "attn_output"]
            if not (isinstance(w_o, repack.PackedWeight) and w_o.ggml_type in gemv_dp4a.DOTS
                    and w_o.cols >= self.dp4a_min_k and self.dp4a_pays(p + "ffn_gate_up_exps")):
                continue
            fold = fold_ref(*(mf.tensors[p + n + ".weight"].dequantize()
                              for n in ("ffn_gate_inp", "ffn_norm", "attn_output")))
            folds[p] = Fold(*(self.ctx.upload(a) for a in fold))
        if folds:
            log.debug("the router folded into attn_output's launch in %d layers", len(folds))
        return folds

    def _upload_matrix(self, name: str, ts, ggml_type=None):
        """Rows of ts stacked, repacked in ggml_type (default: theirs; F16 where no kernel reads
        it); expert tensors (E, rows, cols) are stacked per expert: expert e's rows of every t,
        then e + 1's."""
        ggml_type = ggml_type or ts[0].ggml_type
        if ggml_type in repack.PACKED_TYPES:
            if any(t.ggml_type != ggml_type for t in ts):
                log.debug("%s: %s stacked as %s", name, ", ".join(t.ggml_type.name for t in ts),
                          ggml_type.name)
            arrays = [promote(t.data, t.ggml_type, ggml_type) for t in ts]
        else:
            log.info("%s: %s has no GPU kernel; converted to F16 at load", name, ggml_type.name)
            arrays = [t.dequantize().reshape(t.data.shape[:-1] + (-1,)).astype(np.float16) for t in ts]
            ggml_type = T.F16
        data = np.concatenate(arrays, axis=-2)
        return repack.repack(data.reshape(-1, data.shape[-1]), ggml_type).to_device(self.ctx.nb_stream)

    def _bytes_needed(self, mf: ModelFile, n_ctx: int) -> int:
        cfg = self.cfg
        kv = 2 * cfg.n_layer * n_ctx * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)
        folds = 2 * cfg.n_layer * cfg.n_expert * (cfg.n_embd + cfg.n_head * cfg.head_dim_v) if ROUTER_FOLD else 0
        return sum(t.data.nbytes for t in mf.tensors.values()) + kv + folds + (64 << 20)

    def linear(self, x, name: str, y, norm: tuple | None = None, accumulate: bool = False,
               residual: Residual | None = None, xq: QuantX | None = None) -> None:
        """y (T, N) = x (T, K) · W(name)ᵀ, float32 in and out. GEMV only (T <= GEMV_MAX_ROWS):
        norm (wn, eps) reads RMSNorm(x) * wn for x; accumulate adds into y; xq: x's int8 form,
        already written (attn_xq), for gemv_dp4a. residual (gemv_tail.Residual) is then applied
        to y: by the GEMV's tail, else a norm kernel."""
        w, s = self.w[name], self.ctx.nb_stream
        if xq is not None:
            assert norm is None and residual is None and x.shape[0] <= GEMV_MAX_ROWS
            gemv_dp4a.gemv_dp4a(w, xq, y, s, accumulate)
            return
        if x.shape[0] <= GEMV_MAX_ROWS:
            if name in self.streamed and x.shape[0] == 1 and norm is None and not accumulate \
                    and residual is None:
                gemv_stream.gemv_stream(w, x, y, s)
                return
            if residual is not None and self.gemv_tail:
                assert norm is None and not accumulate, "GEMV tail: no fused norm or accumulation"
                gemv.gemv_residual(w, x, y, residual, s)
                return
            if self.dp4a_pays(name):
                gemv_dp4a.gemv_dp4a(w, self.quantized(x, norm), y, s, accumulate)
            else:
                gemv.gemv(w, x, y, s, accumulate, norm=norm)
        else:
            assert norm is None and not accumulate, "GEMM: no fused norm or accumulation"
            self.gemm(x, w, y, gemm_dispatch.choose(w.ggml_type, w.rows, w.cols, x.shape[0]))
        if residual is not None:
            residual.unfused(y, s)

    def linear_f32(self, x, name: str, y) -> None:
        """Like linear, with fp32 operands throughout for an F32 weight (the MoE router: expert
        choices must not hinge on fp16 rounding)."""
        w = self.w[name]
        if x.shape[0] <= GEMV_MAX_ROWS or w.ggml_type != T.F32:
            self.linear(x, name, y)
            return
        self.cublas.gemm_f32(x, w.parts[0].view(np.float32).reshape(w.rows, w.cols), y)

    def gemm(self, x, w, y, path: str) -> None:
        """y (T, N) = x (T, K) · Wᵀ by a gemm_dispatch path: the tiles read W as it is stored;
        cuBLAS reads an fp16 copy dequantized into a scratch buffer."""
        if path == "cublas":
            self.cublas.gemm_f16(self.x16(x), self._w16(w), y)
        elif path == "wgmma":
            gemm_wgmma_quant(self.x16(x), w, y, self.ctx.nb_stream)
        else:
            gemm_quant(self.x16(x), w, y, self.ctx.nb_stream, bm=gemm_dispatch.TILE_BM[path])

    def linear_split(self, x, name: str, ys, norm: tuple | None = None) -> None:
        """ys[i] (T, N_i) = x · W_iᵀ for the matrices stacked in `name` (attn_qkv); norm as in linear."""
        w = self.w[name]
        if x.shape[0] <= GEMV_MAX_ROWS:
            gemv.gemv_split(w, x, ys, self.ctx.nb_stream, norm=norm)
            return
        assert norm is None, "GEMM: no fused norm"
        x16, w16, row = self.x16(x), self._w16(w), 0
        for y in ys:
            self.cublas.gemm_f16(x16, w16[row:row + y.shape[1]], y)
            row += y.shape[1]

    def linear_pair(self, x, name_a: str, ys_a, name_b: str, y_b, norm: tuple | None = None) -> None:
        """linear_split(x, name_a, ys_a, norm) then linear(x, name_b, y_b, norm) (a layer's Q|K and
        its V of another type): one GEMV launch for both at decode with norm where neither weight
        takes dp4a (GEMV_PAIR)."""
        if GEMV_PAIR and x.shape[0] <= GEMV_MAX_ROWS and norm is not None \
                and not (self.dp4a_pays(name_a) or self.dp4a_pays(name_b)):
            gemv.gemv_pair(self.w[name_a], ys_a, self.w[name_b], y_b, x, norm, self.ctx.nb_stream)
            return
        self.linear_split(x, name_a, ys_a, norm)
        self.linear(x, name_b, y_b, norm)

    def linear_glu(self, x, name: str, act: str, y, norm: tuple | None = None) -> None:
        """y (T, F) = act(x · W_gateᵀ) * (x · W_upᵀ), gate|up stacked in `name`; act gelu or silu;
        norm as in linear."""
        w, T, s = self.w[name], x.shape[0], self.ctx.nb_stream
        act_id = gemv.GELU if act == "gelu" else gemv.SILU
        if T <= GEMV_MAX_ROWS and self.dp4a_pays(name):
            gemv_dp4a.gemv_dp4a(w, self.quantized(x, norm), y, s, glu=act_id)
            return
        if T <= GEMV_MAX_ROWS and gemv.glu_fits(w, T):
            gemv.gemv_glu(w, x, y, act_id, s, norm=norm)
            return
        gate_up = self.arena.get("gate_up", (T, w.rows))
        self.linear(x, name, gate_up, norm)
        (activations.geglu_fused if act == "gelu" else activations.swiglu_fused)(gate_up, y, s)

    def dp4a_pays(self, name: str) -> bool:
        """Whether this weight's decode GEMVs take gemv_dp4a (see DP4A_MIN_MB)."""
        return name in self.dp4a

    def quantized(self, x, norm: tuple | None = None) -> QuantX:
        """x (T, K), or RMSNorm(x) * wn with norm (wn, eps), in int8 for gemv_dp4a."""
        xq = self.xq_buffers(*x.shape)
        quantize_x(x, xq, self.ctx.nb_stream, norm)
        return xq

    def xq_buffers(self, n_tok: int, K: int, name: str = "xq") -> QuantX:
        """The buffers of `quantized`'s int8 form of a (T, K) input (for a kernel that writes it)."""
        a = self.arena
        return QuantX(a.get(name, (n_tok, K // 4), np.uint32), a.get(name + "_d", (n_tok, K // GROUP)),
                      a.get(name + "_s", (n_tok, K // GROUP)))

    def attn_xq(self, name: str, n_tok: int) -> QuantX | None:
        """Where decode attention (the short kernel) writes its output's int8 form for `name`
        (attn_output) to take gemv_dp4a on it, its buffers; else None (ATTN_DP4A)."""
        w = self.w[name]
        if ATTN_DP4A and n_tok <= attention_decode.MAX_T and self.decode_short \
                and isinstance(w, repack.PackedWeight) and w.ggml_type in gemv_dp4a.DOTS and w.cols >= self.dp4a_min_k:
            return self.xq_buffers(n_tok, w.cols, "attn_xq")
        return None

    def x16(self, x):
        x16 = self.arena.get("x16", x.shape, np.float16)
        cast_f16(x, x16, self.ctx.nb_stream)
        return x16

    def _w16(self, w):
        """The weight dequantized to fp16 into a scratch buffer (the prefill fallback)."""
        w16 = self.arena.get("w16", (w.rows, w.cols), np.float16)
        dequant(w, w16, self.ctx.nb_stream)
        return w16
