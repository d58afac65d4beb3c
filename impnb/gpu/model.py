"""A model resident on the GPU: quantized weights, the paged KV cache, buffers and `linear`.

Weights stay in their GGUF type (kernel layout from impnb/kernels/repack.py); 1-D norm
weights are float32. `linear` is GEMV with fused dequantization for up to GEMV_MAX_ROWS
tokens, else tile-wise dequantization to fp16 and cuBLAS (the prefill fallback).
"""

import logging

import numpy as np
from gguf import GGMLQuantizationType as T

from impnb.errors import UnsupportedError
from impnb.gguf_file import ModelFile
from impnb.gpu.buffers import Arena
from impnb.gpu.context import GpuContext
from impnb.gpu.cublas_gemm import Cublas
from impnb.kernels import attention_decode, gemv, kv_cache, repack
from impnb.kernels.dequant import dequant
from impnb.kernels.cast import cast_f16
from impnb.kernels.rope import rope_inv_freq
from impnb.models import model_config

log = logging.getLogger("impnb.gpu")
from impnb.devices import GPU_ARCHS
PAGE_SIZE = 32
GEMV_MAX_ROWS = 8
MAX_PREFILL_CHUNK = 512


class DeviceModel:
    """Everything one sequence needs on the device, allocated at load."""

    def __init__(self, mf: ModelFile, n_ctx: int, ctx: GpuContext | None = None):
        self.cfg = cfg = model_config(mf)
        if cfg.arch not in GPU_ARCHS:
            raise UnsupportedError(f"architecture {cfg.arch} has no GPU path yet "
                                   f"(GPU: {', '.join(GPU_ARCHS)}); use --device cpu")
        self.ctx = ctx or GpuContext()
        self.n_ctx = n_ctx
        self.ctx.check_fits(self._bytes_needed(mf, n_ctx), "the weights and KV cache")
        self.w = {name.removesuffix(".weight"): self._upload(t) for name, t in mf.tensors.items()}
        self.inv_freq = [self.ctx.upload(rope_inv_freq(cfg.n_rot, cfg.rope_base_for(il)))
                         for il in range(cfg.n_layer)]
        n_pages = kv_cache.pages_needed(n_ctx, PAGE_SIZE)
        self.k_pool = [self.ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, cfg.n_head_kv, cfg.head_dim),
                                      np.float16) for _ in range(cfg.n_layer)]
        self.v_pool = [self.ctx.empty(kv_cache.pool_shape(n_pages, PAGE_SIZE, cfg.n_head_kv, cfg.head_dim_v),
                                      np.float16) for _ in range(cfg.n_layer)]
        self.block_table = self.ctx.upload(kv_cache.contiguous_block_table(1, n_pages)[0])
        self.decode_splits = attention_decode.num_splits(n_ctx, cfg.n_head, cfg.n_head_kv)
        self.ids = self.ctx.empty(MAX_PREFILL_CHUNK, np.int32)
        self.pos = self.ctx.empty(MAX_PREFILL_CHUNK, np.int32)
        self.arena = Arena(self.ctx)
        self.cublas = None if self.ctx.simulator else Cublas(self.ctx)

    def _upload(self, t):
        """1-D weights as float32; matrices repacked in their GGUF type (F16 where no kernel reads it)."""
        if len(t.shape) == 1:
            return self.ctx.upload(t.dequantize())
        data, ggml_type = t.data.reshape(-1, t.data.shape[-1]), t.ggml_type
        if ggml_type not in repack.PACKED_TYPES:
            log.info("%s: %s has no GPU kernel; converted to F16 at load", t.name, ggml_type.name)
            data, ggml_type = t.dequantize().reshape(-1, t.shape[-1]).astype(np.float16), T.F16
        return repack.repack(data, ggml_type).to_device(self.ctx.nb_stream)

    def _bytes_needed(self, mf: ModelFile, n_ctx: int) -> int:
        cfg = self.cfg
        kv = 2 * cfg.n_layer * n_ctx * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)
        return sum(t.data.nbytes for t in mf.tensors.values()) + kv + (64 << 20)

    def linear(self, x, name: str, y) -> None:
        """y (T, N) = x (T, K) · W(name)ᵀ, float32 in and out."""
        w = self.w[name]
        T = x.shape[0]
        s = self.ctx.nb_stream
        if T <= GEMV_MAX_ROWS:
            gemv.gemv(w, x, y, s)
            return
        x16 = self.arena.get("x16", x.shape, np.float16)
        w16 = self.arena.get("w16", (w.rows, w.cols), np.float16)
        cast_f16(x, x16, s)
        dequant(w, w16, s)
        self.cublas.gemm_f16(x16, w16, y)
