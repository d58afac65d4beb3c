"""Each rank's slices of the model (vLLM's layout), cut from the memory-mapped GGUF before upload.

  attn_q, attn_k, attn_v   rows by heads: rank r holds query heads [r H/N, (r+1) H/N) and the KV
                           heads they read (KV heads replicated where there are fewer than ranks)
  attn_output              columns by the same query heads; the partial sums are all-reduced
  ffn_gate, ffn_up         rows [r F/N, (r+1) F/N);   ffn_down: those columns, then all-reduced
  *_exps, *_shexp          the same per expert (experts split by width; the router replicated),
                           or, where the experts' width does not split on blocks, whole experts
                           [r E/N, (r+1) E/N) a rank (expert parallelism, expert_split)
  output                   rows by vocabulary [r V/N, (r+1) V/N) where V splits evenly (else
                           replicated); the logits are all-gathered
  anything else            replicated (norms, token_embd, the router)
A row slice is a view of the mmap; a column slice copies only the rank's part, and must fall on
the type's block boundary (else UnsupportedError). Legend: N ranks, H / Hkv heads, F FFN width.
"""

import dataclasses

import numpy as np

from impnb.errors import UnsupportedError
from impnb.gguf_file import Tensor
from impnb.models.config import ModelConfig

COLUMN_GROUP = 32  # the GPU kernels read a row in groups of 32 columns (kernels/common/repack.py)
# GGUF name suffix (after "blk.N.", less ".weight"): (axis cut, what the cut indexes)
SPLITS = {
    "attn_q": ("rows", "q"), "attn_k": ("rows", "k"), "attn_v": ("rows", "v"),
    "attn_output": ("cols", "o"),
    "ffn_gate": ("rows", "ff"), "ffn_up": ("rows", "ff"), "ffn_down": ("cols", "ff"),
    "ffn_gate_exps": ("rows", "ff_exp"), "ffn_up_exps": ("rows", "ff_exp"), "ffn_down_exps": ("cols", "ff_exp"),
    "ffn_gate_shexp": ("rows", "ff_shexp"), "ffn_up_shexp": ("rows", "ff_shexp"),
    "ffn_down_shexp": ("cols", "ff_shexp"),
}


@dataclasses.dataclass(frozen=True)
class Heads:
    """One rank's attention heads: query heads [q0, q0 + n_head), KV heads [kv0, kv0 + n_head_kv)."""

    q0: int
    n_head: int
    kv0: int
    n_head_kv: int


def heads(cfg: ModelConfig, world: int, rank: int) -> Heads:
    """rank's heads; UnsupportedError where the heads do not split over world ranks."""
    H, Hkv = cfg.n_head, cfg.n_head_kv
    if H % world:
        raise UnsupportedError(f"--tp {world}: {H} attention heads do not split evenly over {world} GPUs")
    if Hkv % world and world % Hkv:
        raise UnsupportedError(f"--tp {world}: {Hkv} KV heads neither split over {world} GPUs nor "
                               f"divide them (to be replicated)")
    h = H // world
    if Hkv >= world:
        return Heads(rank * h, h, rank * (Hkv // world), Hkv // world)
    return Heads(rank * h, h, rank * Hkv // world, 1)  # each rank's query heads share one KV head


def expert_split(tensors: dict, cfg: ModelConfig, world: int) -> str | None:
    """How the routed experts split over world ranks: "width" (each expert's FFN width, where
    every rank's columns of ffn_down_exps are whole blocks and column groups), else "experts"
    (whole experts a rank); None without experts."""
    if not cfg.n_expert:
        return None
    width = cfg.n_ff_exp // world
    downs = [t for name, t in tensors.items() if name.endswith(".ffn_down_exps.weight")]
    if cfg.n_ff_exp % world == 0 and all(width % t.fmt.block_size == 0 for t in downs) \
            and width % COLUMN_GROUP == 0:
        return "width"
    if cfg.n_expert % world == 0:
        return "experts"
    raise UnsupportedError(f"--tp {world}: the experts' width {cfg.n_ff_exp} does not split on blocks and "
                           f"{cfg.n_expert} experts do not split evenly over {world} GPUs")


# the architectures whose layers the layout covers (attention, dense or routed FFN); the recurrent
# mixers of the qwen35 family, the Gemma post-norms and shared K/V are not split yet
TP_ARCHS = ("llama", "qwen3", "qwen3moe")


def rank_config(cfg: ModelConfig, world: int, experts: str | None = "width") -> ModelConfig:
    """cfg with one rank's head and FFN counts (every rank's are equal); experts: expert_split's
    answer (by whole experts the width stays, the router's count too)."""
    if cfg.arch not in TP_ARCHS:
        raise UnsupportedError(f"--tp {world}: {cfg.arch} has no tensor-parallel layout (it runs on one GPU: "
                               f"drop --tp); layouts exist for {', '.join(TP_ARCHS)}")
    names = ("n_ff", "n_ff_exp", "n_ff_shexp") if experts == "width" else ("n_ff", "n_ff_shexp")
    for name in names:
        if getattr(cfg, name) % world:
            raise UnsupportedError(f"--tp {world}: {name} = {getattr(cfg, name)} does not split evenly "
                                   f"over {world} GPUs")
    hd = heads(cfg, world, 0)
    n_ff_exp = cfg.n_ff_exp // world if experts == "width" else cfg.n_ff_exp
    return dataclasses.replace(cfg, n_head=hd.n_head, n_head_kv=hd.n_head_kv, n_ff=cfg.n_ff // world,
                               n_ff_exp=n_ff_exp, n_ff_shexp=cfg.n_ff_shexp // world)


def span(cfg: ModelConfig, what: str, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of the rows or columns rank holds of a matrix split by `what` (SPLITS)."""
    hd = heads(cfg, world, rank)
    if what == "q":
        return hd.q0 * cfg.head_dim, (hd.q0 + hd.n_head) * cfg.head_dim
    if what == "k":
        return hd.kv0 * cfg.head_dim, (hd.kv0 + hd.n_head_kv) * cfg.head_dim
    if what == "v":
        return hd.kv0 * cfg.head_dim_v, (hd.kv0 + hd.n_head_kv) * cfg.head_dim_v
    if what == "o":
        return hd.q0 * cfg.head_dim_v, (hd.q0 + hd.n_head) * cfg.head_dim_v
    width = getattr(cfg, "n_" + what) // world
    return rank * width, (rank + 1) * width


def slice_rows(t: Tensor, start: int, stop: int) -> Tensor:
    """Rows [start, stop) of t (of each expert's matrix for (E, rows, cols)): a view."""
    data = t.data[..., start:stop, :] if t.data.ndim > 1 else t.data[start:stop]
    shape = t.shape[:-2] + (stop - start, t.shape[-1]) if len(t.shape) > 1 else (stop - start,)
    return Tensor(t.name, t.fmt, shape, data)


def slice_cols(t: Tensor, start: int, stop: int) -> Tensor:
    """Columns [start, stop) of t, copied; UnsupportedError unless both ends are on t's blocks
    and on COLUMN_GROUP."""
    bs, ts = t.fmt.block_size, t.fmt.type_size
    if start % bs or stop % bs:
        raise UnsupportedError(f"{t.name}: columns [{start}, {stop}) of a rank do not fall on whole "
                               f"{t.fmt.name} blocks of {bs}; use a --tp that splits them on blocks")
    if start % COLUMN_GROUP or stop % COLUMN_GROUP:
        raise UnsupportedError(f"{t.name}: columns [{start}, {stop}) of a rank are not whole groups of "
                               f"{COLUMN_GROUP} (the GPU kernels' row layout); use a smaller --tp")
    if t.data.dtype == np.uint8:  # blocks stored as bytes
        a, b = start // bs * ts, stop // bs * ts
    else:  # plain types viewed as their dtype: one element a column
        a, b = start, stop
    data = np.ascontiguousarray(t.data[..., a:b])
    return Tensor(t.name, t.fmt, t.shape[:-1] + (stop - start,), data)


def split_of(name: str) -> tuple[str, str] | None:
    """(axis, what) for a per-layer matrix that is split, else None (replicated)."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[3] not in ("weight", "bias"):
        return None
    rule = SPLITS.get(parts[2])
    if rule is not None and parts[3] == "bias":
        raise UnsupportedError(f"--tp: {name}: biases of split matrices are not supported")
    return rule


def splits_vocab(cfg: ModelConfig, world: int) -> bool:
    """Whether the logits are split by vocabulary (rows of output) over world ranks: where the
    vocabulary divides evenly, else every rank computes them all."""
    return world > 1 and cfg.n_vocab % world == 0


def slice_experts(t: Tensor, start: int, stop: int) -> Tensor:
    """Experts [start, stop) of a stacked (E, rows, cols) tensor: a view."""
    return Tensor(t.name, t.fmt, (stop - start,) + t.shape[1:], t.data[start:stop])


def rank_tensors(tensors: dict, cfg: ModelConfig, world: int, rank: int, vocab_split: bool = True) -> dict:
    """Every tensor as rank holds it (split ones sliced, the rest as they are), by GGUF name;
    cfg is the whole model's. With the vocabulary split (vocab_split and splits_vocab),
    output.weight holds the rank's rows [r V/N, (r+1) V/N) (of token_embd where the file ties
    them: the embedding keeps the whole)."""
    out = {}
    by_expert = expert_split(tensors, cfg, world) == "experts"
    if vocab_split and splits_vocab(cfg, world):
        embd = tensors.get("output.weight", tensors["token_embd.weight"])
        v = cfg.n_vocab // world
        out["output.weight"] = slice_rows(embd, rank * v, (rank + 1) * v)
    for name, t in tensors.items():
        if name in out:
            continue
        rule = split_of(name)
        if rule is None:
            out[name] = t
            continue
        axis, what = rule
        if by_expert and what == "ff_exp":
            n = cfg.n_expert // world
            out[name] = slice_experts(t, rank * n, (rank + 1) * n)
            continue
        start, stop = span(cfg, what, world, rank)
        out[name] = slice_rows(t, start, stop) if axis == "rows" else slice_cols(t, start, stop)
    return out


class RankFile:
    """A ModelFile's stand-in holding one rank's tensors (what gpu/weights.py reads: tensors,
    arch, metadata) and how its experts split."""

    def __init__(self, mf, cfg: ModelConfig, world: int, rank: int, vocab_split: bool = True):
        self.path, self.arch, self.metadata = mf.path, mf.arch, mf.metadata
        self.tensors = rank_tensors(mf.tensors, cfg, world, rank, vocab_split)
        self.world, self.rank = world, rank
        self.expert_split = expert_split(mf.tensors, cfg, world)
        n = cfg.n_expert // world
        # the rank's experts (first, count) when split by whole experts, else None
        self.expert_range = (rank * n, n) if self.expert_split == "experts" else None

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)
