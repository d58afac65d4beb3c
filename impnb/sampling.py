"""Token sampling on the host: greedy, temperature, top-k, top-p, min-p, and the penalties
(repetition, presence, frequency) over the last repeat_last_n tokens.

The order follows llama.cpp's default chain: penalties, top-k, top-p, min-p, temperature.
Random draws come from a Philox generator seeded by the user (the GPU sampler uses Philox too).
"""

from dataclasses import dataclass

import numpy as np

from impnb.errors import ParameterError

# A penalty divides or multiplies a logit: beyond this either way float32 logits overflow.
MAX_REPEAT_PENALTY = 1000.0
MAX_OPENAI_PENALTY = 2.0  # presence and frequency penalties lie in [-2, 2], as OpenAI's API takes them


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = 0
    max_tokens: int = 128  # tokens to generate at most (the engine's stop; the CLI's --max-tokens)
    ignore_eos: bool = False  # generate past an end-of-generation token, up to max_tokens
    presence_penalty: float = 0.0  # subtracted from the logit of each token in the window (OpenAI's)
    frequency_penalty: float = 0.0  # subtracted that many times as the token occurs in the window

    def validate(self) -> "SamplingParams":
        for name, (kinds, what) in _FIELD_TYPES.items():
            value = getattr(self, name)
            if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
                raise ParameterError(f"{name.replace('_', '-')} must be {what}, got {value!r:.40}")
        if not 0 <= self.temperature < float("inf"):
            raise ParameterError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ParameterError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ParameterError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ParameterError(f"min-p must be in [0, 1], got {self.min_p}")
        if not 1 / MAX_REPEAT_PENALTY <= self.repeat_penalty <= MAX_REPEAT_PENALTY:
            raise ParameterError(f"repeat penalty must be in [{1 / MAX_REPEAT_PENALTY:g}, "
                                 f"{MAX_REPEAT_PENALTY:g}], got {self.repeat_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_OPENAI_PENALTY <= getattr(self, name) <= MAX_OPENAI_PENALTY:
                raise ParameterError(f"{name.replace('_', '-')} must be in [-{MAX_OPENAI_PENALTY:g}, "
                                     f"{MAX_OPENAI_PENALTY:g}], got {getattr(self, name)}")
        if not 0 <= self.seed < 2**64:
            raise ParameterError(f"seed must be in [0, 2**64), got {self.seed}")
        if self.repeat_last_n < 0:
            raise ParameterError(f"repeat-last-n must be >= 0, got {self.repeat_last_n}")
        if self.max_tokens <= 0:
            raise ParameterError(f"max-tokens must be > 0, got {self.max_tokens}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Some penalty changes the logits of the tokens in the window."""
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0 or self.frequency_penalty != 0


_REAL = ((int, float, np.integer, np.floating), "a number")
_INT = ((int, np.integer), "an integer")
# what each field takes: a bool, or a float where an int is meant, is a caller's mistake
_FIELD_TYPES = {"temperature": _REAL, "top_k": _INT, "top_p": _REAL, "min_p": _REAL,
                "repeat_penalty": _REAL, "repeat_last_n": _INT, "seed": _INT, "max_tokens": _INT,
                "ignore_eos": ((bool, np.bool_), "True or False"), "presence_penalty": _REAL,
                "frequency_penalty": _REAL}


def apply_repeat_penalty(logits: np.ndarray, history, penalty: float) -> np.ndarray:
    """Divide positive / multiply negative logits of recently seen tokens by `penalty`."""
    if penalty == 1.0 or not len(history):
        return logits
    logits = logits.copy()
    ids = np.unique(np.asarray(history, dtype=np.int64))
    seen = logits[ids]
    logits[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
    return logits


def apply_penalties(logits: np.ndarray, history, p: SamplingParams) -> np.ndarray:
    """llama.cpp's penalties over the window `history` (the last repeat_last_n tokens, prompt
    included): each distinct token's logit gets the repetition penalty, then loses
    frequency_penalty x its count + presence_penalty (OpenAI's formula). The presence and frequency
    terms are computed in float64 from float32 values of the penalties (exact: the GPU kernel's
    fused multiply-add gives the same float32 result) and rounded once."""
    logits = apply_repeat_penalty(logits, history, p.repeat_penalty)
    if not (p.presence_penalty or p.frequency_penalty) or not len(history):
        return logits
    logits = logits.copy()
    ids, counts = np.unique(np.asarray(history, dtype=np.int64), return_counts=True)
    drop = counts * np.float64(np.float32(p.frequency_penalty)) + np.float64(np.float32(p.presence_penalty))
    logits[ids] = (logits[ids].astype(np.float64) - drop).astype(np.float32)
    return logits


def filter_probs(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Candidates after top-k, top-p and min-p: (token ids, probabilities summing to 1)."""
    order = np.argsort(-logits, kind="stable")
    if p.top_k > 0:
        order = order[: p.top_k]
    # the largest logit subtracted before the temperature divides: no inf - inf at a tiny temperature
    z = (logits[order].astype(np.float64) - float(logits[order[0]])) / p.temperature
    probs = np.exp(z)
    probs /= probs.sum()
    if p.top_p < 1:
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        order, probs = order[:keep], probs[:keep]
    if p.min_p > 0:
        keep = probs >= p.min_p * probs[0]
        order, probs = order[keep], probs[keep]
    return order, probs / probs.sum()


class Sampler:
    """Picks the next token from a row of logits; owns the seeded RNG."""

    def __init__(self, params: SamplingParams):
        self.params = params.validate()
        self.rng = np.random.Generator(np.random.Philox(params.seed))

    def __call__(self, logits: np.ndarray, history=()) -> int:
        p = self.params
        logits = apply_penalties(logits, list(history)[-p.repeat_last_n:], p)
        if p.greedy:
            return int(np.argmax(logits))
        ids, probs = filter_probs(logits, p)
        return int(ids[self.rng.choice(len(ids), p=probs)])
