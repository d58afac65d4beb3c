"""What a model runner is: it takes one scheduled step (every sequence's new tokens, their
positions, its block table, whether its last row is sampled) and returns, for the rows that are
sampled, their logits -- or, for a runner that samples on its device, the sampled ids.

Runners: cpu_runner.CpuRunner (the numpy reference over a paged pool, any batch),
cuda_runner.CudaBatchRunner (the batched CUDA engine: decode rows in one step, sampled on the
GPU) and single_runner.SingleSequenceRunner (a single-sequence engine as a runner of batches of
one: the CUDA engine with its look-ahead decode, for one sequence at a time).
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
    history: np.ndarray | None = None  # its recent tokens, where params has a repeat penalty
    logprobs: bool = False  # its request wants log-probabilities: a sampling runner returns the raw logits


@dataclass(frozen=True)
class PackedStep:
    """A step as flat arrays, the layout a batched kernel reads (T tokens, B sequences)."""

    token_ids: np.ndarray  # (T,) int32, sequence after sequence
    positions: np.ndarray  # (T,) int32
    seq_starts: np.ndarray  # (B + 1,) int32: sequence b's rows are seq_starts[b]:seq_starts[b + 1]
    context_lens: np.ndarray  # (B,) int32: keys each sequence attends to after this step
    block_tables: np.ndarray  # (B, max blocks) int32, -1 past a sequence's own
    sample_rows: np.ndarray  # (S,) int32: the rows whose logits are sampled


@dataclass(frozen=True)
class StepInput:
    rows: list[SequenceRows]

    @property
    def n_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)

    def packed(self) -> PackedStep:
        lens = np.array([len(r.token_ids) for r in self.rows], np.int32)
        starts = np.zeros(len(lens) + 1, np.int32)
        np.cumsum(lens, out=starts[1:])
        width = max((len(r.block_table) for r in self.rows), default=0)
        tables = np.full((len(self.rows), width), -1, np.int32)
        for b, r in enumerate(self.rows):
            tables[b, :len(r.block_table)] = r.block_table
        return PackedStep(
            token_ids=np.concatenate([r.token_ids for r in self.rows]).astype(np.int32),
            positions=np.concatenate([np.arange(r.start, r.start + len(r.token_ids), dtype=np.int32)
                                      for r in self.rows]),
            seq_starts=starts,
            context_lens=np.array([r.start + len(r.token_ids) for r in self.rows], np.int32),
            block_tables=tables,
            sample_rows=np.array([starts[b + 1] - 1 for b, r in enumerate(self.rows) if r.sample], np.int32))


@dataclass(frozen=True)
class StepOutput:
    """For each sampled sequence, in the order of the step's rows: logits (S, V) float32 on the
    host (the engine samples), or the ids the runner sampled and, for each of those, the raw
    (V,) float32 logits it sampled from where its row asked for logprobs (else None)."""

    logits: np.ndarray | None = None
    tokens: list[int] | None = None
    logprob_logits: list[np.ndarray | None] | None = None


class ModelRunner:
    """The interface; attributes tell the scheduler what the runner can take."""

    device = "?"
    block_size = 16  # tokens a KV block holds
    n_blocks = 0  # blocks in the pool
    n_vocab: int | None = None  # the model's vocabulary (token ids below it are valid)
    max_num_seqs: int | None = None  # sequences a step can hold (None: the engine's setting)
    chunked_prefill = True  # a prompt may arrive in chunks over several steps
    prefix_caching = True  # blocks may be shared between sequences
    returns_logits = False  # execute returns the sampled rows' logits (the engine samples on the host)
    logits_on_request = False  # it samples, and returns the raw logits of rows that ask (logprob_logits)
    lookahead_tokens = 0  # positions past a decode row's that its block table lists early (a step queued ahead)

    def execute(self, step: StepInput) -> StepOutput:
        raise NotImplementedError

    def finished(self, seq_id: int) -> None:
        """seq_id's blocks were freed (it finished, was aborted or preempted)."""

    def nonfinite_origin(self, seq_id: int) -> str | None:
        """Where NaN or inf first entered seq_id's forward (a norm's name), if the runner knows."""
        return None
