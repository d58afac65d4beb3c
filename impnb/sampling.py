"""Token sampling on the host: greedy, temperature, top-k, top-p, min-p, repetition penalty.

The order follows llama.cpp's default chain: penalties, top-k, top-p, min-p, temperature.
Random draws come from a Philox generator seeded by the user (the GPU sampler uses Philox too).
"""

from dataclasses import dataclass

import numpy as np

from impnb.errors import ParameterError

# A penalty divides or multiplies a logit: beyond this either way float32 logits overflow.
MAX_REPEAT_PENALTY = 1000.0


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


_REAL = ((int, float, np.integer, np.floating), "a number")
_INT = ((int, np.integer), "an integer")
# what each field takes: a bool, or a float where an int is meant, is a caller's mistake
_FIELD_TYPES = {"temperature": _REAL, "top_k": _INT, "top_p": _REAL, "min_p": _REAL,
                "repeat_penalty": _REAL, "repeat_last_n": _INT, "seed": _INT, "max_tokens": _INT,
                "ignore_eos": ((bool, np.bool_), "True or False")}


def apply_repeat_penalty(logits: np.ndarray, history, penalty: float) -> np.ndarray:
    """Divide positive / multiply negative logits of recently seen tokens by `penalty`."""
    if penalty == 1.0 or not len(history):
        return logits
    logits = logits.copy()
    ids = np.unique(np.asarray(history, dtype=np.int64))
    seen = logits[ids]
    logits[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
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
        logits = apply_repeat_penalty(logits, list(history)[-p.repeat_last_n:], p.repeat_penalty)
        if p.greedy:
            return int(np.argmax(logits))
        ids, probs = filter_probs(logits, p)
        return int(ids[self.rng.choice(len(ids), p=probs)])
