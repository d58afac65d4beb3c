"""What a model runner is: it takes one scheduled step (every sequence's new tokens, their
positions, its block table, whether its last row is sampled) and returns, for the rows that are
sampled, their logits -- or, for a runner that samples on its device, the sampled ids.

Runners: cpu_runner.CpuRunner (the numpy reference over a paged pool, any batch) and
single_runner.SingleSequenceRunner (a single-sequence engine as a runner of batches of one: the
CUDA engine today). A batched GPU runner implements this interface over gpu/kv.PagedKV with a
block table row per sequence (docs/DESIGN.md, "Plans and batching") and replaces the
single-sequence one in runners.make_runner.
"""

from dataclasses import dataclass

import numpy as np

from impnb.sampling import SamplingParams


@dataclass(frozen=True)
class SequenceRows:
    """One sequence's rows in a step: token_ids at positions start..start + n - 1."""

    seq_id: int
    token_ids: np.ndarray  # (n,) int32
    start: int
    block_table: np.ndarray  # (n_blocks,) int32: block i holds positions i * block_size..
    sample: bool  # its last row is sampled (every token it has is then computed)
    params: SamplingParams  # for runners that sample on their device
    n_sampled: int  # tokens it sampled so far: the step of a counter-based sampler


@dataclass(frozen=True)
class StepInput:
    rows: list[SequenceRows]

    @property
    def n_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)


@dataclass(frozen=True)
class StepOutput:
    """For each sampled sequence, in the order of the step's rows: logits (S, V) float32 on the
    host (the engine samples), or the ids the runner sampled."""

    logits: np.ndarray | None = None
    tokens: list[int] | None = None


class ModelRunner:
    """The interface; attributes tell the scheduler what the runner can take."""

    device = "?"
    block_size = 16  # tokens a KV block holds
    n_blocks = 0  # blocks in the pool
    max_num_seqs: int | None = None  # sequences a step can hold (None: the engine's setting)
    chunked_prefill = True  # a prompt may arrive in chunks over several steps
    prefix_caching = True  # blocks may be shared between sequences

    def execute(self, step: StepInput) -> StepOutput:
        raise NotImplementedError

    def finished(self, seq_id: int) -> None:
        """seq_id's blocks were freed (it finished, was aborted or preempted)."""

    def nonfinite_origin(self, seq_id: int) -> str | None:
        """Where NaN or inf first entered seq_id's forward (a norm's name), if the runner knows."""
        return None
