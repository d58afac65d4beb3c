"""Start-up: the CPU path and `info` import no GPU module (numba, cuda, impnb's GPU packages)."""

import json
import os
import subprocess
import sys

import pytest

GPU_MODULES = ("numba", "llvmlite", "cuda.core", "impnb.gpu", "impnb.launch", "impnb.graphs",
               "impnb.engine_cuda", "impnb.kernels.common", "impnb.kernels.gemv")

_PROBE = """
import json, sys
from impnb.cli import main
code = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "llvmlite") or m.startswith({gpu!r}))
print(json.dumps([code, loaded]), file=sys.stderr)
"""


def gpu_modules_after(*argv) -> list[str]:
    """Run the CLI with argv in a fresh interpreter; the GPU modules it imported."""
    probe = _PROBE.format(gpu=tuple(m for m in GPU_MODULES if "." in m))
    proc = subprocess.run([sys.executable, "-c", probe, *map(str, argv)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    code, loaded = json.loads(proc.stderr.strip().splitlines()[-1])
    assert code == 0, proc.stderr
    return loaded


def test_info_imports_no_gpu_module(smollm2_path):
    assert gpu_modules_after("info", smollm2_path) == []


@pytest.mark.slow
def test_cpu_generate_imports_no_gpu_module(smollm2_path):
    assert gpu_modules_after("generate", "Hi", "-m", smollm2_path, "-n", "1", "--device", "cpu") == []


def run_cli(*argv, timeout=600):
    return subprocess.run([sys.executable, "-m", "impnb", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def test_version_and_usage_name_impnb():
    from impnb import __version__

    proc = run_cli("--version")
    assert (proc.returncode, proc.stdout.strip()) == (0, f"impnb {__version__}")
    proc = run_cli("generate", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: impnb generate")


def test_help_shows_defaults():
    from impnb.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    generate = sub["generate"].format_help()
    for text in ("(default 128)", "(default 0.8)", "(default 40)", "(default 0)", "(default 4096)",
                 "(default auto)", "(default gemma3-270m)"):
        assert text in generate, text
    assert "(default None)" not in generate and "(default False)" not in generate
    assert "(default 5)" in sub["bench"].format_help()


@pytest.mark.slow
def test_chat_without_a_template_names_the_fallback(gemma3_path):
    proc = run_cli("generate", "Hi", "-m", gemma3_path, "--chat", "-n", "1", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "no chat template" in proc.stderr and "Gemma 3 template" in proc.stderr


_ENTRY = """
import atexit, sys
atexit.register(lambda: print("teardown ran", file=sys.stderr, flush=True))
sys.argv = ["impnb", *sys.argv[1:]]
from impnb.cli import entry
entry()
"""


def test_info_ends_without_the_teardown_and_other_commands_with_it(smollm2_path):
    """entry() ends `info` and `generate` at once (no atexit handler, no module teardown) with
    their output flushed and their exit status; the others, and a usage error, exit normally."""
    def run(*argv):
        return subprocess.run([sys.executable, "-c", _ENTRY, *map(str, argv)], capture_output=True, text=True,
                              timeout=600)

    info = run("info", smollm2_path)
    assert info.returncode == 0 and "llama" in info.stdout and "teardown ran" not in info.stderr, info.stderr
    missing = run("info", "/nonexistent/model.gguf")
    assert missing.returncode == 2 and "teardown ran" not in missing.stderr
    assert [line for line in missing.stderr.splitlines() if line.startswith("impnb: error:")], missing.stderr
    other = run("bench-serve", "--url", "http://127.0.0.1:9", "--concurrency", "x")
    assert other.returncode == 2 and "teardown ran" in other.stderr, other.stderr



@pytest.mark.slow
def test_generate_ends_without_the_teardown_its_text_and_stats_out(smollm2_path):
    """generate's tokens (stdout) and its stats line (stderr) are flushed before the quick exit."""
    proc = subprocess.run([sys.executable, "-c", _ENTRY, "generate", "The capital of France is", "-m",
                           str(smollm2_path), "-n", "3", "--temperature", "0", "--device", "cpu"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "generated 3 tokens" in proc.stderr and "teardown ran" not in proc.stderr

_HIDDEN = """
import json, sys
from impnb.numba_import import import_numba
import_numba()
seen = [m for m in ("coverage", "scipy") if m in sys.modules]
import coverage, scipy  # afterwards they import as usual
print(json.dumps([seen, "numba.cuda" in sys.modules, coverage.MARK, scipy.MARK]))
"""


def test_numba_is_imported_without_coverage_and_scipy(tmp_path):
    """numba imports coverage and scipy when installed; import_numba hides them while it loads
    and leaves them importable after (stand-in packages here record whether they loaded)."""
    for name in ("coverage", "scipy"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MARK = {name!r}\n__version__ = '9.0'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _HIDDEN], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[], True, "coverage", "scipy"]


def test_dispatcher_signatures_shared_per_code_object_only_where_equal():
    import inspect

    from impnb.launch.signatures import pysignature

    def make(k):
        def body(a, b, *rest):
            return a + b + k
        return body

    f, g = make(1), make(2)
    assert pysignature(f) is pysignature(g) and pysignature(f) == inspect.signature(f)

    def with_default(a, b=1):
        return a + b

    def annotated(a: int) -> int:
        return a

    for fn in (with_default, annotated):
        assert pysignature(fn) == inspect.signature(fn)
    assert str(pysignature(with_default)) == "(a, b=1)"


def test_gpu_path_dispatchers_use_the_shared_signatures():
    probe = ("import impnb.kernels.gemv.gemv\nfrom numba.cuda import dispatcher\n"
             "from impnb.launch.signatures import pysignature\nprint(dispatcher.utils.pysignature is pysignature)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip() == "True", proc.stderr


# a child process's prologue: every numba dispatcher made from here on is noted in `made` (its
# kernel's module), for the probes here and in tests/gpu/test_startup.py
COUNT_DISPATCHERS = """
import json, sys
from numba.cuda import dispatcher
made = []
init = dispatcher.CUDADispatcher.__init__
def counting(self, py_func, *args, **kwargs):
    made.append(py_func.__module__)
    init(self, py_func, *args, **kwargs)
dispatcher.CUDADispatcher.__init__ = counting
"""
_DISPATCHERS = COUNT_DISPATCHERS + """
import impnb.engine_cuda, impnb.engine_batch, impnb.warmup
print(len(made))
"""


def test_gpu_path_import_makes_few_dispatchers():
    """Importing the CUDA engines makes kernels' dispatchers only for module-level @cuda.jit
    functions: the factory kernels (GEMV variants, attention tables, the build checks' lists)
    are made at their first use, not at import (every variant made at import is thousands)."""
    proc = subprocess.run([sys.executable, "-c", _DISPATCHERS], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) < 400


def test_info_and_the_gpu_path_import_no_reference_model(smollm2_path):
    """The numpy layer graph (models/layers.py, numpy_ops.py) loads only with the reference model:
    not for `info`, nor with the CUDA engine's modules."""
    probe = ("import io, sys\nfrom impnb.cli import main\nsys.stdout = io.StringIO()\n"
             f"code = main(['info', {str(smollm2_path)!r}])\n"
             "import impnb.engine_cuda, impnb.commands.generate, impnb.serve.runners\n"
             "sys.stdout = sys.__stdout__\n"
             "print(code, sorted(m for m in sys.modules if m in ('impnb.models.layers', 'impnb.models.numpy_ops', 'jinja2')))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert proc.stdout.split() == ["0", "[]"], proc.stdout + proc.stderr


def test_cublas_is_made_at_the_first_gemm_only():
    """A model that never takes a cuBLAS path pays neither nvmath's import nor the handle."""
    probe = ("import sys\n"
             "from impnb.gpu.cublas_gemm import Cublas\n"
             "c = Cublas(ctx=None)\n"
             "c.close()\n"
             "print(c.handle, 'nvmath' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "False"]


def test_bench_prints_its_head_before_the_load_and_each_row_as_measured(smollm2_path, monkeypatch):
    """The table's head is out before the engine loads, and each row is flushed before the next
    test's warm-up starts (a CPU bench runs for minutes)."""
    from impnb.cli import build_parser
    from impnb.commands import bench

    events = []

    class Out:
        def write(self, s):
            if s.strip():
                events.append(("row" if "tok" not in s and "|" in s and ("pp" in s or "tg" in s) else "text", s))
            return len(s)

        def flush(self):
            events.append(("flush", ""))

    class Engine:
        device = "cpu"

        def __init__(self, mf, n_ctx):
            events.append(("load", ""))

    monkeypatch.setattr(bench, "engine_class", lambda device, arch, cfg=None: Engine)
    monkeypatch.setattr(bench, "_pp", lambda engine, ids, depth: events.append(("run", "pp")) or 100.0)
    monkeypatch.setattr(bench, "_tg", lambda engine, n, depth: events.append(("run", "tg")) or 10.0)
    monkeypatch.setattr(sys, "stdout", Out())
    args = build_parser().parse_args(["bench", "-m", str(smollm2_path), "-p", "8,16", "-n", "2", "-r", "2",
                                      "--device", "cpu"])
    assert bench.run(args) == 0
    kinds = [k for k, _ in events]
    assert kinds.index("flush") < kinds.index("load"), events  # the head is out before the load
    rows_at = [i for i, k in enumerate(kinds) if k == "row"]
    assert len(rows_at) == 3 and all(kinds[i + 1] == "flush" for i in rows_at), events
    runs_at = [i for i, k in enumerate(kinds) if k == "run"]
    assert rows_at[0] < runs_at[3] and rows_at[1] < runs_at[6], events  # a row before the next test runs
