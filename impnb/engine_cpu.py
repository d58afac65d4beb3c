"""The CPU engine: the numpy reference model with a KV cache and a host sampler."""

import numpy as np

from impnb.errors import NumericalError, ParameterError
from impnb.gguf_file import ModelFile
from impnb.models import load_reference
from impnb.models.validate import validate_model
from impnb.sampling import Sampler, SamplingParams

PREFILL_CHUNK = 256  # prompt tokens a forward pass takes at once


class CpuEngine:
    """prefill(prompt ids) -> first token; step(token) -> next token. Same API as the GPU engine."""

    device = "cpu"

    def __init__(self, mf: ModelFile, n_ctx: int):
        validate_model(mf, n_ctx, device="cpu")  # before a weight is dequantized
        with np.errstate(all="ignore"):  # non-finite weights are reported by _sample, once
            self.model = load_reference(mf)
        self.cfg = self.model.cfg
        self.n_ctx = n_ctx
        self.cache = None
        self.sampler = None
        self.history = []
        self.n_prompt = 0

    def reset(self, params: SamplingParams) -> None:
        self.cache = self.model.new_cache(self.n_ctx)
        self.sampler = Sampler(params)
        self.history = []

    def prefill(self, ids) -> int:
        """Chunks of PREFILL_CHUNK tokens, so that a chunk's logits (T, n_vocab) stay small."""
        if not len(ids):
            raise ParameterError("the prompt is empty")
        self.history = list(ids)
        self.n_prompt = len(ids)
        ids = np.asarray(ids)
        for start in range(0, len(ids), PREFILL_CHUNK):
            with np.errstate(all="ignore"):
                logits = self.model.forward(ids[start:start + PREFILL_CHUNK], self.cache)
        return self._sample(logits[-1], "the prompt")

    def step(self, token: int) -> int:
        self.history.append(token)
        with np.errstate(all="ignore"):
            logits = self.model.forward(np.array([token]), self.cache)[-1]
        return self._sample(logits, f"generated token {len(self.history) - self.n_prompt + 1}")

    @property
    def pos(self) -> int:
        return self.cache.pos

    def _sample(self, logits: np.ndarray, step: str) -> int:
        if not np.isfinite(logits).all():
            where = self.model.ops.first_nonfinite
            raise NumericalError(f"the model produced NaN or inf logits at {step}"
                                 + (f" (first non-finite values entering {where})" if where else "")
                                 + "; its weights are broken or its numerics overflowed")
        return self.sampler(logits, self.history)
