"""Numba CUDA kernels, each beside its numpy reference."""

import os

# Small decode grids are deliberate (one block per row tile); numba's occupancy warning is noise.
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
