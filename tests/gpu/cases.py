"""Parametrization shared by the kernel tests."""

import pytest
from gguf import GGML_QUANT_SIZES


def fitting(types, shapes):
    """(type, rows, cols) cases whose rows are whole blocks of the type: K-quants need cols % 256 == 0."""
    return [pytest.param(t, r, c, id=f"{t.name}-{r}x{c}") for t in types for r, c in shapes
            if c % GGML_QUANT_SIZES[t][0] == 0]
