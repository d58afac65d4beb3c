"""Typed errors for mistakes a user can make; the CLI prints them as one line and exits 2."""


class ImpnbError(Exception):
    """A user-facing error: bad file, bad parameter, unsupported model."""


class GGUFError(ImpnbError):
    """The file is missing, truncated or not a valid GGUF."""


class UnsupportedError(ImpnbError):
    """A valid GGUF that impnb cannot run: architecture or tensor type."""


class ParameterError(ImpnbError):
    """A bad generation parameter or a prompt that does not fit."""


class DeviceError(ImpnbError):
    """No usable GPU, or not enough GPU memory."""


class NumericalError(ImpnbError):
    """The model produced NaN or inf logits: broken weights, or numerics that overflowed."""


class ParallelError(ImpnbError):
    """Tensor parallelism could not start (no NCCL, a rank that did not join in time) or a rank failed."""
