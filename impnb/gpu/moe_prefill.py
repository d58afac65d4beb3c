"""The prefill expert GEMMs of a qwen3moe layer, each on the path gpu/moe_dispatch.py picks.

Both layouts start from moe_group's tiles (e, r0, n) of at most BM rows, in expert order:
  grouped, when every matrix takes the tiles (mma.sync or wgmma): S rows in expert order;
      gemm_grouped (or gemm_grouped_wgmma) gathers the tokens' rows itself (x_div = k), then
      reads act in place (x_div = 0).
  padded, when any takes cuBLAS: tile i owns rows i * BM .. i * BM + BM - 1 of every buffer
      (kernels/moe/moe_batched.py); moe_gather copies the tokens' fp16 rows there, zeros past n. A
      matrix then runs as either tile kernel over the padded tiles (x_div = 0) or as one
      cublasGemmBatchedEx of max_tiles entries of BM rows on all E experts dequantized to fp16
      (moe_pointers writes its pointer arrays on the device; entries past n_tiles multiply a zero
      scratch tile). Where cuBLAS can pay off (long chunks: at T >= 64 with E = 128, k = 8 an
      expert goes unused with odds (1 - k / E)^T < 2%) nearly every expert has tokens, so all E
      are dequantized, with no routing-dependent launch.
Either way act (rows, F) = silu(gate_e x) * up_e x and y (rows, D) = down_e act, the row of slot
s being rows[s]. m: a DeviceModel (its ctx, arena and cublas).
A batch's decode rows may take int8 paths instead (experts_int8, where moe_dispatch.ffn_paths
says: the grouped dp4a GEMV or the grouped int8 GEMM): x in int8, gate|up writes act in the
grouped layout, act in int8, down writes y there; each matrix's tiles hold at most its path's
tokens.
Legend: T tokens, D model dim, E experts, k per token, F expert FFN dim, S = T * k slots,
P = max_tiles * BM padded rows.
"""

import numpy as np

from impnb.gpu import moe_dispatch
from impnb.kernels.elementwise import activations
from impnb.kernels.gemm.dequant import dequant
from impnb.kernels.gemm import quant_x32
from impnb.kernels.gemv.gemv_dp4a_multi import gemv_dp4a_grouped, writes_int8
from impnb.kernels.gemv.gemv_units import NO_GLU
from impnb.kernels.gemv.quant_x import arena_buffers, quantize_x
from impnb.kernels.moe.gemm_grouped import BM, gemm_grouped
from impnb.kernels.moe.gemm_grouped_wgmma import gemm_grouped_wgmma
from impnb.kernels.moe.gemm_mmq_grouped import gemm_mmq_grouped
from impnb.kernels.moe.moe import Grouping, max_tiles, moe_group
from impnb.kernels.moe.moe_batched import batch_bases, moe_gather, moe_pointers


def experts_prefill(m, x16, glu: tuple, down, slots, k: int, n_expert: int, paths=None, act: str = "silu") -> tuple:
    """(act, y, rows) for the routed slots (S,) int32 of x16 (T, D) fp16 (act in fp16). glu: (gate_up,) stacked
    per expert, or (gate, up); paths: one per matrix of (*glu, down), by default moe_dispatch's;
    act: the gate's activation, silu or gelu (gemma4's experts)."""
    a, s = m.arena, m.ctx.nb_stream
    S, T = slots.shape[0], x16.shape[0]
    mats = (*glu, down)
    if paths is None:
        paths = moe_dispatch.ffn_paths(mats, n_expert, T, gemv=False)
    n_max = max_tiles(S, n_expert, BM)
    order = a.get("moe_order", (S,), np.int32)
    slot_row = a.get("moe_slot_row", (S,), np.int32)
    tiles = a.get("moe_tiles", (n_max, 3), np.int32)
    n_tiles = a.get("moe_n_tiles", (1,), np.int32)
    moe_group(slots, n_expert, BM, order, slot_row, tiles, n_tiles, s)
    if "cublas" not in paths:
        out, y = _glu_down(m, x16, mats, paths, (tiles, n_tiles, order), k, S, None, act)
        return out, y, slot_row
    xg = a.get("moe_xg", (n_max * BM, x16.shape[1]), np.float16)
    tiles_pad = a.get("moe_tiles_pad", (n_max, 3), np.int32)
    rows = a.get("moe_slot_row_pad", (S,), np.int32)
    moe_gather(x16, order, tiles, n_tiles, k, xg, tiles_pad, rows, s)
    w16 = a.get("moe_w16", (max(w.rows * w.cols for w, p in zip(mats, paths) if p == "cublas"),), np.float16)
    out, y = _glu_down(m, xg, mats, paths, (tiles_pad, n_tiles, order), 0, n_max * BM, w16, act)
    return out, y, rows


def int8_groupings(a, S: int, n_expert: int, paths) -> list:
    """The groupings (moe.Grouping) of S routed slots that the int8 paths' tiles need,
    one a tile size, in the order the paths first take them: moe_group's order inside an expert's
    rows is unspecified, so the first writes order and slot_row and a second its tiles alone (they
    depend only on the counts) over a scratch order."""
    sizes = dict.fromkeys(moe_dispatch.tile_tokens(p) for p in paths)
    return [Grouping(tm, a.get("moe_order" if i == 0 else "moe_order_scratch", (S,), np.int32),
                     a.get("moe_slot_row" if i == 0 else "moe_slot_row_scratch", (S,), np.int32),
                     a.get(f"moe_tiles_{tm}", (max_tiles(S, n_expert, tm), 3), np.int32),
                     a.get(f"moe_n_tiles_{tm}", (1,), np.int32)) for i, tm in enumerate(sizes)]


def experts_int8(m, h, gate_up, down, slots, k: int, n_expert: int, paths, glu: int, norm: tuple | None = None,
                 routed: bool = False, slot_order: bool = False) -> tuple:
    """(y, rows) as experts_prefill's for the routed slots (S,) of h (T, D) float32 (norm (wn, eps):
    of RMSNorm(h) * wn) on int8 paths (gate|up's, down's; moe_dispatch.INT8_PATHS: the grouped dp4a
    GEMV, its x̂ in 16-column groups, or the grouped int8 GEMM, in 32); glu: gate's activation
    (gemv SILU or GELU). routed: router_batch has grouped the slots into int8_groupings' buffers
    and, where gate|up takes the GEMV, written its x̂ (arena_buffers' "moe_hq"); slot_order: in
    slot order (router_batch.in_slot_order), the GEMVs' tiles fastest in launch order."""
    a, s = m.arena, m.ctx.nb_stream
    S, D = slots.shape[0], h.shape[1]
    F = down.cols
    groupings = int8_groupings(a, S, n_expert, paths)
    if not routed:
        for g in groupings:
            moe_group(slots, n_expert, *g, s)
    order, slot_row = groupings[0].order, groupings[0].slot_row  # the first grouping's, the tiles' rows
    by_tm = {g.tm: g for g in groupings}

    def run(w, path, x, name, n_rows, out, x_div, act, norm, ready, out_q=None, early=False):
        # x (rows, K) float32 to int8 in the path's layout (unless ready), then the path's kernel into
        # out (and out's int8 form into out_q); early: the GEMV right after gate|up's (gemv_dp4a_grouped)
        g = by_tm[moe_dispatch.tile_tokens(path)]
        if path == moe_dispatch.MMQ:
            xq = quant_x32.QuantX32(a.get(name, (x.shape[0], w.cols // 4), np.uint32),
                              a.get(name + "_ds", (w.cols // quant_x32.XGROUP, x.shape[0], 2)))
            quant_x32.quantize_x32(x, xq, s, norm)
            gemm_mmq_grouped(xq, w, n_rows, out, g.tiles, g.n_tiles, order, x_div, s, act)
        else:
            xq = arena_buffers(a, x.shape[0], w.cols, name)
            if not ready:
                quantize_x(x, xq, s, norm)
            gemv_dp4a_grouped(w, n_rows, xq, out, g.tiles, g.n_tiles, order, x_div, s,
                              moe_dispatch.GEMV_PATHS[path][1], g.tm, act, out_q, early, slot_order)

    act = a.get("moe_gemv_act", (S, F))
    act_q = arena_buffers(a, S, F, "moe_actq") if act_int8(m, paths, F, glu) else None
    run(gate_up, paths[0], h, "moe_hq", 2 * F, act, k, glu, norm, routed, act_q)
    y = a.get("moe_y", (S, D))
    run(down, paths[1], act, "moe_actq", D, y, 0, NO_GLU, None, act_q is not None,
        early=act_q is not None and m.tuning.down_early)
    return y, slot_row


def act_int8(m, paths, F: int, glu: int) -> bool:
    """Whether experts_int8's gate|up GEMV writes the down GEMV's int8 act itself (a quantize_x
    launch fewer): both on the grouped dp4a GEMV, gate|up a token a tile with whole quant_x groups a
    block (gemv_dp4a_multi.writes_int8), tuning.moe_act_int8."""
    gemv = moe_dispatch.GEMV_PATHS
    if not (m.tuning.moe_act_int8 and paths[0] in gemv and paths[1] in gemv):
        return False
    n_tok, variant = gemv[paths[0]]
    return writes_int8(variant, n_tok, 2 * F, glu)


def _glu_down(m, x, mats, paths, grouped, x_div: int, R: int, w16, act_fn: str) -> tuple:
    """act (R, F) fp16 and y (R, D) over the tiles of `grouped` (tiles, n_tiles, order); w16 as in
    expert_gemm; act_fn silu or gelu."""
    a, s = m.arena, m.ctx.nb_stream
    *glu, down = mats
    F, D = down.cols, x.shape[1]
    act16 = a.get("moe_act16", (R, F), np.float16)  # the GLU writes the down GEMM's fp16 A itself
    if len(glu) == 1:
        gate_up = a.get("moe_gate_up", (R, 2 * F))
        expert_gemm(m, paths[0], x, glu[0], gate_up, grouped, x_div, w16)
        (activations.geglu_fused if act_fn == "gelu" else activations.swiglu_fused)(gate_up, act16, s)
    else:
        gate, up = a.get("moe_gate", (R, F)), a.get("moe_up", (R, F))
        expert_gemm(m, paths[0], x, glu[0], gate, grouped, x_div, w16)
        expert_gemm(m, paths[1], x, glu[1], up, grouped, x_div, w16)
        (activations.geglu if act_fn == "gelu" else activations.swiglu)(gate, up, act16, s)
    y = a.get("moe_y", (R, D))
    expert_gemm(m, paths[-1], act16, down, y, grouped, 0, w16)
    return act16, y


def expert_gemm(m, path: str, x, w, c, grouped, x_div: int, w16) -> None:
    """c (R, N) = each tile's rows of x (fp16) times its expert of w (E * N, K), by `path`:
    "tiles" or "wgmma" (either layout), or "cublas" on the padded layout only (x (P, K), x_div =
    0) with w dequantized into the front of w16, a flat fp16 scratch of at least E * N * K values."""
    tiles, n_tiles, order = grouped
    s, N, K = m.ctx.nb_stream, c.shape[1], x.shape[1]
    if path in ("tiles", "wgmma"):
        (gemm_grouped_wgmma if path == "wgmma" else gemm_grouped)(x, w, N, c, tiles, n_tiles, order, x_div, s)
        return
    assert path == "cublas" and x_div == 0 and x.shape[0] == tiles.shape[0] * BM, (path, x_div, x.shape)
    a = m.arena
    w16 = w16[:w.rows * w.cols].reshape(w.rows, w.cols)
    dequant(w, w16, s)
    ptrs = a.get("moe_ptrs", (3, tiles.shape[0]), np.int64)
    bases = batch_bases(w16, x, c, a.zeros("moe_a_scratch", (BM, K), np.float16), a.get("moe_c_scratch", (BM, N)))
    moe_pointers(tiles, n_tiles, bases, ptrs, s)
    m.cublas.gemm_f16_batched(ptrs, N, BM, K)
