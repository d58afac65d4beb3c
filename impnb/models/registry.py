"""The architectures impnb runs, by GGUF `general.architecture`: one module each (see
models/__init__.py), registered here."""

from impnb.errors import UnsupportedError
from impnb.gguf_file import ModelFile
from impnb.models import gemma3, gemma4, llama, qwen3, qwen3moe, qwen3next, qwen35, qwen35moe
from impnb.models.config import ModelConfig

ARCHITECTURES = {"llama": llama, "gemma3": gemma3, "qwen3": qwen3, "qwen3moe": qwen3moe}
ARCHITECTURES.update({"qwen35": qwen35, "qwen35moe": qwen35moe, "qwen3next": qwen3next})
ARCHITECTURES.update({"gemma4": gemma4})


def architecture(mf: ModelFile):
    """The module describing mf's architecture; UnsupportedError if impnb has none."""
    module = ARCHITECTURES.get(mf.arch)
    if module is None:
        raise UnsupportedError(f"{mf.path}: architecture '{mf.arch}' is not supported "
                               f"(supported: {', '.join(ARCHITECTURES)})")
    return module


def model_config(mf: ModelFile) -> ModelConfig:
    return architecture(mf).config(mf)
