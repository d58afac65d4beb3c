"""Architectures impnb runs, by GGUF `general.architecture`, and the numpy reference model.

An architecture is a module with `config(mf) -> ModelConfig` (its GGUF metadata read) and
`layers(cfg) -> tuple[LayerSpec, ...]` (what each layer computes, models/spec.py), registered
in models/registry.py's ARCHITECTURES; the numpy reference (models/reference.py) and
gpu/forward.py both follow its layers. The reference is imported at its first use here, so
`info` and the GPU path do not load the numpy layer graph.
"""

from impnb.models.registry import ARCHITECTURES, architecture, model_config

__all__ = ["ARCHITECTURES", "ReferenceModel", "architecture", "load_reference", "model_config"]


def __getattr__(name: str):
    if name in ("ReferenceModel", "load_reference"):
        from impnb.models import reference

        return getattr(reference, name)
    raise AttributeError(f"module 'impnb.models' has no attribute {name!r}")
