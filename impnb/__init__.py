"""impnb: GGUF language models on numba.cuda kernels, with a numpy reference on the CPU."""

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name):
    """`from impnb import LLM, SamplingParams`, imported on first use: `import impnb` stays cheap
    for the CLI, and the GPU path loads only when a model is put on the GPU."""
    if name == "LLM":
        from impnb.serve.llm import LLM

        return LLM
    if name == "SamplingParams":
        from impnb.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'impnb' has no attribute {name!r}")
