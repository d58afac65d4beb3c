"""The decoder stack on the GPU, following the layers' LayerSpecs (impnb/models/layers.py, whose
numpy forward is its reference), with fused residual norms.

Per layer (T tokens, D model dim, H/Hkv heads, Dh head dim; activations float32):
  h = norm(x) -> q, k, v = linear(h) (one stacked GEMV, or Q|K and V where V's type differs:
                                    at decode one launch of two types)
  -> [QK-norm] -> RoPE(pos) -> paged fp16 KV write                          (one fused kernel)
  -> attention (decode: one block per query row at short contexts, at head dim 64 with the
                kernel above fused in front; else split-K over the cache; prefill: FA2 tiles)
  -> o = linear(attn) -> x += [post-norm](o), h = ffn_norm(x)   (decode: the GEMV's last block;
                          at short contexts on dp4a of the int8 form attention writes beside attn)
  -> act(linear_gate(h)) * linear_up(h)                  (one stacked GEMV, act fused at T <= 2)
     or, for LayerSpec.ffn "moe", the routed expert FFN of gpu/moe.py
  -> d = linear_down -> x += [post-norm](d), h = next norm(x)    (decode: the GEMV's last block)
Hybrids (Qwen3.5): a "gated_deltanet" layer's mixer is gpu/deltanet.py's (projections, conv and
delta rule on the layer's recurrent state) and ssm_out adds into the residual as attn_output does;
a gated attention's output is times sigmoid(h · attn_q_gateᵀ) before attn_output; "moe_shared"
adds the sigmoid-gated shared expert beside the routed ones (gpu/moe.py).
The residual updates are one norm kernel after a GEMM or the prefill experts, and at decode the
tail of the GEMV (kernels/gemv/gemv_tail.py: one kernel a layer fewer each).
Decode (T <= GEMV_MAX_ROWS) where every layer's linears add straight into the residual (no
post-norm in any LayerSpec: LoadPlan.fuse_norms) fuses the norms into the GEMVs instead: Q|K|V,
gate|up, the router and the int8 quantization for dp4a read RMSNorm(x) * w themselves,
attn_output and ffn_down (the experts' fused down) add into x (two kernels a layer fewer than
separate norms; each costs ~3 µs in the decode graph; no grid-wide tail either). A batch's
decode past GEMV_MAX_ROWS rows does the same on its GEMMs (tuning.BATCH_FUSED_NORMS): RMSNorm(x) * w
in each input's cast to fp16 or int8 quantization, attn_output and ffn_down adding into x in
their split-K reduce or epilogue, the routed experts' combine adding into x. The MoE
router runs in attn_output's launch where gpu/weights.py folds it (ROUTER_FOLD): attn_output
then writes x + o out of place, into a spare buffer that becomes x.
Under tensor parallelism (m.tp; impnb/parallel) each rank holds a slice of the heads and of the
FFN width, so attn_output and ffn_down (the experts' down) give partial sums: they are
all-reduced on the model's stream before the residual update (fused decode: rank 0 adds its
partial into x, the others write theirs in x's place, and x is all-reduced; no router fold);
the logits of a slice of the vocabulary each are all-gathered (m.vocab_split).
"""

import numpy as np

from impnb.gpu import attention_dispatch
from impnb.gpu.layer_weights import Attention, DenseFFN
from impnb.gpu.plan import StepPlan
from impnb.gpu import moe_dispatch
from impnb.gpu.moe import NextX32, attn_output_moe_decode, moe_ffn, moe_ffn_decode, moe_ffn_grouped_decode
from impnb.kernels.moe.gemv_moe_dp4a import NextInput
from impnb.kernels.elementwise import activations, norm
from impnb.kernels.attention import (attention_decode, attention_decode_mma, attention_fa2, attention_fa2_decode,
                                    attention_wgmma, attention_wide, qkv_post)
from impnb.kernels.attention.attention_decode_short import attention_decode_short
from impnb.kernels.elementwise.embedding import embedding
from impnb.kernels.gemv import gemv_stream
from impnb.kernels.gemv.gemv_tail import Residual
from impnb.kernels.gemv.quant_x import QuantX
from impnb.kernels.elementwise.rows import gather_row
from impnb.kernels.elementwise.sigmoid_gate import sigmoid_gate
from impnb.models.config import ModelConfig
from impnb.tuning import GEMV_MAX_ROWS

MIXERS = ("attention", "gated_deltanet")  # the LayerSpec.mixer kinds this stack runs
FFNS = ("gated", "moe", "moe_shared")  # the LayerSpec.ffn kinds it runs


def deltanet_block(*args, **kwargs):
    """gpu/deltanet.deltanet_block, imported at a hybrid's first layer: other models load none of
    the DeltaNet kernels' modules."""
    from impnb.gpu import deltanet

    return deltanet.deltanet_block(*args, **kwargs)


def forward(m, step: StepPlan, last_only: bool = True, last_row=None):
    """Run step.batch sequences of step.n_tokens = T tokens each through model m -> logits
    buffer, decode attention as the step plan says. The R = batch * T rows (ids in m.ids[:R],
    positions in m.pos[:R]) go sequence by sequence; sequence b's pages are m.kv.tables[b].

    Logits of every row, or of each sequence's last one; last_row (int32 (1,) on the device,
    one sequence) picks that row at run time instead of T - 1 (padded chunks in a captured graph),
    and the Gated DeltaNet layers then read the chunk's real rows from m.rec.lengths.

    m is a DeviceModel; every buffer comes from m.arena, so repeated calls with the same T
    launch the same kernels on the same memory (what a CUDA graph captures).
    """
    if m.stack is not None:  # an architecture's own layer loop (gemma4: gpu/forward_gemma4.py)
        return m.stack(m, step, last_only, last_row)
    cfg: ModelConfig = m.cfg
    s = m.ctx.nb_stream
    a = m.arena
    D, T = cfg.n_embd, step.rows
    assert step.batch == 1 or (step.n_tokens == 1 and last_row is None), "batches: decode steps"
    ids, pos = m.ids[:T], m.pos[:T]
    x = a.get("x", (T, D))
    h = a.get("h", (T, D))
    embedding(m.w["token_embd"], ids, x, cfg.embed_scale, s)
    if m.plan.fuse_norms and (T <= GEMV_MAX_ROWS or _batch_fused(m, step)):
        return _forward_fused(m, x, step, last_only, last_row)
    lengths = m.rec.lengths if last_row is not None and m.rec is not None else None
    norm.rms_norm(x, m.blk[0].attn.norm, h, cfg.eps, s)
    hq = None  # h's int8 form, written by the residual update before (_h_int8)
    for il, (spec, lw) in enumerate(zip(m.layers, m.blk)):
        xq = None  # attention's output in int8, written by the attention kernel for attn_output
        if spec.mixer == "gated_deltanet":
            mixed = deltanet_block(m, il, lw.attn, h, pos, step, lengths=lengths)
        else:
            xq = _attn_int8(m, il, lw.attn, step)
            mixed = _attention_block(m, il, lw.attn, h, pos, step, xq=xq, xin=hq)
        o = a.get("o", (T, D))
        dense = spec.ffn not in ("moe", "moe_shared")
        ffn_q = _h_int8(m, lw.ffn.gate_up if dense else None, T)
        res = residual_update(m, x, h, lw.attn.post_norm, lw.ffn.norm, ffn_q)
        m.mm.linear(mixed, lw.attn.o, o, residual=_local(m, res), xq=xq)
        _reduced(m, o, res)
        if il + 1 < len(m.layers):
            hq = _h_int8(m, None if m.layers[il + 1].mixer == "gated_deltanet" else m.blk[il + 1].attn.qkv, T)
        else:  # the logits' rows, where they are h itself
            hq = _h_int8(m, None if m.vocab_split or last_row is not None or step.batch == 1 else m.output, T)
        res = residual_update(m, x, h, lw.ffn.post_norm, lw.next_norm, hq if dense else None)
        if not dense:
            hq = None
            moe_ffn(m, h, lw.ffn, o, res)
        else:
            dense_ffn(m, h, lw.ffn, o, residual=_local(m, res), xin=ffn_q)
            _reduced(m, o, res)
    return logits_of(m, h, step, last_only, last_row, None, hq)


def _h_int8(m, lin, n_tok: int) -> QuantX | None:
    """The buffers of h's int8 form where lin, the Linear that reads h next, takes gemv_dp4a_multi's
    x̂ (T = 2..8, one rank): the residual update before writes it (the post-norm's kernel; else a
    quantize_x after the update, the launch lin would have made); else None."""
    if lin is None or n_tok == 1 or m.tp is not None or not m.mm.takes_int8(lin, n_tok):
        return None
    return m.mm.xq_buffers(n_tok, m.cfg.n_embd, "h_xq")


def _attn_int8(m, il: int, att: Attention, step: StepPlan) -> QuantX | None:
    """The buffers where decode attention writes its output's int8 form for attn_output, when
    that GEMV is gemv_dp4a_multi at the step's T = 2..8 rows (MatMul.attn_xq's kernels; ungated:
    a gate multiplies the float output first); else None (the GEMV quantizes it itself)."""
    T = step.rows
    if T == 1 or att.q_gate is not None or not m.mm.takes_int8(att.o, T):
        return None
    return m.mm.attn_xq(att.o, step, m.cfg.window(il), _mma_one_split(m, il, step))


def _batch_fused(m, step: StepPlan) -> bool:
    """Whether a batched decode step of more than GEMV_MAX_ROWS rows takes _forward_fused too
    (tuning.BATCH_FUSED_NORMS): its GEMMs read RMSNorm(x) * w in their input's cast or int8
    quantization and add into x in their epilogue or split-K reduce (under tensor parallelism rank
    0 adds, the others write their partial sums, and x is all-reduced). Not the hybrids (their
    DeltaNet layers read a norm of the GEMV paths alone)."""
    return (step.batch > 1 and step.n_tokens == 1 and m.tuning.batch_fused_norms
            and all(spec.mixer == "attention" for spec in m.layers))


def _forward_fused(m, x, step: StepPlan, last_only: bool, last_row):
    """forward's decode with the norms fused into the GEMVs (LoadPlan.fuse_norms), or into a
    batch's GEMMs (_batch_fused), the routed experts of a batch past GEMV_MAX_ROWS rows grouped
    by expert as at prefill."""
    cfg, eps, T = m.cfg, m.cfg.eps, step.rows
    spare = m.arena.get("x_spare", x.shape) if m.router_folds else None  # the fold's out-of-place residual
    xin = None  # this layer's Q|K|V input in int8, where the layer before wrote it
    x32 = None  # or in gemm_mmq's int8 form (moe.NextX32)
    for il, (spec, lw) in enumerate(zip(m.layers, m.blk)):
        grouped = _grouped_decode(m, spec, lw.ffn, T)
        nxt = None if grouped else _next_input(m, il, T)
        if spec.mixer == "gated_deltanet":
            y = deltanet_block(m, il, lw.attn, x, m.pos[:T], step, (lw.attn.norm, eps))
            m.mm.linear(y, lw.attn.o, x, accumulate=m.reduce_leader)
            m.all_reduce(x)
        else:
            # attention writes its output in int8 there too (not where a gate multiplies it first)
            xq = m.mm.attn_xq(lw.attn.o, step, m.cfg.window(il), _mma_one_split(m, il, step)) \
                if lw.attn.q_gate is None else None
            attn = _attention_block(m, il, lw.attn, x, m.pos[:T], step, (lw.attn.norm, eps), xq, xin, x32)
            if xq is not None and spec.ffn == "moe" and lw.ffn.fold is not None and not grouped:
                attn_output_moe_decode(m, attn, xq, x, spare, lw.attn.o, lw.ffn, (lw.ffn.norm, eps), nxt)  # one launch
                x, spare = spare, x
                xin = nxt and nxt.xq
                continue
            m.mm.linear(attn, lw.attn.o, x, accumulate=m.reduce_leader, xq=xq)
            m.all_reduce(x)
        x32 = None
        if spec.ffn in ("moe", "moe_shared") and (grouped or T > GEMV_MAX_ROWS):
            x32 = moe_ffn_grouped_decode(m, x, lw.ffn, (lw.ffn.norm, eps), _next_x32(m, il, T))
        elif spec.ffn in ("moe", "moe_shared"):
            moe_ffn_decode(m, x, lw.ffn, (lw.ffn.norm, eps), nxt)
        else:
            dense_ffn(m, x, lw.ffn, x, (lw.ffn.norm, eps), accumulate=m.reduce_leader,
                      glu_reduce=T > GEMV_MAX_ROWS and m.tuning.batch_glu_reduce)
            m.all_reduce(x)
        xin = nxt and nxt.xq
    return logits_of(m, x, step, last_only, last_row, (m.blk[-1].next_norm, eps))


def _grouped_decode(m, spec, ffn, T: int) -> bool:
    """Whether a decode step of T rows runs this layer's routed experts grouped by expert
    (moe_ffn_grouped_decode, tuning.MOE_GROUPED_MIN_ROWS..MOE_GROUPED_ROWS): a batch, a plain
    qwen3moe layer, and moe_table's int8 grouped paths for its experts at T."""
    lo = max(2, m.tuning.moe_grouped_min_rows)
    if not (spec.ffn == "moe" and lo <= T <= m.tuning.moe_grouped_rows and ffn.gate_up is not None):
        return False
    E = m.expert_range[1] if m.expert_range is not None else m.cfg.n_expert
    return moe_dispatch.ffn_paths((ffn.gate_up, ffn.down), E, T)[0] in moe_dispatch.INT8_PATHS


def _next_x32(m, il: int, T: int):
    """moe.NextX32 where a batch's grouped MoE layer il may end in moe_combine_next, writing layer
    il + 1's Q|K|V input, RMSNorm(x) * its norm, in gemm_mmq's int8 form (tuning.COMBINE_NEXT):
    that layer's Q|K|V (or Q|K and V) on gemm_mmq at T rows, one rank; with a V of its own on
    the dp4a GEMV (tuning.COMBINE_NEXT_V) V's input in quant_x's form too; else None."""
    if not m.tuning.combine_next or m.tp is not None or il + 1 >= len(m.layers):
        return None
    nxt, spec = m.blk[il + 1].attn, m.layers[il + 1]
    if spec.mixer != "attention" or nxt.q_gate is not None:
        return None
    if nxt.qkv is not None:
        lin, v = nxt.qkv, None
    elif nxt.qk is not None:
        lin, v = nxt.qk, nxt.v
    else:
        return None
    if not m.mm.takes_x32(lin, T, v):
        return None
    vq = None
    if v is not None and m.tuning.combine_next_v and m.mm.pair_takes_xq(lin, v, T):
        vq = m.mm.xq_buffers(T, v.w.cols, "next_vq")
    return NextX32((nxt.norm, m.cfg.eps), m.mm.x32_buffers(T, lin.w.cols), vq)


def _next_input(m, il: int, T: int):
    """gemv_moe_dp4a.NextInput where layer il's routed experts' down (on dp4a, no shared expert
    after it, one rank) may write layer il + 1's Q|K|V input, RMSNorm(x) * its norm, in int8 for
    that stacked dp4a GEMV (DOWN_QUANT_TAIL), else None."""
    if not m.tuning.down_quant_tail or m.tp is not None or il + 1 >= len(m.layers):
        return None
    ffn, nxt, spec = m.blk[il].ffn, m.blk[il + 1].attn, m.layers[il + 1]
    if (m.layers[il].ffn != "moe" or not getattr(ffn, "down_dp4a", False) or ffn.shared is not None
            or spec.mixer == "gated_deltanet" or nxt.qkv is None or nxt.q_gate is not None
            or not m.mm.takes_int8(nxt.qkv, T)):
        return None
    D = m.cfg.n_embd
    return NextInput(nxt.norm, m.cfg.eps, m.mm.xq_buffers(T, D, "next_xq"),
                     m.arena.zeros("next_xq_counter", (1,), np.uint32))


def _attention_block(m, il: int, att: Attention, h, pos, step: StepPlan, norm_w=None, xq=None, xin=None,
                     x32: NextX32 | None = None):
    """Q|K|V of h (norm_w: of RMSNorm(h) * w), QK-norm, RoPE, the KV write and attention -> (R, H * Dv),
    times sigmoid(h · q_gateᵀ) for a gated attention; xq (model.attn_xq): the decode kernel (short,
    or a batch's mma in one split) writes the output's int8 form there too (ungated only); xin: the
    stacked Q|K|V's input in int8, written by the layer before (_next_input); x32: Q|K|V's (or Q|K and
    V's) input in gemm_mmq's int8 form (and V's in quant_x's), written by the layer before
    (_next_x32)."""
    cfg, a, s = m.cfg, m.arena, m.ctx.nb_stream
    H, Hkv, Dh, Dv = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
    T, B = step.rows, step.batch
    qkv, joint = m.mm.stacked_outputs("qkv_out", T, (H * Dh, Hkv * Dh, Hkv * Dv))
    q, k, v = qkv[0].reshape(T, H, Dh), qkv[1].reshape(T, Hkv, Dh), qkv[2].reshape(T, Hkv, Dv)
    fused = _mma_post(m, il, step)  # qkv_post inside attention_decode_mma
    parts = None  # (split-K partials the attention kernel adds up, whether V's are among them)
    keep = fused and m.tuning.batch_mma_post_parts
    if att.qkv is not None:
        part = m.mm.split(h, att.qkv, qkv, norm_w, joint, xin, keep_parts=keep, x32=x32 and x32.x32)
        parts = None if part is None else (part, True)
    elif att.qk is not None:
        parts = m.mm.pair(h, att.qk, qkv[:2], att.v, qkv[2], norm_w, att.pair, keep_parts=keep,
                          x32=x32 and x32.x32, xq_b=x32 and x32.vq)
    else:
        for lin, y in zip((att.q, att.k, att.v), qkv):
            m.mm.linear(h, lin, y, norm_w)
    gate = None
    if att.q_gate is not None:
        assert xq is None and Dv == Dh, "the gate multiplies attention's float output, a gate a column"
        gate = a.get("q_gate", (T, H * Dh))
        m.mm.linear(h, att.q_gate, gate, norm_w)
    qk_norm = (att.q_norm, att.k_norm)
    attn = a.get("attn", (T, H, Dv))
    tables = m.kv.tables_of(il)[:B]
    short = step.short_for(cfg.window(il))
    if step.n_tokens <= attention_decode.MAX_T and short and m.plan.decode_post:  # qkv_post fused in
        attention_decode_short(_seqs(q, B), m.kv.k[il], m.kv.v[il], tables, _seqs(pos, B), _seqs(attn, B),
                               cfg.attn_scale, cfg.window(il), None, s,
                               post=(_seqs(k, B), _seqs(v, B), m.inv_freq[il], cfg.rope_neox, *qk_norm, cfg.eps),
                               splits=short, xq=xq)
    elif fused:
        post = attention_decode_mma.Post(_seqs(k, B), _seqs(v, B), m.inv_freq[il], cfg.rope_neox, *qk_norm, cfg.eps,
                                         *(parts or ()))
        _attend_mma(m, il, q, pos, attn, step, xq, post)
    else:
        qkv_post.qkv_post(q, k, v, pos, m.inv_freq[il], cfg.rope_neox, *qk_norm, cfg.eps,
                          tables, m.kv.k[il], m.kv.v[il], s)
        attend(m, il, q, pos, attn, step, xq)
    if gate is not None:
        sigmoid_gate(attn.reshape(T, H * Dv), gate, s)
    return attn.reshape(T, H * Dv)


def _seqs(a, B: int):
    """Rows (R, ...) of B sequences as (B, R / B, ...) (the attention kernels' layout)."""
    return a.reshape(B, a.shape[0] // B, *a.shape[1:])


def logits_of(m, h, step: StepPlan, last_only: bool, last_row, norm_w, xq: QuantX | None = None):
    """Logits of h's rows (all; the last, which in a batch of one row a sequence is all; or row
    last_row); norm_w: of RMSNorm(h) * w; xq: h's int8 form, already written (all its rows)."""
    a, rows, T = m.arena, h, step.rows
    if last_row is not None:
        rows = a.get("h_last", (1, h.shape[1]))
        gather_row(h, last_row, rows, m.ctx.nb_stream)
    elif last_only and step.batch == 1:
        rows = h[T - 1:T]
    logits = a.get("logits", (rows.shape[0], m.cfg.n_vocab))
    if not m.vocab_split:
        assert xq is None or rows is h
        m.mm.linear(rows, m.output, logits, norm_w, xq=xq)
        return logits
    R, N, V = rows.shape[0], m.tp.world, m.cfg.n_vocab
    part = a.get("logits_part", (R, V // N))  # this rank's slice of the vocabulary
    m.mm.linear(rows, m.output, part, norm_w)
    if R == 1:  # rank after rank is the row itself
        m.tp.all_gather(part, logits)
        return logits
    parts = a.get("logits_parts", (N, R, V // N))  # (N, R, V / N): teacher-forced rows, eager only
    m.tp.all_gather(part, parts)
    for r in range(R):
        for n in range(N):
            logits[r, n * (V // N):(n + 1) * (V // N)].copy_to_device(parts[n, r], stream=m.ctx.nb_stream)
    return logits


def dense_ffn(m, h, ffn: DenseFFN, o, norm_w=None, accumulate: bool = False, residual: Residual | None = None,
              glu_reduce: bool = False, xin: QuantX | None = None):
    """o (T, D) = down(act(gate(h)) * up(h)), or o += that with accumulate; gate|up as one GEMV
    where stacked; norm_w: of RMSNorm(h) * w; residual: applied to o (gemv_tail.Residual);
    glu_reduce (a batch's GEMMs, tuning.BATCH_GLU_REDUCE): the stacked gate|up's split-K reduce,
    activation and the down's cast or quantization in one launch (MatMul.glu's down); xin: h's
    int8 form, already written, for the stacked gate|up (MatMul.glu's)."""
    cfg, a, T = m.cfg, m.arena, h.shape[0]
    F = ffn.down.w.cols  # the layer's width (gemma4's differ by layer)
    gate = a.get("gate", (T, F))
    ready = None
    if ffn.gate_up is not None:
        ready = m.mm.glu(h, ffn.gate_up, cfg.act, gate, norm_w, ffn.down if glu_reduce else None, xin=xin)
    else:
        assert xin is None, "h's int8 form: for a stacked gate|up"
        up = a.get("up", (T, F))
        m.mm.linear(h, ffn.gate, gate, norm_w)
        m.mm.linear(h, ffn.up, up, norm_w)
        (activations.geglu if cfg.act == "gelu" else activations.swiglu)(gate, up, gate, m.ctx.nb_stream)
    m.mm.linear(gate, ffn.down, o, accumulate=accumulate, residual=residual, ready=ready)


def _local(m, res: Residual) -> Residual | None:
    """The residual update a linear may apply itself: none under tensor parallelism, where its
    output is a partial sum until all-reduced (_reduced applies it then)."""
    return res if m.tp is None else None


def _reduced(m, o, res: Residual) -> None:
    """Under tensor parallelism: o = its sum over the ranks, then the residual update on it."""
    if m.tp is not None:
        m.all_reduce(o)
        res.unfused(o, m.ctx.nb_stream)


def residual_update(m, x, h, post_norm, next_norm, hq: QuantX | None = None) -> Residual:
    """x += o (with a post_norm weight: x += post_norm(o)), then h = next_norm(x): for the o of a
    linear (its GEMV's tail at decode, else a norm kernel after it) or Residual.unfused; hq: h's
    int8 form written too (MatMul.linear)."""
    return Residual(x, h, next_norm, post_norm, m.cfg.eps, m.arena.zeros("tail_counter", (1,), np.uint32), hq)


def attend(m, il: int, q, pos, out, step: StepPlan, xq=None):
    """Attention of q (R, H, D) at pos over layer il's cache -> out (R, H, D), on the kernel the
    step plan says (decode: short or split-K, a batch's split-K on tensor cores where the plan has
    them, or attention_wide at heads past theirs; prefill:
    wgmma or FA2); xq as in _attention_block."""
    cfg, s, T, B = m.cfg, m.ctx.nb_stream, step.n_tokens, step.batch
    window = cfg.window(il)
    tables = m.kv.tables_of(il)[:B]
    D = q.shape[2]
    if B == 1 and T == 1 and xq is None and D in m.tuning.decode_tc and D in attention_fa2_decode.DECODE_HEAD_DIMS:
        Hkv = m.kv.k[il].shape[2]
        splits = attention_fa2_decode.decode_splits(min(step.ctx_bucket, window) if window else step.ctx_bucket,
                                                    Hkv, D, gemv_stream.sm_count())
        partials = m.arena.get("partials_tc", attention_wide.partials_shape(attention_wide.MAX_SPLITS, 1, cfg.n_head, D))
        attention_fa2_decode.attention_fa2_decode(q, m.kv.k[il], m.kv.v[il], m.kv.block_table_of(il), pos, out,
                                                  partials, splits, cfg.attn_scale, window, None, s)
        return
    if q.shape[2] in attention_wide.HEAD_DIMS:  # past the decode kernels' head dims (gemma4's 512)
        assert B == 1 and xq is None, "wide heads: one sequence, no int8 output"
        if T <= attention_decode.MAX_T:
            _attention_wide(m, il, q, pos, out, step, window)
            return
    short = step.short_for(window)
    assert xq is None or (T <= attention_decode.MAX_T and short) or _mma_one_split(m, il, step), \
        "xq: the short kernel's, or attention_decode_mma's in one split"
    if T <= attention_decode.MAX_T and short:
        attention_decode_short(_seqs(q, B), m.kv.k[il], m.kv.v[il], tables, _seqs(pos, B), _seqs(out, B),
                               cfg.attn_scale, window, None, s, splits=short, xq=xq)
    elif step.split_on_mma(window) and attention_decode_mma.supports(D, cfg.n_head, cfg.n_head_kv):
        _attend_mma(m, il, q, pos, out, step, xq)
    elif T <= attention_decode.MAX_T and step.splits:
        # one sequence: sized for any step's splits (one buffer for every graph); a batch: its own
        partials = m.arena.get("partials", attention_decode.partials_shape(
            B, m.plan.max_decode_splits if B == 1 else step.splits, T, cfg.n_head, q.shape[2]))
        counters = m.arena.zeros("counters", attention_decode.counters_shape(B, T, cfg.n_head), np.int32)
        attention_decode.attention_decode(_seqs(q, B), m.kv.k[il], m.kv.v[il], tables, _seqs(pos, B),
                                          _seqs(out, B), partials, counters, step.splits,
                                          cfg.attn_scale, window, None, s)
    elif attention_dispatch.use_wgmma(q.shape[2], tuple(m.ctx.device.compute_capability)):
        attention_wgmma.attention_wgmma(q, m.kv.k[il], m.kv.v[il], m.kv.block_table_of(il), pos, out,
                                        cfg.attn_scale, window, None, s)
    else:
        attention_fa2.attention_fa2(q, m.kv.k[il], m.kv.v[il], m.kv.block_table_of(il), pos, out,
                                    cfg.attn_scale, window, None, s)


def _attend_mma(m, il: int, q, pos, out, step: StepPlan, xq=None, post=None) -> None:
    """attend's batch on attention_decode_mma (post: attention_decode_mma.Post, qkv_post in front)."""
    cfg, B, D = m.cfg, step.batch, q.shape[2]
    splits, stages, warps = _mma_plan(m, il, step, D)
    partials = m.arena.get("partials_mma", attention_decode_mma.partials_shape(splits, B, cfg.n_head, D))
    attention_decode_mma.attention_decode_mma(_seqs(q, B), m.kv.k[il], m.kv.v[il], m.kv.tables_of(il)[:B],
                                              _seqs(pos, B), _seqs(out, B), partials, splits, cfg.attn_scale,
                                              cfg.window(il), None, m.ctx.nb_stream, stages=stages, xq=xq,
                                              warps=warps, post=post)


def _mma_post(m, il: int, step: StepPlan) -> bool:
    """Whether a batch's decode step runs layer il's qkv_post in front of attention_decode_mma
    (tuning.BATCH_MMA_POST): where attend would take that kernel for one token a sequence."""
    cfg, window = m.cfg, m.cfg.window(il)
    D = cfg.head_dim
    return (m.tuning.batch_mma_post and step.batch > 1 and step.n_tokens == 1
            and not (step.n_tokens <= attention_decode.MAX_T and step.short_for(window))
            and step.split_on_mma(window) and D == cfg.head_dim_v and D not in attention_wide.HEAD_DIMS
            and attention_decode_mma.supports(D, cfg.n_head, cfg.n_head_kv))


def _mma_plan(m, il: int, step: StepPlan, D: int) -> tuple:
    """(splits, each warp's ring depth or None, warps a block) of attention_decode_mma for layer il at
    this step."""
    Hkv, n_sm = m.kv.k[il].shape[2], gemv_stream.sm_count()
    splits = attention_decode_mma.num_splits(step.ctx_bucket, Hkv, step.batch, m.cfg.window(il), n_sm)
    if not m.tuning.batch_mma_deep_ring:
        return splits, None, attention_decode_mma.WARPS
    stages, warps = attention_decode_mma.ring_plan(D, splits * Hkv * step.batch, n_sm, m.tuning.batch_mma_warps)
    return splits, stages, warps


def _mma_one_split(m, il: int, step: StepPlan) -> bool:
    """Whether a batch's decode step runs layer il's attention on attention_decode_mma in one split,
    which can write its output's int8 form for attn_output too (attend's choice of kernel; one
    sequence keeps its own kernels)."""
    cfg, window = m.cfg, m.cfg.window(il)
    D = cfg.head_dim
    return (step.batch > 1 and step.n_tokens == 1 and step.split_on_mma(window) and D == cfg.head_dim_v
            and D not in attention_wide.HEAD_DIMS and attention_decode_mma.supports(D, cfg.n_head, cfg.n_head_kv)
            and _mma_plan(m, il, step, D)[0] == 1)


def _attention_wide(m, il: int, q, pos, out, step: StepPlan, window) -> None:
    """attend's decode steps on attention_wide, split over the context bucket's keys (prompt chunks
    of more rows run on FA2, in output-dim slices)."""
    T, H, D = q.shape
    Hkv = m.kv.k[il].shape[2]
    splits = attention_wide.num_splits(step.ctx_bucket, Hkv, T, window)
    partials = m.arena.get("partials_wide", attention_wide.partials_shape(attention_wide.MAX_SPLITS, T, H, D))
    attention_wide.attention_wide(q, m.kv.k[il], m.kv.v[il], m.kv.block_table_of(il), pos, out, partials, splits,
                                  m.cfg.attn_scale, window, m.ctx.nb_stream, m.tuning.wide_tiled)
