"""Numba CUDA kernels, each beside its numpy reference."""
