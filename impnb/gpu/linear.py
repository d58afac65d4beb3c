"""Running a Linear (gpu/weights.py) on the kernels chosen for it: y = x · Wᵀ, float32 in and out.

Up to GEMV_MAX_ROWS tokens a GEMV with fused dequantization: at T = 2..8 on gemv_dp4a_multi
for the Linears whose `multi` lists T (measured: gpu/gemv_dispatch.py; a residual after it by
the norm kernel), or on the int8 GEMM gemm_mmq where it lists MMQ (x's pre-norm in its
quantization, a residual and GLU unfused); on dp4a with x in int8
for the Linears whose `dp4a` is set (a residual tail there where DP4A_TAIL), gemv_stream for
`stream` ones at T = 1, else gemv.py (with the pre-norm, accumulation, a residual tail or a
per-token gate fused where asked). Past that a
GEMM on the Linear's measured path: tensor-core tiles on the stored weight (fp16 x, or x in int8
on "mmq"), or dequantization to fp16 and cuBLAS (the fallback). The stacked Q|K|V takes the
split-K tiles or the few-row GEMMs where its table entry says so, else cuBLAS. Scratch buffers come from the arena.
Legend: T tokens, K input width, N output rows.
"""

from functools import partial

import numpy as np
from gguf import GGMLQuantizationType as T

from impnb.gpu import gemm_dispatch
from impnb.gpu.gemv_dispatch import MMQ
from impnb.gpu.plan import StepPlan
from impnb.gpu.weights import Linear
from impnb.kernels.attention import attention_decode
from impnb.kernels.elementwise import activations
from impnb.kernels.elementwise.cast import cast_f16
from impnb.kernels.gemm import gemm_few, gemm_mmq, gemm_mmq_pair, gemm_wgmma_few, gemm_wgmma_rs, quant_x32
from impnb.kernels.gemm.dequant import dequant
from impnb.kernels.gemm.gemm_quant_splitk import gemm_splitk, gemm_splitk_split, splits_for
from impnb.kernels.gemm.gemm_tc_quant import gemm_quant
from impnb.kernels.gemm.gemm_wgmma_quant import gemm_wgmma_quant
from impnb.kernels.gemm.reduce_glu import reduce_glu
from impnb.kernels.gemv import gemv, gemv_dp4a, gemv_gated, gemv_residual, gemv_stacked, gemv_stream
from impnb.kernels.gemv.gemv_dp4a_multi import gemv_dp4a_multi, gemv_dp4a_multi_split
from impnb.kernels.gemv.gemv_tail import Residual
from impnb.kernels.gemv.quant_x import QuantX, arena_buffers, quantize_x
from impnb.tuning import GEMV_MAX_ROWS, Overrides


class MatMul:
    """The linear layers' launches on one stream, scratch from one arena."""

    def __init__(self, ctx, arena, cublas, tuning: Overrides):
        self.ctx, self.arena, self.cublas, self.tuning = ctx, arena, cublas, tuning
        self.resident: dict[int, object] = {}  # id(PackedWeight) -> its fp16 copy (keep_w16)

    def keep_w16(self, linears, room: int) -> int:
        """Dequantize once, and keep, the fp16 copies that cuBLAS reads of the Linears whose GEMM
        takes it at some row bucket, where they all fit in tuning.w16_resident_mb and in `room`
        bytes; -> the bytes kept (0: none, w16 then dequantizes into scratch at each use)."""
        ws = {id(lin.w): lin.w for lin in linears if "cublas" in lin.gemm_paths.values()}
        total = sum(2 * w.rows * w.cols for w in ws.values())
        if not ws or total > min(self.tuning.w16_resident_mb * 2 ** 20, room):
            return 0
        for key, w in ws.items():
            w16 = self.ctx.empty((w.rows, w.cols), np.float16)
            dequant(w, w16, self.ctx.nb_stream)
            self.resident[key] = w16
        self.ctx.sync()
        return total

    def linear(self, x, lin: Linear, y, norm: tuple | None = None, accumulate: bool = False,
               residual: Residual | None = None, xq: QuantX | None = None, ready=None) -> None:
        """y (T, N) = x (T, K) · Wᵀ. norm (wn, eps) reads RMSNorm(x) * wn for x (a GEMM: in its
        input's cast or quantization); accumulate adds into y; xq: x's int8 form, already written
        (attn_xq, or the combine's for a pair's V), for gemv_dp4a; ready: x's GEMM operand, already made (glu's, with `down`).
        residual (gemv_tail.Residual) is then applied to y: by the GEMV's tail (GEMV_TAIL), else
        a norm kernel; where it has hq, h's int8 form is written there too (by the norm kernel or
        gemv_dp4a_multi's tail, else by quantize_x after)."""
        w, s = lin.w, self.ctx.nb_stream
        assert ready is None or x.shape[0] > GEMV_MAX_ROWS, "a ready operand: GEMMs only"
        multi = lin.multi.get(x.shape[0])
        if multi and multi != MMQ:  # a residual after it by the norm kernel (hq there too)
            gemv_dp4a_multi(w, xq if xq is not None else self.quantized(x, norm), y, s, multi, accumulate)
            if residual is not None:
                residual.unfused(y, s)
            return
        if multi == MMQ:
            assert xq is None, "gemm_mmq quantizes its own x"
            self.mmq(x, lin, y, norm, accumulate)
            if residual is not None:
                residual.unfused(y, s)
            return
        if residual is not None and residual.hq is not None and x.shape[0] <= GEMV_MAX_ROWS:
            # (a GEMV with its tail below, which writes h alone): h's int8 form after it
            self.linear(x, lin, y, norm, accumulate, residual._replace(hq=None), xq, ready)
            quantize_x(residual.h, residual.hq, s)
            return
        if xq is not None:
            assert norm is None and residual is None and x.shape[0] <= GEMV_MAX_ROWS
            gemv_dp4a.gemv_dp4a(w, xq, y, s, accumulate)
            return
        if x.shape[0] <= GEMV_MAX_ROWS:
            if lin.stream and x.shape[0] == 1 and norm is None and not accumulate and residual is None:
                gemv_stream.gemv_stream(w, x, y, s)
                return
            if residual is not None and self.tuning.gemv_tail:
                assert norm is None and not accumulate, "GEMV tail: no fused norm or accumulation"
                if lin.dp4a and self.tuning.dp4a_tail:
                    gemv_dp4a.gemv_dp4a_residual(w, self.quantized(x), y, residual, s)
                else:
                    gemv_residual.gemv_residual(w, x, y, residual, s)
                return
            if lin.dp4a:
                self.dp4a(x, lin, y, norm, accumulate)
            else:
                gemv.gemv(w, x, y, s, accumulate, norm=norm)
        else:
            self.gemm(x, w, y, lin.gemm_path(x.shape[0]), norm, accumulate, ready)
        if residual is not None:
            residual.unfused(y, s)

    def mmq(self, x, lin: Linear, y, norm: tuple | None = None, accumulate: bool = False) -> None:
        """gemm_mmq of x (or of RMSNorm(x) * wn with norm) into y (y += with accumulate)."""
        w, (M, N) = lin.w, y.shape
        S = gemm_mmq.splits_for(M, N, w.cols, sms=gemv_stream.sm_count(), ggml_type=w.ggml_type)
        gemm_mmq.gemm_mmq(x, self.x32_buffers(M, w.cols), w, y, self.arena.get("splitk_part", (S, M, N)),
                          self.ctx.nb_stream, S, accumulate, norm=norm)

    def dp4a(self, x, lin: Linear, y, norm: tuple | None, accumulate: bool = False, glu: int = gemv.NO_GLU) -> None:
        """gemv_dp4a of x (T <= GEMV_MAX_ROWS), or of RMSNorm(x) * wn with norm, made int8 by
        quantize_x first."""
        gemv_dp4a.gemv_dp4a(lin.w, self.quantized(x, norm), y, self.ctx.nb_stream, accumulate, glu=glu)

    def takes_int8(self, lin: Linear, n_tok: int) -> bool:
        """Whether split(x, lin, ...) of n_tok rows reads x's int8 form (gemv_dp4a_multi, or gemv_dp4a
        at one token), so that it may take one written before (split's xin)."""
        multi = lin.multi.get(n_tok)
        return (bool(multi) and multi != MMQ) or (n_tok == 1 and lin.dp4a)

    def takes_x32(self, lin: Linear, n_tok: int, v: Linear | None = None) -> bool:
        """Whether split(x, lin, ...) of n_tok rows, or with v pair(x, lin, (Q, K), v, ...), runs
        gemm_mmq (gemm_mmq_pair, or Q|K's split on gemm_mmq beside V's own launch) on x's int8 form
        in groups of 32, so that it may take one written before (their x32)."""
        if v is not None:
            if self._mmq_pair(n_tok, lin, 2, v):
                return True
            if self._rs_pair(n_tok, lin, 2, v):
                return False
        multi = lin.multi.get(n_tok)
        return multi == MMQ or (multi is None and n_tok > GEMV_MAX_ROWS and lin.gemm_path(n_tok) == "mmq")

    def takes_gated(self, lin: Linear, n_tok: int) -> bool:
        """Whether linear(x, lin, y, accumulate=True) of n_tok rows runs gemv.py's kernel, which has
        a gated form (linear_gated); not gemv_dp4a, gemv_dp4a_multi or a GEMM."""
        return n_tok <= GEMV_MAX_ROWS and not lin.multi.get(n_tok) and not lin.dp4a

    def linear_gated(self, x, lin: Linear, y, gate, col: int) -> None:
        """y (T, N) += sigmoid(gate[t, col]) * x[t] · Wᵀ for each row t, where takes_gated (gemv_gated)."""
        assert self.takes_gated(lin, x.shape[0]), lin.name
        gemv_gated.gemv_gated(lin.w, x, y, gate, col, self.ctx.nb_stream, accumulate=True)

    def linear_f32(self, x, lin: Linear, y) -> None:
        """Like linear, with fp32 operands throughout for an F32 weight (the MoE router: expert
        choices must not hinge on fp16 rounding)."""
        w = lin.w
        if x.shape[0] <= GEMV_MAX_ROWS or w.ggml_type != T.F32:
            self.linear(x, lin, y)
            return
        self.cublas.gemm_f32(x, w.parts[0].view(np.float32).reshape(w.rows, w.cols), y)

    def gemm(self, x, w, y, path: str, norm: tuple | None = None, accumulate: bool = False, ready=None,
             reduce: bool = True):
        """y (T, N) = x (T, K) · Wᵀ (y += with accumulate) by a gemm_dispatch path: the tiles read
        W as it is stored (split along K into splits_for's parts on "splitk", "few", "wgmma_few" and
        "mmq"); cuBLAS reads an fp16 copy dequantized into a scratch buffer. norm (wn, eps): of
        RMSNorm(x) * wn, in x's cast to fp16 or its int8 quantization (mmq); ready: x's operand
        already made for this path (operand_for's: fp16, or quant_x32's QuantX32 on "mmq").
        -> None; with reduce=False, the (S, M, N) float32 partial products the caller adds up
        itself (a split path's scratch, left unreduced; else y as (1, M, N))."""
        s, (M, N) = self.ctx.nb_stream, y.shape

        def a16():
            return ready if ready is not None else self.x16(x, norm, perm=path == "wrs")

        split_for = {"splitk": splits_for, "few": gemm_few.splits_for, "wgmma_few": gemm_wgmma_few.splits_for,
                     "mmq": partial(gemm_mmq.splits_for, ggml_type=w.ggml_type),
                     "wrs": gemm_wgmma_rs.splits_for}.get(path)
        if split_for is not None:
            S = split_for(M, N, w.cols, sms=gemv_stream.sm_count())
            part = self.arena.get("splitk_part", (S, M, N))
        if path == "cublas":
            self.cublas.gemm_f16(a16(), self.w16(w), y, accumulate)
        elif path == "wgmma":
            gemm_wgmma_quant(a16(), w, y, s, accumulate)
        elif path == "splitk":
            gemm_splitk(a16(), w, y, part, s, S, accumulate, reduce=reduce)
        elif path == "few":
            gemm_few.gemm_few(a16(), w, y, part, s, S, accumulate, reduce=reduce)
        elif path == "wgmma_few":
            gemm_wgmma_few.gemm_wgmma_few(a16(), w, y, part, s, S, accumulate, reduce=reduce)
        elif path == "wrs":
            gemm_wgmma_rs.gemm_wgmma_rs(a16(), w, y, part, s, S, accumulate, reduce=reduce)
        elif path == "mmq":
            gemm_mmq.gemm_mmq(x, ready if ready is not None else self.x32_buffers(M, w.cols), w, y, part, s, S,
                              accumulate, norm=norm, quantized=ready is not None, reduce=reduce)
        else:
            gemm_quant(a16(), w, y, s, accumulate, bm=gemm_dispatch.TILE_BM[path])
        if reduce:
            return None
        return part if split_for is not None else y.reshape(1, M, N)

    def operand_for(self, lin: Linear, n_tok: int):
        """The buffers of lin's GEMM operand for n_tok rows as its path reads it (n_tok past
        GEMV_MAX_ROWS): quant_x32's QuantX32 on "mmq", else an fp16 (n_tok, K) array (on "wrs" in gemm_wgmma_rs's
        column order, as glu's reduce_glu writes it there)."""
        if lin.gemm_path(n_tok) == "mmq":
            return self.x32_buffers(n_tok, lin.w.cols)
        return self.arena.get("a16", (n_tok, lin.w.cols), np.float16)

    def split(self, x, lin: Linear, ys, norm: tuple | None = None, joint=None, xin: QuantX | None = None,
              keep_parts: bool = False, x32: quant_x32.QuantX32 | None = None):
        """ys[i] (T, N_i) = x · W_iᵀ for the matrices stacked in lin (attn_qkv); norm as in linear.
        joint: ys as one (1, sum N_i) array where stacked_outputs made them (one token): a dp4a
        Linear then takes gemv_dp4a's plain GEMV, the split being the rows' order alone. xin: the
        input's int8 form (of RMSNorm(x) * wn with norm), already written, where takes_int8(lin, T).
        keep_parts: where the path splits K (gemm_mmq, gemm_wgmma_rs, the few-row and split-K
        GEMMs), its partial products (S, T, sum N_i) are left unreduced in a buffer of their own
        and returned (ys untouched); -> None where ys were written. x32: the input's int8 form for
        gemm_mmq (x32_buffers', of RMSNorm(x) * wn with norm), already written, where takes_x32.
        gemm_mmq keeping its partials lets the next kernel (their reader) launch as its blocks start
        (tuning.MMQ_TRIGGER)."""
        w = lin.w
        if self.takes_x32(lin, x.shape[0]):
            assert xin is None, "gemm_mmq reads x̂ in groups of 32"
            M = x.shape[0]
            S = gemm_mmq.splits_for(M, w.rows, w.cols, sms=gemv_stream.sm_count(), ggml_type=w.ggml_type)
            part = self._part(keep_parts, (S, M, w.rows))
            gemm_mmq.gemm_mmq_split(x, x32 or self.x32_buffers(M, w.cols), w, ys, part, self.ctx.nb_stream, S,
                                    None if x32 else norm, reduce=not keep_parts, quantized=x32 is not None,
                                    trigger=keep_parts and self.tuning.mmq_trigger)
            return part if keep_parts else None
        assert x32 is None, "an int8 input in groups of 32 for a path other than gemm_mmq"
        multi = lin.multi.get(x.shape[0])
        if multi:
            gemv_dp4a_multi_split(w, xin if xin is not None else self.quantized(x, norm), ys, self.ctx.nb_stream, multi)
            return
        if joint is not None and x.shape[0] == 1 and lin.dp4a:
            assert joint.shape == (1, w.rows)
            if xin is not None:
                gemv_dp4a.gemv_dp4a(w, xin, joint, self.ctx.nb_stream)
            else:
                self.dp4a(x, lin, joint, norm)
            return
        assert xin is None, "an int8 input for a GEMV that reads floats"
        if x.shape[0] <= GEMV_MAX_ROWS:
            gemv_stacked.gemv_split(w, x, ys, self.ctx.nb_stream, norm=norm)
            return
        path, M = lin.gemm_path(x.shape[0]), x.shape[0]
        if path in ("splitk", "few", "wgmma_few", "wrs"):
            split_for, gemm_split = {
                "splitk": (splits_for, gemm_splitk_split),
                "few": (gemm_few.splits_for, gemm_few.gemm_few_split),
                "wgmma_few": (gemm_wgmma_few.splits_for, gemm_wgmma_few.gemm_wgmma_few_split),
                "wrs": (gemm_wgmma_rs.splits_for, gemm_wgmma_rs.gemm_wgmma_rs_split)}[path]
            S = split_for(M, w.rows, w.cols, sms=gemv_stream.sm_count())
            part = self._part(keep_parts, (S, M, w.rows))
            gemm_split(self.x16(x, norm, perm=path == "wrs"), w, ys, part, self.ctx.nb_stream, S,
                       reduce=not keep_parts)
            return part if keep_parts else None
        x16, w16, row = self.x16(x, norm), self.w16(w), 0
        for y in ys:
            self.cublas.gemm_f16(x16, w16[row:row + y.shape[1]], y)
            row += y.shape[1]

    def pair(self, x, lin_a: Linear, ys_a, lin_b: Linear, y_b, norm: tuple | None, one_launch: bool,
             keep_parts: bool = False, x32: quant_x32.QuantX32 | None = None, xq_b: QuantX | None = None):
        """split(x, lin_a, ys_a, norm) then linear(x, lin_b, y_b, norm) (a layer's Q|K and its V of
        another type): one GEMV launch for both at decode with norm where one_launch (chosen at
        load: GEMV_PAIR, neither on dp4a) unless either takes gemv_dp4a_multi at this T; one
        gemm_wgmma_rs_pair launch past GEMV_MAX_ROWS at tuning's GEMM_PAIR_RS_ROWS buckets
        (Q4_K Q|K, Q6_K V); one gemm_mmq_pair launch at its GEMM_PAIR_MMQ_ROWS buckets.
        keep_parts (as in split) -> None where the outputs were written, else (the partials, whether
        V's columns are among them: on gemm_wgmma_rs_pair and gemm_mmq_pair; else y_b was written).
        x32: as split's, where takes_x32(lin_a, n_tok, lin_b); xq_b: lin_b's input in int8 (quant_x's),
        already written, where pair_takes_xq(lin_a, lin_b, n_tok)."""
        n_tok = x.shape[0]
        assert xq_b is None or self.pair_takes_xq(lin_a, lin_b, n_tok), "V's int8 input: its dp4a GEMV alone"
        if self._mmq_pair(n_tok, lin_a, len(ys_a), lin_b):
            N1, N2, K = lin_a.w.rows, lin_b.w.rows, lin_a.w.cols
            S = gemm_mmq_pair.pair_splits(n_tok, N1, N2, K, sms=gemv_stream.sm_count())
            part = self._part(keep_parts, (S, n_tok, N1 + N2))
            gemm_mmq_pair.gemm_mmq_pair(x, x32 or self.x32_buffers(n_tok, K), lin_a.w, lin_b.w, (*ys_a, y_b), part,
                                        self.ctx.nb_stream, S, None if x32 else norm, reduce=not keep_parts,
                                        quantized=x32 is not None)
            return (part, True) if keep_parts else None
        if one_launch and n_tok <= GEMV_MAX_ROWS and norm is not None and not (lin_a.multi.get(n_tok)
                                                                                  or lin_b.multi.get(n_tok)):
            assert x32 is None, "gemv_pair reads x in fp32"
            gemv_stacked.gemv_pair(lin_a.w, ys_a, lin_b.w, y_b, x, norm, self.ctx.nb_stream)
            return
        if self._rs_pair(n_tok, lin_a, len(ys_a), lin_b):
            assert x32 is None, "gemm_wgmma_rs_pair reads x in fp16"
            N = lin_a.w.rows + lin_b.w.rows
            S = gemm_wgmma_rs.splits_for(n_tok, N, lin_a.w.cols, sms=gemv_stream.sm_count())
            part = self._part(keep_parts, (S, n_tok, N))
            gemm_wgmma_rs.gemm_wgmma_rs_pair(self.x16(x, norm, perm=True), lin_a.w, lin_b.w, (*ys_a, y_b), part,
                                             self.ctx.nb_stream, S, reduce=not keep_parts)
            return (part, True) if keep_parts else None
        part = self.split(x, lin_a, ys_a, norm, keep_parts=keep_parts, x32=x32)
        self.linear(x, lin_b, y_b, norm, xq=xq_b)
        return None if part is None else (part, False)

    def pair_takes_xq(self, lin_a: Linear, lin_b: Linear, n_tok: int) -> bool:
        """Whether pair(x, lin_a, ..., lin_b, ...) of n_tok rows runs lin_b alone on gemv_dp4a_multi,
        so that its int8 input may come written before (pair's xq_b)."""
        multi = lin_b.multi.get(n_tok)
        return (bool(multi) and multi != MMQ and n_tok <= GEMV_MAX_ROWS
                and not self._mmq_pair(n_tok, lin_a, 2, lin_b) and not self._rs_pair(n_tok, lin_a, 2, lin_b))

    def _rs_pair(self, n_tok: int, lin_a: Linear, n_a: int, lin_b: Linear) -> bool:
        """Whether pair's Q|K (lin_a) and V (lin_b) take gemm_wgmma_rs_pair at n_tok rows."""
        return n_tok > GEMV_MAX_ROWS and gemm_dispatch.m_bucket(n_tok) in self.tuning.gemm_pair_rs and n_a == 2 \
            and gemm_wgmma_rs.pair_supports(lin_a.w.ggml_type, lin_b.w.ggml_type, lin_a.w.cols)

    def _part(self, keep: bool, shape: tuple):
        """A split-K GEMM's partials: the shared scratch, or where they are kept for a later kernel
        (keep_parts) a buffer of their own, which a GEMM between them and their reader cannot reuse."""
        return self.arena.get("qkv_part" if keep else "splitk_part", shape)

    def _mmq_pair(self, n_tok: int, lin_a: Linear, n_a: int, lin_b: Linear) -> bool:
        """Whether pair's Q|K (lin_a) and V (lin_b) take gemm_mmq_pair at n_tok rows: its bucket
        (GEMV_MAX_ROWS up to that many rows, where lin_a's rows path is the int8 GEMM; else the
        GEMM bucket) in tuning's gemm_pair_mmq, types it takes."""
        if n_tok <= GEMV_MAX_ROWS:
            bucket = GEMV_MAX_ROWS if lin_a.multi.get(n_tok) == MMQ else None
        else:
            bucket = gemm_dispatch.m_bucket(n_tok)
        return bucket in self.tuning.gemm_pair_mmq and n_a == 2 \
            and gemm_mmq_pair.pair_supports(lin_a.w.ggml_type, lin_b.w.ggml_type, lin_a.w.cols)

    def glu(self, x, lin: Linear, act: str, y, norm: tuple | None = None, down: Linear | None = None,
            xin: QuantX | None = None):
        """y (T, F) = act(x · W_gateᵀ) * (x · W_upᵀ), gate|up stacked in lin; act gelu or silu;
        norm as in linear; xin: x's int8 form, already written (a residual tail's hq), where
        takes_int8(lin, T). With down (the FFN's down Linear) past GEMV_MAX_ROWS rows the product
        goes straight into down's GEMM operand instead, from gate|up's unreduced split-K partials
        (reduce_glu: one launch for the reduce, the activation and the cast or quantization), and
        that operand is returned for linear's `ready` (y untouched); else None."""
        w, n_tok, s = lin.w, x.shape[0], self.ctx.nb_stream
        act_id = gemv.GELU if act == "gelu" else gemv.SILU
        if down is not None and n_tok > GEMV_MAX_ROWS:
            part = self.gemm(x, w, self.arena.get("gate_up", (n_tok, w.rows)), lin.gemm_path(n_tok), norm,
                             reduce=False)
            ready = self.operand_for(down, n_tok)
            reduce_glu(part, act, ready, s, perm=down.gemm_path(n_tok) == "wrs")
            return ready
        multi = lin.multi.get(n_tok)
        if multi == MMQ:
            gate_up = self.arena.get("gate_up", (n_tok, w.rows))
            self.mmq(x, lin, gate_up, norm)
            (activations.geglu_fused if act == "gelu" else activations.swiglu_fused)(gate_up, y, s)
            return
        if multi:
            assert xin is None or norm is None
            gemv_dp4a_multi(w, xin if xin is not None else self.quantized(x, norm), y, s, multi, glu=act_id)
            return
        assert xin is None, "an int8 input for a GEMV that reads floats"
        if n_tok <= GEMV_MAX_ROWS and lin.dp4a:
            self.dp4a(x, lin, y, norm, glu=act_id)
            return
        if n_tok <= GEMV_MAX_ROWS and gemv_stacked.glu_fits(w, n_tok):
            gemv_stacked.gemv_glu(w, x, y, act_id, s, norm=norm)
            return
        gate_up = self.arena.get("gate_up", (n_tok, w.rows))
        self.linear(x, lin, gate_up, norm)
        (activations.geglu_fused if act == "gelu" else activations.swiglu_fused)(gate_up, y, s)

    def attn_xq(self, lin: Linear, step: StepPlan, window: int | None, one_split: bool = False) -> QuantX | None:
        """Where decode attention of a layer of this window writes its output's int8 form for lin
        (attn_output) to take gemv_dp4a on it, its buffers; else None (ATTN_DP4A). The short kernel
        does, and a batch's attention_decode_mma where it runs in one split (one_split: forward's
        _mma_one_split). lin reads it on gemv_dp4a_multi at its T, or on gemv_dp4a where wide
        enough for int8 (int8_x), not on gemm_mmq (which quantizes x its own way)."""
        multi = lin.multi.get(step.rows)
        if (self.tuning.attn_dp4a and step.n_tokens <= attention_decode.MAX_T
                and (step.short_for(window) or one_split)
                and (multi or lin.int8_x) and step.rows <= GEMV_MAX_ROWS and multi != MMQ):
            return self.xq_buffers(step.rows, lin.w.cols, "attn_xq")
        return None

    def quantized(self, x, norm: tuple | None = None) -> QuantX:
        """x (T, K), or RMSNorm(x) * wn with norm (wn, eps), in int8 for gemv_dp4a."""
        xq = self.xq_buffers(*x.shape)
        quantize_x(x, xq, self.ctx.nb_stream, norm)
        return xq

    def stacked_outputs(self, name: str, n_tok: int, widths: tuple) -> tuple:
        """A stacked Linear's outputs for split: ys[i] (T, widths[i]) float32, views of one buffer
        [y0 | y1 | ...] in that order, and at one token that buffer as (1, sum of widths) (the
        stacked GEMV's output row: split's `joint`), else None."""
        flat = self.arena.get(name, (n_tok * sum(widths),))
        ys, at = [], 0
        for n in widths:
            ys.append(flat[at:at + n_tok * n].reshape(n_tok, n))
            at += n_tok * n
        return ys, (flat.reshape(1, at) if n_tok == 1 else None)

    def xq_buffers(self, n_tok: int, K: int, name: str = "xq") -> QuantX:
        """The buffers of `quantized`'s int8 form of a (T, K) input (for a kernel that writes it)."""
        return arena_buffers(self.arena, n_tok, K, name)

    def x32_buffers(self, n_tok: int, K: int) -> quant_x32.QuantX32:
        """The buffers of gemm_mmq's int8 form of a (T, K) input (rows up to its token slabs)."""
        MP = gemm_mmq.slab_rows(n_tok)
        return quant_x32.QuantX32(self.arena.get("xq32", (MP, K // 4), np.uint32),
                                 self.arena.get("xq32_ds", (K // quant_x32.XGROUP, MP, 2)))

    def x16(self, x, norm: tuple | None = None, perm: bool = False):
        """x, or RMSNorm(x) * wn with norm (wn, eps), cast to fp16 into a scratch buffer (a GEMM's
        A operand); perm: in gemm_wgmma_rs's column order."""
        x16 = self.arena.get("x16", x.shape, np.float16)
        cast_f16(x, x16, self.ctx.nb_stream, norm, perm)
        return x16

    def w16(self, w):
        """The weight in fp16 for cuBLAS: its kept copy (keep_w16), else dequantized into a scratch
        buffer (the prefill fallback)."""
        kept = self.resident.get(id(w))
        if kept is not None:
            return kept
        w16 = self.arena.get("w16", (w.rows, w.cols), np.float16)
        dequant(w, w16, self.ctx.nb_stream)
        return w16
