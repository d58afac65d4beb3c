"""Shared fixtures: real model paths, and skipping `gpu` tests where no GPU is usable."""

import os
from pathlib import Path

import pytest

from impnb.errors import ImpnbError
from impnb.model_registry import resolve_model


def _spread_workers_over_gpus() -> None:
    """On a host of several GPUs, IMPNB_TEST_GPUS=N spreads pytest-xdist's workers over the first
    N (worker gwK sees GPU K mod N alone); runs before anything here can initialise CUDA."""
    n, worker = os.environ.get("IMPNB_TEST_GPUS", ""), os.environ.get("PYTEST_XDIST_WORKER", "")
    if n.isdigit() and int(n) > 1 and worker[2:].isdigit():
        os.environ["CUDA_VISIBLE_DEVICES"] = str(int(worker[2:]) % int(n))


_spread_workers_over_gpus()

DEV_MODELS = Path(__file__).parents[1] / ".dev" / "models"
REAL_MODELS = {
    "smollm2-135m": "smollm2-135m-instruct-q4_1.gguf",
    "gemma3-270m": "gemma3-270m-q4_k_m.gguf",
}


def real_model_path(name: str) -> Path:
    """A real model's GGUF: $IMPNB_MODELS_DIR, .dev/models, then installed packages; else skip."""
    local = DEV_MODELS / REAL_MODELS[name]
    if not os.environ.get("IMPNB_MODELS_DIR") and local.is_file():
        return local
    try:
        return resolve_model(name)
    except ImpnbError as e:
        pytest.skip(f"real model {name} unavailable: {e}")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return real_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return real_model_path("gemma3-270m")


@pytest.fixture
def numba_without_spare_copies():
    """Kernel builds for the compile checks without the IR copies numba's inliner discards
    (impnb/launch/inlining.py): the same code in about half the CPU time."""
    from impnb.launch.inlining import without_spare_copies

    with without_spare_copies():
        yield


SIMULATOR = "tests/test_simulator.py::test_kernels_in_the_cuda_simulator"


def pytest_collection_modifyitems(config, items):
    # the simulator's runs of tests/sim/ (subprocesses of minutes each on a 2-core CI) first, then
    # the real-model tests (`slow`, tens of seconds each), so that with -n the long ones start
    # early and the workers end on short tests, which work stealing shares out
    items.sort(key=lambda item: (not item.nodeid.startswith(SIMULATOR), not item.get_closest_marker("slow")))
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from impnb.cuda_support import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"gpu test: {reason}")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


def pytest_ignore_collect(collection_path, config):
    """tests/sim/ runs only inside the simulator subprocess (tests/test_simulator.py)."""
    if collection_path.name == "sim" and collection_path.parent == Path(__file__).parent:
        return os.environ.get("NUMBA_ENABLE_CUDASIM") != "1"
    return None


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """-n's default (load) hands out long runs of consecutive tests, so one worker can be left with
    a slow stretch (the kernel builds) while the others idle; work stealing splits the tests in
    halves and an idle worker takes half of a busy one's queue."""
    if config.getvalue("dist") == "load":
        from xdist.scheduler import WorkStealingScheduling

        return WorkStealingScheduling(config, log)
    return None
