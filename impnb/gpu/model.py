"""A model resident on the GPU: quantized weights, the paged KV cache, buffers and `linear`.

Weights stay in their GGUF type (kernel layout from impnb/kernels/common/repack.py); 1-D norm
weights are float32. `linear` is GEMV with fused dequantization for up to GEMV_MAX_ROWS
tokens (on dp4a with int8 activations for the weights DP4A_MIN_MB / DP4A_MIN_K pick), else the
GEMM gpu/gemm_dispatch.py picks: tensor-core tiles on the stored weight, or dequantization to
fp16 and cuBLAS (the fallback). The stacked Q|K|V always takes cuBLAS.
"""

import logging

import numpy as np
from gguf import GGMLQuantizationType as T

from impnb.errors import UnsupportedError
from impnb.devices import GPU_ARCHS
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
from impnb.tuning import (DECODE_CTX_BUCKETS, GEMV_MAX_ROWS, MAX_PREFILL_CHUNK, PAGE_SIZE, SHORT_DECODE_CLUSTER,
                          SHORT_DECODE_MAX, STREAM_MIN_ROWS, Overrides, fuses_post)

log = logging.getLogger("impnb.gpu")


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
        self.tuning = tn = Overrides.from_env()  # the environment's A/B overrides, read once
        self.ctx.check_fits(self._bytes_needed(mf, n_ctx), "the weights and KV cache")
        self.w = self._upload_all(mf)
        self.streamed = {name for name, w in self.w.items()  # their T = 1 GEMVs take gemv_stream
                         if tn.gemv_stream and isinstance(w, repack.PackedWeight)
                         and w.rows >= STREAM_MIN_ROWS and gemv_stream.fits(w, 1)}
        for name in sorted(self.streamed):
            log.debug("%s: T = 1 GEMV on gemv_stream", name)
        min_mb, min_k = tn.dp4a_min_mb, tn.dp4a_min_k
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
        post_dims = tn.fused_post_dims
        self.decode_post = (cfg.head_dim in post_dims if post_dims is not None
                            else fuses_post(cfg.head_dim, cfg.n_head, cfg.n_head_kv))
        self.gemv_tail = tn.gemv_tail
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
        tn = self.tuning
        bound = tn.short_decode_max if tn.short_decode_max is not None else SHORT_DECODE_MAX.get(D, 0)
        row = next((b for b in DECODE_CTX_BUCKETS if b >= bucket), bucket)  # n_ctx may cut the bucket
        blocks = (tn.short_cluster if tn.short_cluster is not None
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
                if not self.tuning.stack_mixed and (len(types) > 1 or fused == "attn_qk"):
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
        if not (self.tuning.router_fold and self.tuning.attn_dp4a and cfg.n_expert):
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
        folds = 2 * cfg.n_layer * cfg.n_expert * (cfg.n_embd + cfg.n_head * cfg.head_dim_v) \
            if self.tuning.router_fold else 0
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
        if self.tuning.gemv_pair and x.shape[0] <= GEMV_MAX_ROWS and norm is not None \
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
        if self.tuning.attn_dp4a and n_tok <= attention_decode.MAX_T and self.decode_short \
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
