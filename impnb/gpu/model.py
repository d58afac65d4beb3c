"""A model resident on the GPU for one sequence: its weights and Linears (gpu/weights.py), the
paged KV cache (gpu/kv.py), a hybrid's recurrent state (gpu/recurrent.py), RoPE tables, input
buffers, and the plan made at load (gpu/plan.py).

Weights stay in their GGUF type (kernel layout from impnb/kernels/common/repack.py); 1-D norm
weights are float32. gpu/linear.py runs the Linears; gpu/forward.py runs the layer graph.
"""

import numpy as np

from impnb.cuda_support import GPU_ARCHS
from impnb.errors import UnsupportedError
from impnb.gguf_file import ModelFile
from impnb.gpu import weights
from impnb.gpu.buffers import Arena
from impnb.gpu.context import GpuContext
from impnb.gpu import forward_gemma4
from impnb.gpu.forward import FFNS, MIXERS
from impnb.gpu.cublas_gemm import Cublas
from impnb.gpu.kv import PagedKV
from impnb.gpu.layer_weights import layer_weights
from impnb.gpu.layer_weights_gemma4 import gemma4_layers
from impnb.gpu.linear import MatMul
from impnb.gpu.plan import LoadPlan
from impnb.gpu.recurrent import RecurrentState
from impnb.kernels.attention.rope import rope_inv_freq
from impnb.kernels.moe.moe import check_experts
from impnb.models import architecture
from impnb.models.validate import validate_model
from impnb.parallel.shard import RankFile, rank_config, splits_vocab
from impnb.tuning import Overrides, prefill_chunk

HEADROOM = 64 << 20  # bytes kept free past the weights and cache: cuBLAS workspace, scratch


class DeviceModel:
    """Everything one sequence needs on the device, allocated at load.

    layers: a LayerSpec a layer; w: tensors by GGUF name less ".weight" (stacked ones by
    weights.STACKS' names); lin: the Linear of every matrix in w; router_folds: router_fold's
    weights by layer prefix; blk: each layer's weights by role (gpu/layer_weights.py); kv: the
    paged cache; rec: the Gated DeltaNet layers' states (None without such layers); inv_freq:
    RoPE's per layer; ids, pos: a step's inputs (chunk rows, or max_seqs if more); chunk: the
    prompt tokens a forward call takes at most (tuning.prefill_chunk, or the caller's `chunk`);
    mm: the Linears' launches; plan: the load-time choices.

    kv_tokens: the KV pools' size in tokens (default n_ctx: one sequence's whole context);
    max_seqs: the sequences a step may take (the rows of kv.tables); window_ring: one sequence
    owns the pages in position order (CudaEngine), so its sliding-window layers may keep only
    their window's (WINDOW_RING; not under a block manager's pages).

    tp: the tensor-parallel group (impnb/parallel/group.TensorParallel) this rank runs in, or
    None: the rank then holds its slices of the weights (parallel/shard.py), cfg has its head and
    FFN counts (full_cfg the model's), and forward all-reduces the outputs of attn_output and
    ffn_down (all_reduce) on the model's stream; with vocab_split the logits' Linear holds the
    rank's slice of the vocabulary and forward all-gathers the logits.
    """

    def __init__(self, mf: ModelFile, n_ctx: int, ctx: GpuContext | None = None,
                 kv_tokens: int | None = None, max_seqs: int = 1, tp=None, window_ring: bool = False,
                 chunk: int | None = None):
        arch = architecture(mf)
        if mf.arch not in GPU_ARCHS:  # before validation, whose GPU shape checks would say less
            raise UnsupportedError(f"architecture {mf.arch} has no GPU path yet "
                                   f"(GPU: {', '.join(GPU_ARCHS)}); use --device cpu")
        self.full_cfg = cfg = validate_model(mf, n_ctx, device="cuda")
        self.tp = tp
        # output: the rank's V / N rows (one sequence: a step's logits are one row, gathered as it is)
        self.vocab_split = tp is not None and max_seqs == 1 and splits_vocab(cfg, tp.world)
        self.expert_range = None  # (first, count) of the rank's experts where split by whole experts
        if tp is not None:  # this rank's slices and counts
            mf = RankFile(mf, cfg, tp.world, tp.rank, self.vocab_split)
            cfg = rank_config(cfg, tp.world, mf.expert_split)
            self.expert_range = mf.expert_range
        self.cfg = cfg
        self.layers = arch.layers(cfg)  # what each layer computes (models/layers.LayerSpec)
        # an architecture with a layer loop of its own (gemma4), else None: gpu/forward.py's
        self.stack = forward_gemma4.forward if self.layers[0].mixer == forward_gemma4.MIXER else None
        if self.stack is None:
            _check_specs(cfg, self.layers)
        if cfg.n_expert:
            check_experts(cfg, own_loop=self.stack is not None)
        if cfg.deltanet is not None:
            check_deltanet(cfg)
        self.ctx = ctx or GpuContext()
        self.n_ctx = n_ctx
        self.tuning = tuning = Overrides.from_env()  # the environment's A/B overrides, read once
        kv_tokens = kv_tokens or n_ctx
        window_ring = window_ring and tuning.window_ring and max_seqs == 1
        self.chunk = chunk or prefill_chunk(cfg)
        need = (sum(t.data.nbytes for t in mf.tensors.values())
                + PagedKV.nbytes(cfg, kv_tokens, max_seqs, window_ring, self.chunk)
                + RecurrentState.nbytes(cfg, max_seqs)
                + (weights.fold_bytes(cfg, tuning) if self.stack is None else 0) + HEADROOM)
        self.ctx.check_fits(need, "the weights and KV cache")
        self.w = weights.upload(mf, cfg, self.ctx, tuning)
        self.lin = weights.linears(self.w, tuning)
        # the router folded into attn_output's launch: gpu/forward.py's MoE layers only, and not
        # under tensor parallelism (the fold routes on attn_output's partial sums)
        self.router_folds = ({} if self.stack or tp else
                             weights.router_folds(mf, cfg, self.ctx, self.lin, tuning))
        self.blk = (gemma4_layers(cfg, self.w, self.lin, self.ctx, tuning) if self.stack is not None
                    else layer_weights(cfg, self.layers, self.w, self.lin, self.router_folds, tuning))
        self.output = self.lin.get("output") or self.lin["token_embd"]  # the logits' Linear (tied or not)
        self.inv_freq = [self.ctx.upload(_inv_freq(mf, cfg, il)) for il in range(cfg.n_layer)]
        self.kv = PagedKV(self.ctx, cfg, PagedKV.pages(kv_tokens), max_seqs, PagedKV.pages(n_ctx), window_ring,
                          self.chunk)
        self.rec = RecurrentState(self.ctx, cfg, max_seqs) if cfg.deltanet is not None else None
        self.plan = LoadPlan.make(cfg, n_ctx, tuning, self.layers)
        self.ids = self.ctx.empty(max(self.chunk, max_seqs), np.int32)
        self.pos = self.ctx.empty(max(self.chunk, max_seqs), np.int32)
        self.arena = Arena(self.ctx)
        self.cublas = None if self.ctx.simulator else Cublas(self.ctx)
        self.mm = MatMul(self.ctx, self.arena, self.cublas, tuning)
        # fp16 copies for cuBLAS kept (bytes; room: what is free past the headroom and a batch's scratch)
        self.w16_bytes = (0 if self.cublas is None else
                          self.mm.keep_w16(self.lin.values(), self.ctx.mem_free()[0] - 4 * HEADROOM))

    def all_reduce(self, buf) -> None:
        """buf = its sum over the tensor-parallel ranks (in place, on the model's stream); nothing
        without tensor parallelism."""
        if self.tp is not None:
            self.tp.all_reduce(buf)

    @property
    def reduce_leader(self) -> bool:
        """Whether this rank's partial sums add into the residual (rank 0, or no tensor
        parallelism); the other ranks write theirs in its place before the all-reduce."""
        return self.tp is None or self.tp.leader

    def dp4a_linears(self) -> list:
        """The names of the Linears whose decode GEMVs take gemv_dp4a (for logs and tests)."""
        return sorted(name for name, lin in self.lin.items() if lin.dp4a)


def check_deltanet(cfg) -> None:
    """UnsupportedError unless the Gated DeltaNet kernels take cfg's shapes."""
    from impnb.kernels.deltanet import conv1d, gdn_step  # the hybrids' kernels load for a hybrid alone

    d = cfg.deltanet
    if (d.conv_kernel != conv1d.WIDTH or d.head_k_dim > gdn_step.MAX_DK or d.head_k_dim % gdn_step.ROW_GROUPS
            or d.head_v_dim > gdn_step.MAX_DV or d.head_v_dim % 32):
        raise UnsupportedError(f"{cfg.arch}: Gated DeltaNet with conv kernel {d.conv_kernel}, head dims "
                               f"{d.head_k_dim} (K) / {d.head_v_dim} (V) has no GPU kernel (conv {conv1d.WIDTH}, "
                               f"K dim a multiple of {gdn_step.ROW_GROUPS} up to {gdn_step.MAX_DK}, V dim a "
                               f"multiple of 32 up to {gdn_step.MAX_DV}); use --device cpu")


def _check_specs(cfg, layers) -> None:
    """UnsupportedError where gpu/forward.py's loop has no path for a layer."""
    unknown = {(s.mixer, s.ffn) for s in layers} - {(mx, f) for mx in MIXERS for f in FFNS}
    if unknown:
        raise UnsupportedError(f"architecture {cfg.arch}: layers of {sorted(unknown)} have no GPU path")
    if any(s.after or s.ffn_norm is None for s in layers):
        raise UnsupportedError(f"architecture {cfg.arch}: layer steps after the FFN or an FFN "
                               f"without its input norm have no GPU path")


def _inv_freq(mf: ModelFile, cfg, il: int) -> np.ndarray:
    """Layer il's RoPE table (rope_inv_freq): its rotary width and base, divided by the file's
    `rope_freqs` factors where the layer takes them (gemma4's global layers)."""
    factors = mf.tensors.get("rope_freqs.weight")
    factors = factors.dequantize() if factors is not None and cfg.rope_factors_at(il) else None
    return rope_inv_freq(cfg.n_rot_for(il), cfg.rope_base_for(il), factors)
