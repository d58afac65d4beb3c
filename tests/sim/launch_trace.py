"""Record, without running them, the kernel launches and cuBLAS calls an engine makes under the
CUDA simulator: kernel (name and the values its factory closed over), grid, block, shared bytes,
cluster, and every argument (a buffer as (first-use index, byte offset, shape, strides, dtype),
scalars by value). Two traces are equal when the same kernels get the same arguments in the same
order on the same buffers: what a restructuring of the GPU path must keep.

    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=TREE python TREE/tests/sim/launch_trace.py OUT.json [CASE ...]
    python tests/sim/launch_trace.py --compare A.json B.json

The cases (`cases`): tiny qwen3 / qwen3moe (impnb/synthetic.py) in Q8_0, Q8_0 with a Q4_1 V and
F32, with every GEMV on dp4a, qkv_post apart, split-K only, no GEMV
tails; tiny gemma4 (dense, MoE, 26B-A4B-like heads; all-dp4a with the residual tails on dp4a);
SmolLM2 and Gemma3 270M where installed, plain and all-dp4a; and, as on an H100 (compute
capability 9.0) with CUDA graphs captured and replayed (lookahead, a forced token), tiny and real
models again. Each runs a prompt, decode steps and teacher-forced logits (see the scripts). The launchers of kernels the
simulator cannot build (wgmma attention, the GEMM tiles) are recorded as calls (WRAPPED).
"""

import enum
import json
import os
import sys
import types as pytypes
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[2]))

DEPTH = 4


class Recorder:
    """Canonical form of launches; buffers numbered in order of first use."""

    def __init__(self):
        self.calls, self._bufs = [], {}

    def buffer(self, ary) -> list:
        a = ary._ary
        base = a
        while isinstance(base.base, np.ndarray):
            base = base.base
        start = base.__array_interface__["data"][0]
        key = (start, base.nbytes)
        idx = self._bufs.setdefault(key, len(self._bufs))
        return ["buf", idx, a.__array_interface__["data"][0] - start, list(a.shape), list(a.strides), a.dtype.str]

    def value(self, v, depth=0):
        if hasattr(v, "_ary"):
            return self.buffer(v)
        if isinstance(v, (bool, int, float, str)) or v is None:
            return v
        if isinstance(v, enum.Enum):
            return f"{type(v).__name__}.{v.name}"
        if isinstance(v, np.generic):
            return [v.dtype.str, v.item()]
        if isinstance(v, np.ndarray):
            return ["host", v.dtype.str, v.tolist()]
        if isinstance(v, (tuple, list)):
            return [self.value(x, depth) for x in v]
        if isinstance(v, dict):
            return {str(k): self.value(x, depth) for k, x in v.items()}
        if isinstance(v, np.dtype) or isinstance(v, type):
            return str(v)
        fn = getattr(v, "py_func", None) or (v if isinstance(v, pytypes.FunctionType) else None)
        if fn is not None:
            return self.function(fn, depth)
        return type(v).__name__

    def function(self, fn, depth):
        out = [fn.__module__, fn.__qualname__]
        if depth < DEPTH and fn.__closure__:
            out.append([self.value(c.cell_contents, depth + 1) for c in fn.__closure__
                        if not isinstance(c.cell_contents, (pytypes.ModuleType,))])
        return out

    def launch(self, kernel, grid, block, stream, *args, shared_bytes=0, cluster=None, programmatic=True):
        call = {"kernel": self.function(kernel.py_func, 0), "grid": self.value(grid),
                "block": self.value(block), "shared": shared_bytes, "cluster": self.value(cluster),
                "args": [self.value(a) for a in args]}
        if not programmatic:  # only where asked, so traces of trees without the keyword compare
            call["plain"] = True
        self.calls.append(call)

    def cublas(self, method):
        def call(*args, **kwargs):
            self.calls.append({"cublas": method, "args": [self.value(a) for a in args],
                               "kwargs": self.value(kwargs)})
        return call


class FakeCublas:
    def __init__(self, rec):
        for name in ("gemm_f16", "gemm_f16_batched", "gemm_f32"):
            setattr(self, name, rec.cublas(name))


_current: list = []  # the recorder launches go to


def _launch(*args, **kwargs):
    _current[-1].launch(*args, **kwargs)


def patch_launches(rec: Recorder) -> None:
    """Every impnb module's `launch` (bound at its import) -> rec.launch, from now on."""
    import importlib
    import pkgutil

    import impnb.kernels
    import impnb.launch

    _current.append(rec)
    for mod in pkgutil.walk_packages(impnb.kernels.__path__, "impnb.kernels."):
        importlib.import_module(mod.name)
    original = impnb.launch.launch
    for name, module in list(sys.modules.items()):
        if name.startswith("impnb") and getattr(module, "launch", None) is original:
            module.launch = _launch


WRAPPED = ("gemm_quant", "gemm_wgmma_quant", "attention_wgmma")  # launchers whose kernels the simulator cannot build


def patch_wrappers(rec: Recorder) -> None:
    """The launchers of kernels the simulator cannot build (wgmma, mma.sync tiles), wherever impnb
    bound them, -> records of their calls."""
    import impnb.kernels.attention.attention_wgmma as aw
    import impnb.kernels.gemm.gemm_tc_quant as tq
    import impnb.kernels.gemm.gemm_wgmma_quant as wq

    originals = {"gemm_quant": tq.gemm_quant, "gemm_wgmma_quant": wq.gemm_wgmma_quant,
                 "attention_wgmma": aw.attention_wgmma}
    for name, fn in originals.items():
        def call(*args, _name=name, **kwargs):
            _current[-1].calls.append({"wrapper": _name, "args": [_current[-1].value(a) for a in args],
                                       "kwargs": _current[-1].value(kwargs)})
        for mod_name, module in list(sys.modules.items()):
            if mod_name.startswith("impnb") and getattr(module, name, None) is fn:
                setattr(module, name, call)


class FakeGraph:
    """engine_cuda's Graph on the simulator: the body's launches recorded between markers, replays
    recorded by the graph's number."""

    count = 0

    def __init__(self, handle, body):
        rec, self.id = _current[-1], FakeGraph.count
        FakeGraph.count += 1
        rec.calls.append({"capture": self.id})
        body()
        rec.calls.append({"captured": self.id})
        self.n_nodes = 0

    def replay(self):
        _current[-1].calls.append({"replay": self.id})


class FakeReplays:
    """graphs/replays.Replays on the simulator: each replay's token is 1."""

    def launch(self, graph, token):
        graph.replay()
        return pytypes.SimpleNamespace(slot=0, token=token)

    def collect(self, ticket):
        return 1


def run_case(rec: Recorder, path, n_ctx: int, env: dict, script, cc=(8, 0), graphs=False) -> None:
    import impnb.engine_cuda as engine_cuda
    from impnb.engine_cuda import CudaEngine
    from impnb.gguf_file import open_model_file
    from impnb.sampling import SamplingParams

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        engine = CudaEngine(open_model_file(path), n_ctx, graphs=False)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    dev = getattr(engine, "m", None)
    dev.cublas = FakeCublas(rec)
    if hasattr(dev, "mm"):
        dev.mm.cublas = dev.cublas
    dev.ctx.device = pytypes.SimpleNamespace(compute_capability=cc)  # (9, 0): prefill attention on wgmma
    if graphs:
        engine_cuda.Graph, FakeGraph.count = FakeGraph, 0
        engine.use_graphs, engine.graph_disabled, engine.replays = True, None, FakeReplays()
    engine._checked = lambda token: token & 0xFFFF  # nothing ran: out_ids holds whatever it held
    engine.reset(SamplingParams(temperature=0))
    script(engine)


def script_decode(engine):
    """A 10-token prompt (prefill, one chunk), 4 steps (with graphs: one forced token, so a replay
    after a drain), then teacher-forced logits of 1 and 3 tokens and a 20-token chunk."""
    engine.prefill(list(range(1, 11)))
    token = engine.step(5)
    for i in range(3):
        token = engine.step(token if i != 1 else 7)
    engine.logits([7])
    engine.logits([8, 9, 10])
    engine.logits(list(range(20, 40)))


def script_small(engine):
    """A 3-token prompt (no prefill graph bucket needed: decode-sized chunk) and 2 steps."""
    engine.prefill([1, 2, 3])
    engine.step(4)
    engine.step(5)


DP4A = {"IMPNB_DP4A_MIN_MB": "0", "IMPNB_DP4A_MIN_K": "0"}


def cases(tmp: Path) -> dict:
    """name -> (model path or None where absent, n_ctx, env, script)."""
    from impnb.synthetic import tiny_gguf

    out = {}
    for arch in ("qwen3", "qwen3moe"):
        for q in ("Q8_0", "Q8_0_V_Q4_1", "F32"):
            _, path = tiny_gguf(arch, q, tmp, seed=1)
            out[f"{arch}-{q}"] = (path, 64, {}, script_decode)
            if q != "F32":
                out[f"{arch}-{q}-dp4a"] = (path, 64, DP4A, script_decode)
    out["qwen3moe-Q8_0-apart"] = (tmp / "tiny-qwen3moe-q8_0-s1.gguf", 64, {"IMPNB_FUSED_POST_DIMS": ""},
                                  script_decode)
    out["qwen3moe-Q8_0-dp4a-apart"] = (tmp / "tiny-qwen3moe-q8_0-s1.gguf", 64,
                                       {**DP4A, "IMPNB_FUSED_POST_DIMS": ""}, script_decode)
    out["qwen3-Q8_0-split"] = (tmp / "tiny-qwen3-q8_0-s1.gguf", 64, {"IMPNB_SHORT_DECODE_MAX": "0"}, script_decode)
    out["qwen3-Q8_0-notail"] = (tmp / "tiny-qwen3-q8_0-s1.gguf", 64,
                                {"IMPNB_GEMV_TAIL": "0", "IMPNB_GEMV_PAIR": "0"}, script_decode)
    from impnb.model_registry import resolve_model

    for name, model in (("smollm2", "smollm2-135m"), ("gemma3", "gemma3-270m")):
        try:
            path = resolve_model(model)
        except Exception:
            continue
        out[name] = (path, 64, {}, script_small)
        out[name + "-dp4a"] = (path, 64, DP4A, script_small)
        out[name + "-h100-graphs"] = (path, 64, {}, script_decode, (9, 0), True)
        out[name + "-h100-dp4a-graphs"] = (path, 64, DP4A, script_decode, (9, 0), True)
    from impnb.synthetic_full_gemma4 import TINY_SHAPES, write_full_gguf as write_gemma4

    for v in TINY_SHAPES:  # gemma4's own layer loop (gpu/forward_gemma4.py)
        path = tmp / f"tiny-gemma4-{v}.gguf"
        write_gemma4(path, TINY_SHAPES[v], seed=1, workers=1)
        out[f"gemma4-{v}-h100-graphs"] = (path, 64, {}, script_decode, (9, 0), True)
        out[f"gemma4-{v}-dp4a-tail"] = (path, 64, {**DP4A, "IMPNB_DP4A_TAIL": "1"}, script_decode)
    for arch in ("qwen3", "qwen3moe"):
        out[f"{arch}-Q8_0-h100-graphs"] = (tmp / f"tiny-{arch}-q8_0-s1.gguf", 64, {}, script_decode, (9, 0), True)
        out[f"{arch}-Q8_0-dp4a-graphs"] = (tmp / f"tiny-{arch}-q8_0-s1.gguf", 64, DP4A, script_decode, (9, 0), True)
    return out


def compare(path_a: str, path_b: str) -> int:
    """Print, case by case, whether two recorded traces are equal (else the first differing
    call of each); the number of cases that differ."""
    a, b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))
    bad = 0
    for name, ta in a.items():
        tb = b.get(name)
        if ta == tb:
            print(f"{name}: {len(ta)} calls equal")
            continue
        bad += 1
        if tb is None:
            print(f"{name}: missing from {path_b}")
            continue
        i = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        print(f"{name}: differ at call {i} of {len(ta)} / {len(tb)}")
        for call in (ta, tb):
            print("   ", json.dumps(call[i])[:800] if i < len(call) else "(none)")
    print("all equal" if not bad else f"{bad} cases differ")
    return bad


def main():
    import tempfile

    if sys.argv[1] == "--compare":
        sys.exit(1 if compare(*sys.argv[2:4]) else 0)
    out, only = sys.argv[1], sys.argv[2:]
    traces = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, n_ctx, env, script, *how) in cases(Path(tmp)).items():
            if only and name not in only:
                continue
            rec = Recorder()
            patch_launches(rec)
            patch_wrappers(rec)
            run_case(rec, path, n_ctx, env, script, *how)
            traces[name] = rec.calls
            print(f"{name}: {len(rec.calls)} calls", flush=True)
    Path(out).write_text(json.dumps(traces))


if __name__ == "__main__":
    main()
