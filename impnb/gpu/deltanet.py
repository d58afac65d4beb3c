"""The Gated DeltaNet mixer of a Qwen3.5 layer on the GPU (reference: models/deltanet.py's
gated_deltanet_block), its states in the model's RecurrentState (gpu/recurrent.py):

  qkv, z = h · [attn_qkv | attn_gate]ᵀ; b, a = h · [ssm_beta | ssm_alpha]ᵀ  (stacked GEMVs / GEMMs)
  qkv = silu(conv1d(qkv)) with the layer's conv state, in place    (kernels/deltanet/conv1d.py;
      at one row a sequence inside gdn_decode's kernel)
  y = gated_norm(delta_rule(q, k, v, b, a), z) on the layer's state (gdn_decode.py at one row a
      sequence; over a prompt chunk gdn_prefill.py token by token, or gdn_chunked.py on the tensor
      cores from tuning's GDN_CHUNKED_MIN_ROWS rows)
The caller runs ssm_out on y into the residual. Padded rows of a prompt chunk (past `lengths`) and
padded sequences leave the states alone; the kernels read and write each sequence's slot pair by
the rows' positions (gpu/recurrent.py).
Legend: R rows (B sequences of T), C conv channels, Hv V heads, dv V head dim.
"""

import numpy as np

from impnb.gpu.layer_weights import DeltaNet
from impnb.gpu.plan import StepPlan
from impnb.kernels.deltanet.conv1d import conv1d
from impnb.kernels.deltanet.gdn_chunk_prep import work_shape
from impnb.kernels.deltanet.gdn_chunked import gdn_chunked
from impnb.kernels.deltanet.gdn_decode import gdn_decode
from impnb.kernels.deltanet.gdn_prefill import gdn_prefill
from impnb.models.deltanet import CHUNK


def deltanet_block(m, il: int, dn: DeltaNet, h, pos, step: StepPlan, norm_w: tuple | None = None,
                   lengths=None):
    """Layer il's Gated DeltaNet of h (R, D) at positions pos (R,) (norm_w (w, eps): of
    RMSNorm(h) * w) -> y (R, Hv dv), ssm_out's input; lengths (1,) int32 on the device: a padded
    chunk's real rows (None: all)."""
    cfg, a, s = m.cfg, m.arena, m.ctx.nb_stream
    d = cfg.deltanet
    R, B = step.rows, step.batch
    Hv, V = d.n_v_heads, d.n_v_heads * d.head_v_dim
    (qkv, z), joint = m.mm.stacked_outputs("ssm_qkvz", R, (d.conv_channels, V))
    (beta, alpha), joint_ba = m.mm.stacked_outputs("ssm_beta_alpha", R, (Hv, Hv))
    _project(m, h, dn.qkvz, (dn.qkv, dn.z), (qkv, z), norm_w, joint)
    _project(m, h, dn.beta_alpha, (dn.beta, dn.alpha), (beta, alpha), norm_w, joint_ba)
    rec, slots = m.rec, m.rec.slots[:B]
    assert lengths is None or B == 1, "padded chunks: one sequence"
    y = a.get("ssm_y", (R, V))
    if step.n_tokens == 1:  # the conv inside the delta rule's kernel
        gdn_decode(qkv, z, beta, alpha, dn.ssm_a, dn.dt_bias, dn.ssm_norm, cfg.eps, rec.ssm[il], slots,
                   d.n_k_heads, d.v_tiled, y, s, pos, conv=(dn.conv_w, rec.conv[il]))
    else:
        conv1d(qkv, dn.conv_w, rec.conv[il], slots, qkv, s, lengths, pos)
        chunked = 0 < m.tuning.gdn_chunked_min_rows <= step.n_tokens and d.head_k_dim % 16 == 0
        args = (qkv, z, beta, alpha, dn.ssm_a, dn.dt_bias, dn.ssm_norm, cfg.eps, rec.ssm[il], slots,
                d.n_k_heads, d.v_tiled, y, s, lengths, pos)
        if chunked:  # its workspace: the chunks' state-independent matrices (gdn_chunk_prep.py)
            words, floats = work_shape(B, R // B, Hv, d.head_k_dim, d.head_v_dim, CHUNK)
            gdn_chunked(*args, work=(a.get("gdn_work", (words,), np.uint32), a.get("gdn_work_f", (floats,))))
        else:
            gdn_prefill(*args)
    return y


def _project(m, h, stacked, apart, ys, norm_w, joint) -> None:
    """ys = h · Wᵀ of the stacked Linear (one GEMV or GEMM split into ys; joint: MatMul.split's),
    else of each apart."""
    if stacked is not None:
        m.mm.split(h, stacked, ys, norm_w, joint)
        return
    for lin, y in zip(apart, ys):
        m.mm.linear(h, lin, y, norm_w)
