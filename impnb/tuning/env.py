"""Reading the A/B overrides from the environment (impnb/tuning's IMPNB_<NAME> variables): each
helper returns the default where a variable is unset and raises ParameterError (one line from
the CLI) where its value is malformed."""

import os
import re
from pathlib import Path

from gguf import GGMLQuantizationType as T

from impnb.errors import ParameterError


def env_path(name: str, default: Path) -> Path:
    """IMPNB_<name> as a file's path (another measured table, for an A/B run), default where unset
    or empty; ParameterError where no file is there."""
    value = os.environ.get(f"IMPNB_{name}") or None
    if value is None:
        return default
    if not Path(value).is_file():
        raise ParameterError(f"IMPNB_{name}={value!r}: no such file")
    return Path(value)


def switch(name: str, default: bool = True) -> bool:
    """A choice on by default (or off, default False): False where the environment sets
    IMPNB_<name> to 0, True where it sets anything else."""
    return os.environ.get(f"IMPNB_{name}", "1" if default else "0") != "0"


def env_ints(name: str) -> tuple[int, ...] | None:
    """The comma-separated integers of environment variable `name` (an A/B override), None where
    it is unset; ParameterError where it is not integers."""
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise ParameterError(f"{name}={value!r}: expected integers separated by commas") from None


def env_number(name: str, default: float) -> float:
    """Environment variable `name` as a number (an A/B override), default where it is unset;
    ParameterError where it is not a number."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        raise ParameterError(f"{name}={value!r}: expected a number") from None


def env_choice(name: str, choices: tuple, default: int) -> int:
    """IMPNB_<name> as one of the integers `choices`, default where it is unset; ParameterError
    where it is anything else."""
    value = os.environ.get(f"IMPNB_{name}")
    if value is None:
        return default
    if value.strip() not in {str(c) for c in choices}:
        raise ParameterError(f"IMPNB_{name}={value!r}: expected one of {', '.join(map(str, choices))}")
    return int(value)


def env_types(name: str, default: str) -> tuple:
    """Environment variable `name` (default where unset) as GGML type names separated by commas,
    empty for none; ParameterError where one is not a type's name."""
    value = os.environ.get(name, default)
    try:
        return tuple(T[n.strip()] for n in value.split(",") if n.strip())
    except KeyError:
        raise ParameterError(f"{name}={value!r}: expected GGML type names separated by commas") from None


def env_variant(name: str) -> str | None:
    """Environment variable `name` as a gemv_dp4a_multi variant's name (s<span>u<depth>r<rows>) or
    "mmq" (the int8 GEMM), None where unset or empty; ParameterError where it is neither."""
    value = os.environ.get(name) or None
    if value is not None and value != "mmq" and not re.fullmatch(r"s(32|64|128)u[12]r[248]", value):
        raise ParameterError(f"{name}={value!r}: expected a variant such as s32u1r4, or mmq")
    return value


def env_table(name: str, default: dict) -> dict:
    """A measured per-type variant table with its A/B override: default where IMPNB_<name> is
    unset or 1, {} where 0, else its comma-separated TYPE=s<span>u<unroll>r<rows> entries (those
    types alone); ParameterError where malformed."""
    value = os.environ.get(f"IMPNB_{name}", "1")
    if value == "1":
        return default
    out = {}
    for entry in (e.strip() for e in value.split(",") if e.strip() and value != "0"):
        m = re.fullmatch(r"([A-Z0-9_]+)=s(32|64|128)u([1-4])r(1|2|4|8)", entry)
        if not m or m.group(1) not in T.__members__:
            raise ParameterError(f"IMPNB_{name}={value!r}: expected 0, 1 or TYPE=s32u2r4 entries separated by commas")
        out[T[m.group(1)]] = tuple(int(g) for g in m.groups()[1:])
    return out
