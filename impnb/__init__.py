"""impnb: GGUF language models on numba.cuda kernels, with a numpy reference on the CPU."""

__version__ = "0.1.0"
