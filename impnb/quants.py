"""The GGML tensor types impnb supports, with their block geometry and numpy reference dequant.

The reference dequantization is the `gguf` package's own (`gguf.quants.dequantize`); GPU
kernels are tested bit-exact or to a stated tolerance against it.
"""

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from impnb.errors import UnsupportedError

# The supported types: GGML type id -> (name, weights a block, bytes a block), as gguf's
# GGMLQuantizationType and GGML_QUANT_SIZES give them (tests/test_quants_table.py checks they
# agree). Kept here so that reading a header (`impnb info`) does not import the gguf package.
SUPPORTED = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    20: ("IQ4_NL", 32, 18), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
}


# The supported types' ids by name (plain ints: equal to gguf's enum members): TypeId.Q4_K == 12.
TypeId = SimpleNamespace(**{name: type_id for type_id, (name, _, _) in SUPPORTED.items()})


@dataclass(frozen=True)
class QuantFormat:
    """One GGML type: `block_size` weights are stored in `type_size` bytes."""

    type_id: int
    name: str
    block_size: int
    type_size: int

    @property
    def ggml_type(self):
        """gguf's GGMLQuantizationType member (the gguf package is imported at the first ask)."""
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.type_id)

    def row_bytes(self, n: int) -> int:
        """Bytes of one row of `n` weights."""
        return n // self.block_size * self.type_size


SUPPORTED_TYPES = tuple(SUPPORTED)

FORMATS = {i: QuantFormat(i, *v) for i, v in SUPPORTED.items()}  # keyed by id (a gguf member finds it too)


def quant_format(ggml_type: int, tensor_name: str = "?") -> QuantFormat:
    """The format of a supported type; UnsupportedError naming the type and tensor otherwise."""
    fmt = FORMATS.get(ggml_type)
    if fmt is None:
        from gguf import GGMLQuantizationType as T

        try:
            t = T(ggml_type)
        except ValueError:
            raise UnsupportedError(f"tensor {tensor_name}: unknown GGML type id {ggml_type}") from None
        raise UnsupportedError(f"tensor {tensor_name}: GGML type {t.name} is not supported "
                               f"(supported: {', '.join(f.name for f in FORMATS.values())})")
    return fmt


def dequantize(data: np.ndarray, ggml_type) -> np.ndarray:
    """Raw GGUF tensor bytes (rows, row_bytes) -> float32 (rows, cols); the numpy reference."""
    from gguf.quants import dequantize as _gguf_dequantize

    return np.asarray(_gguf_dequantize(data, ggml_type), dtype=np.float32)
