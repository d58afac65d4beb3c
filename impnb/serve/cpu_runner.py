"""The numpy reference as a model runner: one paged KV pool, every sequence's attention reading
and writing through its own block table.

Each sequence's rows run through the reference stack as one forward: the reference is the
yardstick, and a sequence's logits are then those it gets alone, whatever runs beside it (the
GPU's batched runner is what runs sequences in one pass)."""

import numpy as np

from impnb.models import ReferenceModel
from impnb.models.paged_kv_cache import PagedKVPool
from impnb.serve.runner import ModelRunner, StepInput, StepOutput


class CpuRunner(ModelRunner):
    device = "cpu"
    returns_logits = True

    def __init__(self, model: ReferenceModel, n_blocks: int, block_size: int = 16):
        self.model = model
        self.cfg = model.cfg
        self.n_vocab = model.cfg.n_vocab
        self.block_size, self.n_blocks = block_size, n_blocks
        self.pool = PagedKVPool(model.cfg, n_blocks, block_size)
        self.nonfinite: dict[int, str] = {}  # seq_id -> the first norm fed NaN or inf

    def execute(self, step: StepInput) -> StepOutput:
        sampled = []
        for rows in step.rows:
            end = rows.start + len(rows.token_ids)
            kv = self.pool.view(rows.block_table, rows.start, end)
            with np.errstate(all="ignore"):  # non-finite logits are reported by the engine
                logits = self.model.forward(rows.token_ids, kv)
            if self.model.ops.first_nonfinite is not None:
                self.nonfinite.setdefault(rows.seq_id, self.model.ops.first_nonfinite)
            if rows.sample:
                sampled.append(logits[-1])
        V = self.cfg.n_vocab
        return StepOutput(logits=np.stack(sampled) if sampled else np.zeros((0, V), np.float32))

    def finished(self, seq_id: int) -> None:
        self.nonfinite.pop(seq_id, None)

    def nonfinite_origin(self, seq_id: int) -> str | None:
        return self.nonfinite.get(seq_id)
