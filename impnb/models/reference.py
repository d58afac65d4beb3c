"""The numpy float32 reference model: the CPU path and every GPU test's yardstick."""

import numpy as np

from impnb.errors import ParameterError
from impnb.gguf_file import ModelFile
from impnb.models import layers
from impnb.models.kv_cache import KVCache
from impnb.models.numpy_ops import NumpyOps
from impnb.models.registry import architecture
from impnb.models.validate import validate_model


class ReferenceModel:
    """The numpy float32 forward pass: the CPU path and every GPU test's reference."""

    def __init__(self, mf: ModelFile):
        self.arch = architecture(mf)
        self.cfg = validate_model(mf)
        self.layers = self.arch.layers(self.cfg)
        ops_class = getattr(self.arch, "ops_class", None)  # an architecture's own ops
        self.ops = (ops_class() if ops_class else NumpyOps)(mf, self.cfg)

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        return KVCache(self.cfg, n_ctx or self.cfg.n_ctx)

    def forward(self, tokens, cache: KVCache) -> np.ndarray:
        """tokens (T,) at positions cache.pos.. -> logits (T, n_vocab) float32."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if cache.pos + len(tokens) > cache.n_ctx:
            raise ParameterError(f"{cache.pos + len(tokens)} tokens exceed the context of {cache.n_ctx}")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.cfg.n_vocab):
            raise ParameterError(f"token id out of range [0, {self.cfg.n_vocab})")
        self.ops.first_nonfinite = None
        return layers.forward(self.ops, self.cfg, self.layers, tokens, cache)


def load_reference(mf: ModelFile) -> ReferenceModel:
    return ReferenceModel(mf)
