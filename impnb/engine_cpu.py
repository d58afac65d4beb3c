"""The CPU engine: the numpy reference model with a KV cache and a host sampler."""

import numpy as np

from impnb.gguf_file import ModelFile
from impnb.models import load_reference
from impnb.models.validate import validate_model
from impnb.sampling import Sampler, SamplingParams


class CpuEngine:
    """prefill(prompt ids) -> first token; step(token) -> next token. Same API as the GPU engine."""

    device = "cpu"

    def __init__(self, mf: ModelFile, n_ctx: int):
        validate_model(mf, n_ctx, device="cpu")  # before a weight is dequantized
        self.model = load_reference(mf)
        self.cfg = self.model.cfg
        self.n_ctx = n_ctx
        self.cache = None
        self.sampler = None
        self.history = []

    def reset(self, params: SamplingParams) -> None:
        self.cache = self.model.new_cache(self.n_ctx)
        self.sampler = Sampler(params)
        self.history = []

    def prefill(self, ids) -> int:
        self.history = list(ids)
        logits = self.model.forward(np.asarray(ids), self.cache)
        return self._sample(logits[-1])

    def step(self, token: int) -> int:
        self.history.append(token)
        return self._sample(self.model.forward(np.array([token]), self.cache)[-1])

    @property
    def pos(self) -> int:
        return self.cache.pos

    def _sample(self, logits: np.ndarray) -> int:
        return self.sampler(logits, self.history)
