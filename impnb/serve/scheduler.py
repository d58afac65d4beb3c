"""Which tokens of which sequences the next step computes: continuous batching with chunked
prefill under a token budget, admission while the pool has blocks, preemption when it has none.

Every step first gives each running sequence its pending tokens (one for a decode, the next
chunk of a prompt), decodes first, each kind oldest first; when the pool cannot hold a
sequence's new K/V, the newest running sequence not yet in this step is preempted (its blocks
freed, its tokens recomputed when it is admitted again) -- in the last resort the sequence
itself. With lookahead, a decode also takes the block of its next position where the pool
spares it (the runner queues the following step before this one's tokens are read). What the
budget leaves goes to waiting sequences, oldest first, each taking its cached prefix and then
blocks for the chunk it gets; a sequence that does not fit waits (nothing behind it overtakes
it).
"""

from collections import deque
from dataclasses import dataclass, field

from impnb.serve.block_manager import BlockManager
from impnb.serve.sequence import Sequence, Status


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int  # sequences in one step at most
    max_num_batched_tokens: int  # the token budget of one step
    chunked_prefill: bool = True  # a prompt may be split over steps (else it needs the budget at once)
    lookahead: int = 0  # positions past a decode's token whose blocks it also takes, where free (a step queued ahead)
    max_len: int | None = None  # a sequence's tokens at most (the context): no block past it


@dataclass
class ScheduledStep:
    """One step: (sequence, tokens it computes) in batch order, and those preempted to make room."""

    work: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(n for _, n in self.work)

    def __bool__(self) -> bool:
        return bool(self.work)


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager):
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take seq out of the queues and free its blocks."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        budget = self.config.max_num_batched_tokens
        # decodes first, then prompt chunks, each oldest first; victims come from the end
        queue = sorted(self.running, key=lambda s: s.n_pending > 1)
        while queue and budget > 0:
            seq = queue.pop(0)
            n = min(seq.n_pending, budget) if self.config.chunked_prefill else seq.n_pending
            if n > budget:
                queue.insert(0, seq)
                break
            while not self.blocks.can_grow(seq, seq.n_computed + n):
                victim = queue.pop() if queue else seq
                self._preempt(victim, step)
                if victim is seq:
                    break
            else:
                self.blocks.grow(seq, seq.n_computed + n)
                if n == 1 and self.config.lookahead:
                    self._reserve(seq)
                step.work.append((seq, n))
                budget -= n
        self.running = [s for s in self.running if s.status is Status.RUNNING]
        if not step.preempted:
            self._admit(step, budget)
        return step

    def _reserve(self, seq: Sequence) -> None:
        """A decode's blocks for the lookahead positions after it, where the pool has a block for
        every running sequence besides and the context goes that far (never a preemption)."""
        ahead = seq.n_computed + 1 + self.config.lookahead
        if self.config.max_len is not None:
            ahead = min(ahead, self.config.max_len)
        need = self.blocks.blocks_needed(seq, ahead)
        if need and self.blocks.n_free - need >= len(self.running):
            self.blocks.grow(seq, ahead)

    def _admit(self, step: ScheduledStep, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            self.blocks.match_prefix(seq)
            n = seq.n_pending
            if self.config.chunked_prefill:
                n = min(n, budget)
            if n > budget or not self.blocks.can_grow(seq, seq.n_computed + n):
                self.blocks.n_hits -= seq.n_cached
                self.blocks.release(seq)  # its cached blocks back; it waits for room
                seq.n_cached = 0
                return
            self.blocks.grow(seq, seq.n_computed + n)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            step.work.append((seq, n))
            budget -= n

    def _preempt(self, seq: Sequence, step: ScheduledStep) -> None:
        """Free seq's blocks and queue it first among the waiting: it recomputes all its tokens."""
        self.blocks.release(seq)
        seq.status = Status.WAITING
        seq.n_preempted += 1
        self.waiting.appendleft(seq)
        step.preempted.append(seq)
