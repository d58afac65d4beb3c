"""What the engine hands back: a request's progress in one step, and a finished request."""

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and the most likely tokens' at its place, best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(frozen=True)
class Delta:
    """What one step added to a request: new token ids and the text they complete."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None  # eog, stop (a stop string), length, context or abort, once finished
    logprobs: list[TokenLogprob] | None = None  # one per token id, where the request asked


@dataclass(frozen=True)
class Timing:
    """Seconds: queued (arrival -> first step), prefill (first step -> first token), decode
    (first token -> finish), total (arrival -> finish)."""

    queued_s: float
    prefill_s: float
    decode_s: float
    total_s: float


@dataclass(frozen=True)
class Completion:
    """One finished request."""

    request_id: str
    prompt: str | None  # the text given, None for token ids
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # generated; an end-of-generation token that stopped it is not among them
    finish_reason: str  # eog, stop (a stop string), length, context or abort
    n_cached_tokens: int  # prompt tokens whose K/V came from the prefix cache
    n_preempted: int  # times its blocks were taken back and its tokens recomputed
    timing: Timing
