"""One request as the scheduler sees it: its tokens, how many have K/V in the pool, its blocks."""

import itertools
import time
from enum import Enum

from impnb.sampling import Sampler, SamplingParams

_ids = itertools.count()


class Status(Enum):
    WAITING = "waiting"  # queued, or preempted (its blocks freed; its tokens recomputed later)
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """prompt + generated token ids; `n_computed` of them have K/V in the blocks of `block_table`.

    A step feeds token_ids[n_computed:n_computed + n] and, once every token is computed, samples
    the next one: a decode step is the case n == 1, a preempted sequence resumes as a prompt of
    all its tokens. The sampler (params + seed) draws once per token this sequence samples, so
    its draws do not depend on what else runs beside it."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None):
        self.seq_id = next(_ids)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
        self.token_ids = list(prompt_ids)
        self.n_prompt = len(prompt_ids)
        self.params = params
        self.sampler = Sampler(params)
        self.status = Status.WAITING
        self.n_computed = 0
        self.n_cached = 0  # prompt tokens found in the prefix cache (at the last admission)
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # content hash of each full block, in order
        self.n_registered = 0  # leading blocks of block_table in the prefix cache
        self.finish_reason: str | None = None  # eog, length, context or abort
        self.n_preempted = 0
        self.arrival = time.perf_counter()
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.finished: float | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def n_generated(self) -> int:
        return len(self.token_ids) - self.n_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.n_prompt:]

    @property
    def n_pending(self) -> int:
        """Tokens without K/V yet: the rest of the prompt, or the last sampled token."""
        return len(self.token_ids) - self.n_computed

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
