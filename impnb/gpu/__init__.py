"""The CUDA side: context and stream, cuBLAS, device weights and the GPU engine."""

from impnb.numba_import import import_numba

import_numba()
