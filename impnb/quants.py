"""The GGML tensor types impnb supports, with their block geometry and numpy reference dequant.

The reference dequantization is the `gguf` package's own (`gguf.quants.dequantize`); GPU
kernels are tested bit-exact or to a stated tolerance against it.
"""

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize as _gguf_dequantize

from impnb.errors import UnsupportedError


@dataclass(frozen=True)
class QuantFormat:
    """One GGML type: `block_size` weights are stored in `type_size` bytes."""

    ggml_type: T
    block_size: int
    type_size: int

    @property
    def name(self) -> str:
        return self.ggml_type.name

    def row_bytes(self, n: int) -> int:
        """Bytes of one row of `n` weights."""
        return n // self.block_size * self.type_size


SUPPORTED_TYPES = (
    T.F32, T.F16, T.BF16,
    T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
    T.IQ4_NL, T.MXFP4, T.NVFP4,
)

FORMATS = {t: QuantFormat(t, *GGML_QUANT_SIZES[t]) for t in SUPPORTED_TYPES}


def quant_format(ggml_type: int, tensor_name: str = "?") -> QuantFormat:
    """The format of a supported type; UnsupportedError naming the type and tensor otherwise."""
    try:
        t = T(ggml_type)
    except ValueError:
        raise UnsupportedError(f"tensor {tensor_name}: unknown GGML type id {ggml_type}") from None
    fmt = FORMATS.get(t)
    if fmt is None:
        raise UnsupportedError(f"tensor {tensor_name}: GGML type {t.name} is not supported "
                               f"(supported: {', '.join(f.name for f in FORMATS.values())})")
    return fmt


def dequantize(data: np.ndarray, ggml_type: T) -> np.ndarray:
    """Raw GGUF tensor bytes (rows, row_bytes) -> float32 (rows, cols); the numpy reference."""
    return np.asarray(_gguf_dequantize(data, ggml_type), dtype=np.float32)
