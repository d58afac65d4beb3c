"""numba imported without the optional packages it loads when they are installed and impnb does
not use: coverage (for coverage of jitted lines) and scipy (for a version check); on a host that
has them they are a sizeable part of a start. A process where either is already imported (a
coverage run, a test session) keeps it; afterwards both import as usual."""

import sys

SKIPPED = ("coverage", "scipy")


def import_numba() -> None:
    """Import numba and numba.cuda with SKIPPED hidden, unless numba is already imported."""
    if "numba" in sys.modules:
        return
    hidden = [name for name in SKIPPED if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import name` raises ImportError
    try:
        import numba.cuda  # noqa: F401
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
