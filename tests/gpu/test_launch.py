"""impnb.launch on the GPU: every wrapper that launches through it gives the bits numba's
dispatcher gives (Gaussian inputs, outputs poisoned with NaN); tuple, strided and scalar
arguments; dynamic shared memory past 48 KB; a launch captured in a CUDA graph; and a second
process with a warm disk cache that compiles nothing.

    python -m pytest -q -m gpu tests/gpu/test_launch.py
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cuda.bindings import driver
from gguf import GGMLQuantizationType as T
from numba import cuda, types

from impnb.kernels.attention import attention_decode, attention_fa2
from impnb.kernels.elementwise import cast, embedding, norm
from impnb.kernels.gemm import dequant
from impnb.kernels.gemv import gemv
from impnb.kernels.common import repack
from impnb.kernels.sample import sample, sample_penalty, step_state
from impnb.kernels.sample import argmax as argmax_kernels
from impnb.launch import launch
from impnb.sampling import SamplingParams
from tests.gpu.test_attention import paged_cache
from tests.test_repack import make_weight

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).parents[2]


def dispatcher(kernel, grid, block, stream, *args, shared_bytes=0):
    if shared_bytes > 48 * 1024:  # numba's launch does not opt in past 48 KB: do it on its function
        kernel = kernel.specialize(*args)
        (compiled,) = kernel.overloads.values()
        handle = compiled._codelibrary.get_cufunc().handle
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        if isinstance(handle, driver.CUkernel):
            err, = driver.cuKernelSetAttribute(attr, shared_bytes, handle, cuda.get_current_device().id)
        else:
            err, = driver.cuFuncSetAttribute(handle, attr, shared_bytes)
        assert err == driver.CUresult.CUDA_SUCCESS, err
    kernel[grid, block, stream, shared_bytes](*args)


def gauss(rng, shape, std=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def nan_like(a: np.ndarray) -> np.ndarray:
    return np.full(a.shape, np.nan, a.dtype) if a.dtype.kind == "f" else np.full(a.shape, -1, a.dtype)


def assert_same_as_dispatcher(monkeypatch, module, run):
    """run(stream) -> host arrays, through launch() and through numba's dispatcher: same bits."""
    stream = cuda.stream()
    got = run(stream)
    with monkeypatch.context() as m:
        m.setattr(module, "launch", dispatcher)
        want = run(stream)
    stream.synchronize()
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes(), f"{np.sum(g.view(np.uint8) != w.view(np.uint8))} bytes differ"


def device_run(wrapper, host_args):
    """A run(stream): fresh device copies of host_args (arrays; others passed as they are),
    wrapper(*device_args, stream), every array copied back."""
    def run(stream):
        dev = [cuda.to_device(a, stream=stream) if isinstance(a, np.ndarray) else a for a in host_args]
        wrapper(*dev, stream)
        out = [d.copy_to_host(stream=stream) for d in dev if hasattr(d, "copy_to_host")]
        stream.synchronize()
        return out
    return run


# ---------------------------------------------------------------- wrappers

@pytest.mark.parametrize("shape", [(19, 2048), (7, 8, 64), (1, 640)])
def test_rms_norm(monkeypatch, shape):
    rng = np.random.default_rng(shape)
    x, h = gauss(rng, shape, 3.0), gauss(rng, shape)
    w, w2 = gauss(rng, shape[-1:]), gauss(rng, shape[-1:])
    out = nan_like(x)
    assert_same_as_dispatcher(monkeypatch, norm, device_run(
        lambda x, w, out, s: norm.rms_norm(x, w, out, 1e-6, s), (x, w, out)))
    if len(shape) == 2:
        assert_same_as_dispatcher(monkeypatch, norm, device_run(
            lambda x, h, w, out, s: norm.rms_norm_add(x, h, w, out, 1e-6, s), (x, h, w, out)))
        assert_same_as_dispatcher(monkeypatch, norm, device_run(
            lambda x, h, wp, w, out, s: norm.rms_norm_post_add(x, h, wp, w, out, 1e-6, s),
            (x, h, w2, w, out)))


def test_cast_f16(monkeypatch):
    x = gauss(np.random.default_rng(1), (111, 640), 3e4)  # saturates past 65504
    out = np.full(x.shape, np.nan, np.float16)
    assert_same_as_dispatcher(monkeypatch, cast, device_run(cast.cast_f16, (x, out)))


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_dequant(monkeypatch, ggml_type):
    w = repack.repack(make_weight(ggml_type, 111, 1024, np.random.default_rng(int(ggml_type))),
                      ggml_type).to_device()
    out = np.full((111, 1024), np.nan, np.float16)
    assert_same_as_dispatcher(monkeypatch, dequant, device_run(
        lambda out, s: dequant.dequant(w, out, s), (out,)))


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.F16], ids=lambda t: t.name)
def test_embedding(monkeypatch, ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    table = repack.repack(make_weight(ggml_type, 989, 1024, rng), ggml_type).to_device()
    ids = rng.integers(0, 989, 19).astype(np.int32)
    out = np.full((19, 1024), np.nan, np.float32)
    assert_same_as_dispatcher(monkeypatch, embedding, device_run(
        lambda ids, out, s: embedding.embedding(table, ids, out, 25.3, s), (ids, out)))


@pytest.mark.parametrize("H,Hkv,D,window,softcap", [(9, 3, 64, None, None), (4, 1, 256, 40, 20.0)])
def test_attention_fa2(monkeypatch, H, Hkv, D, window, softcap):
    rng = np.random.default_rng(D)
    pos0, n_tok = 100, 19
    k_pool, v_pool, block_table, _, _ = paged_cache(rng, [pos0 + n_tok], Hkv, D, 16, 1.0)
    q = gauss(rng, (n_tok, H, D))
    pos = np.arange(pos0, pos0 + n_tok, dtype=np.int32)
    assert_same_as_dispatcher(monkeypatch, attention_fa2, device_run(
        lambda *a: attention_fa2.attention_fa2(*a[:6], D ** -0.5, window, softcap, a[6]),
        (q, k_pool, v_pool, block_table[0], pos, nan_like(q))))


@pytest.mark.parametrize("window,softcap", [(None, None), (40, 20.0)])
def test_attention_decode(monkeypatch, window, softcap):
    rng = np.random.default_rng(11)
    lengths, n_tok, H, Hkv, D = [37, 600], 2, 8, 2, 128
    k_pool, v_pool, block_table, _, _ = paged_cache(rng, lengths, Hkv, D, 16, 1.0)
    q = gauss(rng, (len(lengths), n_tok, H, D))
    pos = np.array([[L - n_tok + t for t in range(n_tok)] for L in lengths], np.int32)
    n_splits = attention_decode.num_splits(600, H, Hkv, n_tok, len(lengths), window)
    partials = np.full(attention_decode.partials_shape(len(lengths), n_splits, n_tok, H, D), np.nan,
                       np.float32)
    counters = np.zeros(attention_decode.counters_shape(len(lengths), n_tok, H), np.int32)
    assert_same_as_dispatcher(monkeypatch, attention_decode, device_run(
        lambda *a: attention_decode.attention_decode(*a[:8], n_splits, D ** -0.5, window, softcap, a[8]),
        (q, k_pool, v_pool, block_table, pos, nan_like(q), partials, counters)))


def test_sampling(monkeypatch):
    rng = np.random.default_rng(5)
    B, V = 2, 9001
    logits = gauss(rng, (B, V), 2.0)
    params = sample.sample_params([SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=1,
                                                  repeat_penalty=1.3),
                                   SamplingParams(temperature=1.0, top_p=0.9, seed=2)])
    history = rng.integers(-1, V, (B, 16)).astype(np.int32)
    step = np.array([7], np.int32)
    ids = np.full(B, -1, np.int32)

    def run_sampling(logits, params, step, ids, s):
        sample.sample(logits, params, step, ids, sample.sample_scratch(B, V), s)

    assert_same_as_dispatcher(monkeypatch, sample_penalty, device_run(
        sample_penalty.repeat_penalty, (logits, history, params)))
    assert_same_as_dispatcher(monkeypatch, sample, device_run(run_sampling, (logits, params, step, ids)))
    assert_same_as_dispatcher(monkeypatch, sample_penalty, device_run(
        sample_penalty.push_history, (rng.integers(0, V, B).astype(np.int32), step, history)))
    assert_same_as_dispatcher(monkeypatch, argmax_kernels, device_run(
        lambda logits, ids, s: argmax_kernels.argmax(logits, ids, argmax_kernels.argmax_scratch(B), s),
        (logits, ids)))


def test_step_advance(monkeypatch):
    state = [np.array([v], np.int32) for v in (1234, 5, 77, 9)]  # out_ids, ids, pos, step
    assert_same_as_dispatcher(monkeypatch, step_state, device_run(step_state.advance, state))


# ---------------------------------------------------------------- argument kinds

def test_tuple_arguments_gemv(monkeypatch):
    rng = np.random.default_rng(7)
    w = repack.repack(make_weight(T.Q8_0, 989, 2048, rng), T.Q8_0).to_device()
    x = gauss(rng, (1, 2048))
    span = gemv.span_for(2048)
    kernel = gemv.gemv_kernel(T.Q8_0, 1, span)
    grid = -(-989 // (gemv.rows_per_block(T.Q8_0, 1) * gemv.BLOCK // span))
    outs = []
    for go in (launch, dispatcher):
        stream = cuda.stream()
        dx, dy = cuda.to_device(x, stream=stream), cuda.to_device(np.full((1, 989), np.nan, np.float32))
        go(kernel, grid, gemv.BLOCK, stream, w.parts, dx, dy, dy, dy, np.int32(989), np.int32(0),
           np.int32(989), np.int32(0))
        outs.append(dy.copy_to_host(stream=stream))
        stream.synchronize()
    assert np.isfinite(outs[0]).all() and outs[0].tobytes() == outs[1].tobytes()


@cuda.jit
def _abi_probe(out, a, i8, u16, i64, f16, f64, flag):
    # one thread: every scalar, and the strided view's shape, strides and weighted sum, as seen
    out[0] = i8
    out[1] = u16
    out[2] = i64
    out[3] = f16
    out[4] = f64
    out[5] = flag
    out[6] = a.shape[0]
    out[7] = a.shape[1]
    out[8] = a.strides[0]
    out[9] = a.strides[1]
    s = 0.0
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            s += a[i, j] * (i * a.shape[1] + j + 1)
    out[10] = s


def test_strided_array_and_scalar_arguments():
    base = gauss(np.random.default_rng(8), (9, 20))
    view = base[1:, ::3]  # (8, 7), strides (80, 12): layout 'A'
    scalars = (np.int8(-5), np.uint16(60000), np.int64(-(2**40)), np.float16(0.333),
               np.float64(1e100), True)
    outs = []
    for go in (launch, dispatcher):
        out = cuda.to_device(np.full(11, np.nan))
        go(_abi_probe, 1, 1, 0, out, cuda.to_device(base)[1:, ::3], *scalars)
        outs.append(out.copy_to_host())
    weights = np.arange(1, view.size + 1, dtype=np.float64).reshape(view.shape)
    want = [*map(float, scalars), 8, 7, 80, 12]
    assert outs[0][:10].tolist() == want
    assert outs[0][10] == pytest.approx((view * weights).sum(), rel=1e-6)
    assert outs[0].tobytes() == outs[1].tobytes()


@cuda.jit
def _reverse_double(x, out):
    # grid 1, block 256: x * 2 staged in dynamic shared memory (x.size floats), written reversed
    buf = cuda.shared.array(0, types.float32)
    n = x.shape[0]
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        buf[i] = x[i] * 2
    cuda.syncthreads()
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        out[i] = buf[n - 1 - i]


def test_dynamic_shared_memory_past_48k():
    x = gauss(np.random.default_rng(9), 24 * 1024)  # 96 KB
    out = cuda.to_device(np.full_like(x, np.nan))
    launch(_reverse_double, 1, 256, 0, cuda.to_device(x), out, shared_bytes=x.nbytes)
    assert np.array_equal(out.copy_to_host(), (x * 2)[::-1])


def test_a_block_past_its_build_names_the_build():
    """A block the build cannot take (more threads than the device's 1024) fails with its
    registers, its most threads a block and its shared memory in the message, nothing launched."""
    x = gauss(np.random.default_rng(10), 64)
    out = cuda.to_device(np.full_like(x, np.nan))
    with pytest.raises(RuntimeError) as failed:
        launch(_reverse_double, 1, 2048, 0, cuda.to_device(x), out, shared_bytes=x.nbytes)
    m = re.search(r"a block of 2048 threads, this build (\d+) registers a thread and at most (\d+) threads a "
                  r"block; (\d+) bytes of static shared memory and 256 dynamic", str(failed.value))
    assert m, str(failed.value)
    regs, most, static = map(int, m.groups())
    assert 0 < regs <= 255 and 32 <= most <= 1024 and static == 0  # its only shared array is the dynamic one
    assert np.isnan(out.copy_to_host()).all()


# ---------------------------------------------------------------- graphs and the disk cache

def test_graph_replay_equals_eager():
    from impnb.graphs.capture import Graph

    rng = np.random.default_rng(10)
    stream = cuda.stream()
    x, w = cuda.to_device(gauss(rng, (19, 2048), 3.0)), cuda.to_device(gauss(rng, 2048))
    out = cuda.to_device(np.full((19, 2048), np.nan, np.float32))
    out16 = cuda.to_device(np.full((19, 2048), np.nan, np.float16))

    def body():
        norm.rms_norm(x, w, out, 1e-6, stream)
        cast.cast_f16(out, out16, stream)

    body()  # warm-up: compile and load before capture
    eager = out16.copy_to_host(stream=stream)
    out16.copy_to_device(np.full((19, 2048), np.nan, np.float16), stream=stream)
    stream.synchronize()
    graph = Graph(int(stream.handle), body)
    try:
        assert graph.n_nodes == 2
        graph.replay()
        replayed = out16.copy_to_host(stream=stream)
        stream.synchronize()
    finally:
        graph.close()
    assert np.isfinite(eager).all() and replayed.tobytes() == eager.tobytes()


WARM_START = """
import json
import numpy as np
from numba import cuda
from impnb.kernels.elementwise import cast, norm
from impnb.launch import cache

rng = np.random.default_rng(0)
x = cuda.to_device(rng.standard_normal((19, 2048)).astype(np.float32))
w = cuda.to_device(rng.standard_normal(2048).astype(np.float32))
out, out16 = cuda.device_array((19, 2048), np.float32), cuda.device_array((19, 2048), np.float16)
norm.rms_norm(x, w, out, 1e-6, 0)
cast.cast_f16(out, out16, 0)
compiled = len(norm.row_kernels(8).norm.overloads) + len(cast._cast_f16_kernel.overloads)  # 2048 columns: 8 a thread
print(json.dumps({"stats": cache.stats, "out": out16.copy_to_host().tobytes().hex(),
                  "numba_compiled": compiled}))
"""


def test_second_process_loads_from_the_disk_cache(tmp_path):
    env = dict(os.environ, IMPNB_CACHE_DIR=str(tmp_path / "kernels"))
    runs = [json.loads(subprocess.run([sys.executable, "-c", WARM_START], cwd=ROOT, env=env,
                                      capture_output=True, text=True, check=True).stdout)
            for _ in range(2)]
    assert runs[0]["stats"] == {"compiled": 2}
    assert runs[1]["stats"] == {"disk": 2}
    assert runs[0]["numba_compiled"] == runs[1]["numba_compiled"] == 0
    assert runs[1]["out"] == runs[0]["out"]
