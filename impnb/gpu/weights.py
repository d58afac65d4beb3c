"""The model's weights on the GPU: GGUF tensors uploaded (a layer's Q, K, V and gate, up stacked
where one GEMV can read them), and a Linear for each matrix holding the kernels chosen for it at
load. Legend: E experts, D model dim, H heads, Dv value head dim."""

import logging
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from impnb.gguf_file import ModelFile
from impnb.gpu import gemm_dispatch, gemv_dispatch
from impnb.kernels.common import repack
from impnb.kernels.common.repack_device import repack_on_device
from impnb.kernels.gemv import gemv_dp4a_units, gemv_stream
from impnb.kernels.moe.router_fold import Fold, fold_ref
from impnb.models.config import ModelConfig
from impnb.quant_promote import common_type, promote
from impnb.tuning import STREAM_MIN_ROWS, Overrides

log = logging.getLogger("impnb.gpu")
# stacked name: the GGUF matrices it holds, in row order ("attn_qk" where V's type differs)
STACKS = (("attn_qkv", ("attn_q", "attn_k", "attn_v")),
          ("attn_qk", ("attn_q", "attn_k")),
          ("ffn_gate_up", ("ffn_gate", "ffn_up")),
          ("ffn_gate_up_exps", ("ffn_gate_exps", "ffn_up_exps")))


@dataclass(frozen=True, eq=False)
class Linear:
    """One matrix as the GPU holds it (several stacked, or E experts' stacked per expert) with the
    kernels chosen for it at load: decode GEMVs on gemv_dp4a or gemv (T = 1 plain ones on
    gemv_stream; T = 2..8 on gemv_dp4a_multi where gemv_dispatch measured it faster), prefill
    GEMMs on the path gemm_dispatch measured fastest for each row bucket."""

    name: str  # its GGUF name less ".weight", or the stacked name (STACKS)
    w: repack.PackedWeight
    dp4a: bool  # decode GEMVs on gemv_dp4a (DP4A_MIN_MB, DP4A_MIN_K)
    stream: bool  # T = 1 GEMVs of plain x on gemv_stream (STREAM_MIN_ROWS)
    int8_x: bool  # a dp4a type at least DP4A_MIN_K wide: can read an int8 x another kernel wrote
    gemm_paths: dict  # gemm_dispatch.M_BUCKETS bucket -> prefill GEMM path
    multi: dict  # T in 2..8 -> gemv_dp4a_multi's variant (gemv_dispatch's table); T not in it: the default

    @property
    def ggml_type(self) -> T:
        return self.w.ggml_type

    def gemm_path(self, n_rows: int) -> str:
        return self.gemm_paths[gemm_dispatch.m_bucket(n_rows)]


def linear_of(name: str, w: repack.PackedWeight, tuning: Overrides) -> Linear:
    """name's Linear, its kernels chosen by impnb/tuning's rules (the thresholds' reasons there)."""
    stream = tuning.gemv_stream and w.rows >= STREAM_MIN_ROWS and gemv_stream.fits(w, 1)
    int8_x = w.ggml_type in gemv_dp4a_units.DOTS and w.cols >= tuning.dp4a_min_k
    dp4a = int8_x and w.nbytes >= tuning.dp4a_min_mb * 1e6 and not stream
    paths = {b: gemm_dispatch.choose(w.ggml_type, w.rows, w.cols, b) for b in gemm_dispatch.M_BUCKETS}
    use = gemv_dispatch.use_of(name)
    n_out = w.rows // 2 if use == "glu" else w.rows
    multi = (gemv_dispatch.choose(w.ggml_type, n_out, w.cols, use, force=tuning.gemv_rows_force)
             if int8_x and tuning.gemv_rows else {})
    return Linear(name, w, dp4a, stream, int8_x, paths, multi)


def linears(w: dict, tuning: Overrides) -> dict:
    """A Linear for every matrix of w (tensors by name), logging the decode kernels chosen."""
    out = {name: linear_of(name, t, tuning) for name, t in w.items() if isinstance(t, repack.PackedWeight)}
    for name in sorted(out):
        if out[name].stream:
            log.debug("%s: T = 1 GEMV on gemv_stream", name)
    for name in sorted(out):
        if out[name].dp4a:
            log.debug("%s: decode GEMV on gemv_dp4a", name)
    return out


def upload(mf: ModelFile, cfg: ModelConfig, ctx, tuning: Overrides) -> dict:
    """Every tensor by its GGUF name less ".weight": 1-D ones float32, matrices repacked for the
    kernels; a layer's Q, K, V (and gate, up) of one type, or of types one holds exactly
    (quant_promote.common_type), stacked into one matrix, attn_qkv (ffn_gate_up), read by one GEMV;
    else Q and K alone (attn_qk) where they can be."""
    tensors = {name.removesuffix(".weight"): t for name, t in mf.tensors.items()}
    w = {}
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        for fused, parts in STACKS:
            ts = [tensors.get(p + n) for n in parts]
            if not all(ts) or len({t.shape[-1] for t in ts}) != 1:
                continue
            types = {t.ggml_type for t in ts}
            if not tuning.stack_mixed and (len(types) > 1 or fused == "attn_qk"):
                continue
            common = common_type(types)
            if common is not None:
                w[p + fused] = upload_matrix(ctx, p + fused, ts, common)
                for n in parts:
                    del tensors[p + n]
    for name, t in tensors.items():
        w[name] = ctx.upload(t.dequantize()) if len(t.shape) == 1 else upload_matrix(ctx, name, [t])
    return w


def upload_matrix(ctx, name: str, ts, ggml_type=None) -> repack.PackedWeight:
    """Rows of ts stacked, repacked in ggml_type (default: theirs; F16 where no kernel reads
    it) on the device; expert tensors (E, rows, cols) are stacked per expert: expert e's rows of
    every t, then e + 1's."""
    ggml_type = ggml_type or ts[0].ggml_type
    if ggml_type in repack.PACKED_TYPES:
        if any(t.ggml_type != ggml_type for t in ts):
            log.debug("%s: %s stacked as %s", name, ", ".join(t.ggml_type.name for t in ts), ggml_type.name)
        arrays = [promote(t.data, t.ggml_type, ggml_type) for t in ts]
    else:
        log.info("%s: %s has no GPU kernel; converted to F16 at load", name, ggml_type.name)
        arrays = [t.dequantize().reshape(t.data.shape[:-1] + (-1,)).astype(np.float16) for t in ts]
        ggml_type = T.F16
    data = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=-2)
    data = data.reshape(-1, data.shape[-1])
    if ctx.simulator:  # the split kernel would simulate a thread a byte
        return repack.repack(data, ggml_type).to_device(ctx.nb_stream)
    return repack_on_device(data, ggml_type, ctx.nb_stream)


def router_folds(mf: ModelFile, cfg: ModelConfig, ctx, lin: dict, tuning: Overrides) -> dict:
    """router_fold's weights (Wx, Wa) by layer prefix, for the qwen3moe layers whose attn_output
    can take gemv_dp4a on attention's int8 output and whose routed gate|up take it too
    (ROUTER_FOLD); the fold runs at the steps where attention writes that int8 output."""
    folds = {}
    if not (tuning.router_fold and tuning.attn_dp4a and cfg.n_expert):
        return folds
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        gate_up = lin.get(p + "ffn_gate_up_exps")
        if not (lin[p + "attn_output"].int8_x and gate_up is not None and gate_up.dp4a):
            continue
        fold = fold_ref(*(mf.tensors[p + n + ".weight"].dequantize()
                          for n in ("ffn_gate_inp", "ffn_norm", "attn_output")))
        folds[p] = Fold(*(ctx.upload(a) for a in fold))
    if folds:
        log.debug("the router folded into attn_output's launch in %d layers", len(folds))
    return folds


def fold_bytes(cfg: ModelConfig, tuning: Overrides) -> int:
    """The most bytes router_folds can take (fp16 Wx (E, D) and Wa (E, H Dv) a layer)."""
    return 2 * cfg.n_layer * cfg.n_expert * (cfg.n_embd + cfg.n_head * cfg.head_dim_v) if tuning.router_fold else 0
