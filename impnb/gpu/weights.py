"""The model's weights on the GPU: GGUF tensors uploaded (a layer's Q, K, V and gate, up stacked
where one GEMV can read them; a Qwen3.5 MoE layer's router with its shared expert gate), and a
Linear for each matrix holding the kernels chosen for it at load. Legend: E experts, D model dim,
H heads, Dv value head dim."""

import logging
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from impnb.gguf_file import ModelFile, Tensor
from impnb.gpu import gemm_dispatch, gemv_dispatch
from impnb.kernels.common import repack
from impnb.kernels.common.repack_device import repack_on_device
from impnb.kernels.gemv import gemv_dp4a_units, gemv_stream
from impnb.kernels.moe.router_fold import Fold, fold_ref
from impnb.models.config import ModelConfig
from impnb.quant_promote import common_type, promote
from impnb.tuning import STREAM_MIN_ROWS, Overrides

log = logging.getLogger("impnb.gpu")
# stacked name: the GGUF matrices it holds, in row order ("attn_qk" where V's type differs);
# Gated DeltaNet's Q|K|V with Z and beta with alpha, the shared expert's gate|up
STACKS = (("attn_qkv", ("attn_q", "attn_k", "attn_v")),
          ("attn_qk", ("attn_q", "attn_k")),
          ("ffn_gate_up", ("ffn_gate", "ffn_up")),
          ("ffn_gate_up_exps", ("ffn_gate_exps", "ffn_up_exps")),
          ("ssm_qkvz", ("attn_qkv", "attn_gate")),
          ("ssm_beta_alpha", ("ssm_beta", "ssm_alpha")),
          ("ffn_gate_up_shexp", ("ffn_gate_shexp", "ffn_up_shexp")))
# the router's E rows, then the shared expert gate's one (moe_shared): gate_inps
GATE_INPS = ("ffn_gate_inps", ("ffn_gate_inp", "ffn_gate_inp_shexp"))


@dataclass(frozen=True, eq=False)
class Linear:
    """One matrix as the GPU holds it (several stacked, or E experts' stacked per expert) with the
    kernels chosen for it at load: decode GEMVs on gemv_dp4a or gemv (T = 1 plain ones on
    gemv_stream; T = 2..8 on gemv_dp4a_multi where gemv_dispatch measured it faster), prefill
    GEMMs on the path gemm_dispatch measured fastest for each row bucket."""

    name: str  # its GGUF name less ".weight", or the stacked name (STACKS)
    w: repack.PackedWeight
    dp4a: bool  # decode GEMVs on gemv_dp4a (DP4A_MIN_MB or DP4A_ANY_SIZE, DP4A_MIN_K)
    stream: bool  # T = 1 GEMVs of plain x on gemv_stream (STREAM_MIN_ROWS)
    int8_x: bool  # a dp4a type at least DP4A_MIN_K wide: can read an int8 x another kernel wrote
    gemm_paths: dict  # gemm_dispatch.M_BUCKETS bucket -> prefill GEMM path
    multi: dict  # T in 2..8 -> gemv_dp4a_multi's variant or gemv_dispatch.MMQ (its table); T not in it: the default

    @property
    def ggml_type(self) -> T:
        return self.w.ggml_type

    def gemm_path(self, n_rows: int) -> str:
        return self.gemm_paths[gemm_dispatch.m_bucket(n_rows)]


def linear_of(name: str, w: repack.PackedWeight, tuning: Overrides) -> Linear:
    """name's Linear, its kernels chosen by impnb/tuning's rules (the thresholds' reasons there)."""
    stream = tuning.gemv_stream and w.rows >= STREAM_MIN_ROWS and gemv_stream.fits(w, 1)
    int8_x = w.ggml_type in gemv_dp4a_units.DOTS and w.cols >= tuning.dp4a_min_k
    dp4a = int8_x and (w.nbytes >= tuning.dp4a_min_mb * 1e6 or w.ggml_type in tuning.dp4a_any_size) and not stream
    paths = {b: gemm_dispatch.choose(w.ggml_type, w.rows, w.cols, b) for b in gemm_dispatch.M_BUCKETS}
    use = gemv_dispatch.use_of(name)
    n_out = w.rows // 2 if use == "glu" else w.rows
    multi = (gemv_dispatch.choose(w.ggml_type, n_out, w.cols, use, force=tuning.gemv_rows_force)
             if gemv_dispatch.takes(w.ggml_type, w.cols) and tuning.gemv_rows else {})
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
    """Every tensor by its GGUF name less ".weight": 1-D ones and the DeltaNet conv's float32,
    matrices repacked for the kernels; a layer's Q, K, V (and gate, up) of one type, or of types one holds exactly
    (quant_promote.common_type), stacked into one matrix, attn_qkv (ffn_gate_up), read by one GEMV;
    else Q and K alone (attn_qk) where they can be; a Qwen3.5 MoE layer's router and shared expert
    gate as gate_inps stacks them (SHARED_GATE_FOLD). A gated attention's attn_q ([q, gate] a head)
    is split into attn_q and attn_q_gate first (split_gated_q), qwen3next's fused DeltaNet
    projections into qwen35's (split_fused_ssm)."""
    tensors = {name.removesuffix(".weight"): t for name, t in mf.tensors.items() if not _mtp(name, cfg)}
    if cfg.attn_output_gate:
        tensors.update(split_gated_q(tensors, cfg))
    if cfg.deltanet is not None and (cfg.deltanet.fused_ba or cfg.deltanet.fused_qkvz):
        tensors.update(split_fused_ssm(tensors, cfg))
        tensors = {name: t for name, t in tensors.items() if not name.endswith((".ssm_ba", ".ssm_in"))}
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
    if tuning.shared_gate_fold:
        w.update(gate_inps(ctx, tensors, cfg))
    for name, t in tensors.items():
        plain = len(t.shape) == 1 or name.endswith(".ssm_conv1d")  # the conv kernel reads float32 (C, K)
        w[name] = ctx.upload(t.dequantize()) if plain else upload_matrix(ctx, name, [t])
    return w


def gate_inps(ctx, tensors: dict, cfg: ModelConfig) -> dict:
    """Each layer's router (E, D) and shared expert gate (1, D) stacked as ffn_gate_inps (E + 1, D),
    the decode router GEMV's weight (its last logit the gate's: gpu/moe.py), where both are of one
    type and width (no conversion: routing sees the file's values) and row E starts aligned;
    ffn_gate_inp and ffn_gate_inp_shexp are then views of its rows (prefill reads them apart), so
    nothing is held twice. The tensors stacked leave `tensors`."""
    out = {}
    fused, parts = GATE_INPS
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        router, gate = ts = [tensors.get(p + n) for n in parts]
        if router is None or gate is None or len(router.shape) != 2 or router.ggml_type != gate.ggml_type \
                or router.shape[1] != gate.shape[1] or router.ggml_type not in repack.PACKED_TYPES \
                or not repack.rows_aligned(router.ggml_type, router.shape[1], router.shape[0]):
            continue
        E = router.shape[0]
        out[p + fused] = stacked = upload_matrix(ctx, p + fused, ts)
        out[p + parts[0]], out[p + parts[1]] = repack.rows_of(stacked, 0, E), repack.rows_of(stacked, E, E + 1)
        for n in parts:
            del tensors[p + n]
    return out


def _mtp(name: str, cfg: ModelConfig) -> bool:
    """Whether name is a tensor of the MTP layers past the model's own (n_layer_nextn), not run."""
    parts = name.split(".")
    return cfg.n_layer_nextn > 0 and parts[0] == "blk" and int(parts[1]) >= cfg.n_layer


def split_gated_q(tensors: dict, cfg: ModelConfig) -> dict:
    """Each gated attention layer's attn_q (H (2 Dh), D), [q, gate] a head, as attn_q (H Dh, D), the
    queries, and attn_q_gate (H Dh, D), the gates: whole rows, so any type splits exactly, and Q
    then stacks with K and V as in an ungated layer."""
    out, H, Dh = {}, cfg.n_head, cfg.head_dim
    for il in range(cfg.n_layer):
        name = f"blk.{il}.attn_q"
        t = tensors.get(name)
        if t is None:
            continue
        heads = t.data.reshape(H, 2, Dh, -1)
        out[name], out[name + "_gate"] = (_rows(t, key, heads[:, part]) for key, part in
                                          ((name, 0), (name + "_gate", 1)))
    return out


def split_fused_ssm(tensors: dict, cfg: ModelConfig) -> dict:
    """qwen3next's DeltaNet projections as qwen35's: ssm_ba ([b, a] a QK head, Hv/Hk rows each) as
    ssm_beta and ssm_alpha, and an older file's ssm_in ([q, k, v, z] a QK head) as attn_qkv (Q of
    every head, K, V) and attn_gate (Z); whole rows regrouped, so any type splits exactly. The V
    heads stay grouped by QK head (DeltaNetShape.v_tiled False), as the kernels read them."""
    d, out = cfg.deltanet, {}
    r, dk = d.n_v_heads // d.n_k_heads, d.head_k_dim
    r_dv = r * d.head_v_dim
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        ba = tensors.get(p + "ssm_ba")
        if ba is not None:
            rows = ba.data.reshape(d.n_k_heads, 2, r, -1)
            for name, part in (("ssm_beta", 0), ("ssm_alpha", 1)):
                out[p + name] = _rows(ba, p + name, rows[:, part])
        qkvz = tensors.get(p + "ssm_in")
        if qkvz is not None:
            heads = qkvz.data.reshape(d.n_k_heads, 2 * dk + 2 * r_dv, -1)
            q, k, v, z = np.split(heads, [dk, 2 * dk, 2 * dk + r_dv], axis=1)
            qkv = np.concatenate([x.reshape(-1, heads.shape[-1]) for x in (q, k, v)])
            out[p + "attn_qkv"] = _rows(qkvz, p + "attn_qkv", qkv)
            out[p + "attn_gate"] = _rows(qkvz, p + "attn_gate", z)
    return out


def _rows(t: Tensor, name: str, rows: np.ndarray) -> Tensor:
    """A tensor of t's type and width holding `rows` of t's data (any leading shape), contiguous."""
    rows = np.ascontiguousarray(rows.reshape(-1, rows.shape[-1]))
    return Tensor(name, t.fmt, (rows.shape[0], t.shape[-1]), rows)


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
    (ROUTER_FOLD); the fold runs at the steps where attention writes that int8 output. None for
    gated attention (Qwen3.5): attn_output reads the gated output, not what attention writes."""
    folds = {}
    if not (tuning.router_fold and tuning.attn_dp4a and cfg.n_expert) or cfg.attn_output_gate:
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
