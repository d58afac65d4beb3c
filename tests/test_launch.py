"""impnb.launch without a GPU: cache keys, the on-disk cubin cache, numba's kernel ABI (parameter
list against the PTX numba emits, values against numba's own _prepare_args), cubins for sm_90."""

import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda, types
from numba.cuda.cudadrv.devicearray import DeviceNDArray
from numba.cuda.cudadrv.driver import MemoryPointer, binding
from numba.cuda.dispatcher import _Kernel
from numba.cuda.typing.typeof import Purpose, typeof

from impnb.kernels.elementwise import embedding, norm
from impnb.kernels.gemv import gemv
from impnb.kernels.sample import sample_penalty
from impnb.launch import cache
from impnb.launch.args import flatten, param_codes, signature
from impnb.launch.cubin import compile_cubin, entry_name

CC = (9, 0, "a")
pytestmark = pytest.mark.usefixtures("numba_without_spare_copies")
ROOT = Path(__file__).parents[1]
F32 = types.float32[::1]


def _scale(y, x, a):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = x[i] * a


_scale_kernel = cuda.jit(_scale)
_SCALE_SIG = (F32, F32, types.float32)
_GEMV_SIG = gemv.build_signatures()[0][1].args  # (Tuple(u32[::1], f16[::1]), f32[:, ::1] x 2, int32)


def gemv_q8(n_tok=1, span=128):
    return gemv.gemv_kernel(T.Q8_0, n_tok, span)


# ---------------------------------------------------------------- cache keys

def key_in_another_process(imports: str, call: str) -> str:
    """cache_key(call) (a Python expression), printed by a new interpreter after `imports`."""
    code = (f"from gguf import GGMLQuantizationType as T; from impnb.launch.cache import cache_key; {imports}; "
            f"print(cache_key({call}, (9, 0, 'a')))")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()[-1]


def test_key_is_the_same_in_another_process():
    out = key_in_another_process("from impnb.kernels.gemv import gemv",
                                 "gemv.gemv_kernel(T.Q8_0, 1, 128), gemv.build_signatures()[0][1].args")
    assert out == cache.cache_key(gemv_q8(), _GEMV_SIG, CC)


def test_key_changes_with_closure_signature_options_and_target():
    base = cache.cache_key(gemv_q8(), _GEMV_SIG, CC)
    others = [
        cache.cache_key(gemv.gemv_kernel(T.Q4_0, 1, 128), _GEMV_SIG, CC),  # closure: decoders
        cache.cache_key(gemv_q8(n_tok=2), _GEMV_SIG, CC),                 # closure: an int
        cache.cache_key(gemv_q8(span=64), _GEMV_SIG, CC),
        cache.cache_key(gemv_q8(), _GEMV_SIG[:3] + (types.int64,), CC),   # signature
        cache.cache_key(gemv_q8(), _GEMV_SIG, (8, 0, "")),                # target
    ]
    assert len({base, *others}) == 1 + len(others)
    keys = {cache.cache_key(cuda.jit(**opts)(_scale), _SCALE_SIG, CC)
            for opts in ({}, {"max_registers": 32}, {"max_registers": 64}, {"fastmath": True})}
    assert len(keys) == 4
    same = cache.cache_key(cuda.jit(_scale), _SCALE_SIG, CC)
    assert same == cache.cache_key(_scale_kernel, _SCALE_SIG, CC)


def _from_string(value: int, body: str = "y[0] = V"):
    scope = {"V": value}
    exec(f"def k(y):\n    {body}\n", scope)
    return cuda.jit(scope["k"])


def test_key_of_a_kernel_made_from_a_string_follows_its_code_and_globals():
    """No file holds an exec'd kernel's source (gemm_mmq generates its kernels): its bytecode and
    the globals it reads make its key, so variants of one name and signature never share a cubin."""
    base = cache.cache_key(_from_string(1), (F32,), CC)
    assert base is not None and base == cache.cache_key(_from_string(1), (F32,), CC)
    assert cache.cache_key(_from_string(2), (F32,), CC) != base  # a global's value
    assert cache.cache_key(_from_string(1, "y[1] = V"), (F32,), CC) != base  # the code
    from impnb.kernels.gemm import gemm_mmq

    sig = types.void(gemm_mmq.U32_2D, gemm_mmq.F32_3D, gemm_mmq.parts_type(T.Q4_K), gemm_mmq.F32_3D).args
    keys = {cache.cache_key(gemm_mmq.gemm_mmq_kernel(T.Q4_K, ni, 0, mt, ring), sig, CC)
            for ni in (1, 2, 4) for mt, ring in ((2, False), (4, False), (1, True), (2, True))}
    assert len(keys) == 12 and None not in keys  # the W ring's bodies too
    out = key_in_another_process("from numba.cuda import types; from impnb.kernels.gemm import gemm_mmq as g",
                                 "g.gemm_mmq_kernel(T.Q4_K, 4, 0, 2), "
                                 "types.void(g.U32_2D, g.F32_3D, g.parts_type(T.Q4_K), g.F32_3D).args")
    assert out == cache.cache_key(gemm_mmq.gemm_mmq_kernel(T.Q4_K, 4, 0, 2), sig, CC)


def test_key_changes_with_the_source(tmp_path, monkeypatch):
    src = tmp_path / "kernel_src.py"
    src.write_text("from numba import cuda\n\n@cuda.jit\ndef k(y):\n    y[0] = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import kernel_src

    before = cache.cache_key(kernel_src.k, (F32,), CC)
    src.write_text(src.read_text() + "# edited\n")
    cache._file_digest.cache_clear()
    assert cache.cache_key(kernel_src.k, (F32,), CC) != before


def _const_kernel(value):
    """A kernel calling an @intrinsic that emits `value`: the value sits in the intrinsic's closure."""
    from numba.cuda.extending import intrinsic

    @intrinsic
    def const(typingctx):
        def codegen(context, builder, signature, args):
            return context.get_constant(types.float32, value)
        return types.float32(), codegen

    def k(y):
        y[0] = const()

    return cuda.jit(k)


def test_intrinsic_closures_are_keyed_by_their_values():
    one, two = (cache.cache_key(_const_kernel(v), (F32,), CC) for v in (1.0, 2.0))
    assert one and two and one != two
    assert cache.cache_key(_const_kernel(1.0), (F32,), CC) == one


def test_unstable_closure_value_disables_the_disk_cache():
    marker = object()

    def k(y):
        y[0] = 1.0 if marker else 0.0

    assert cache.cache_key(cuda.jit(k), (F32,), CC) is None


# ---------------------------------------------------------------- the disk cache

@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IMPNB_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(cache, "_memory", {})
    monkeypatch.setattr(cache, "stats", cache.Counter())
    return tmp_path / "kernels"


def _get():
    cache._memory.clear()
    return cache.get_cubin(_scale_kernel, _SCALE_SIG, CC)


def test_cubin_is_written_once_and_read_back(cache_dir, monkeypatch):
    cubin = _get()
    files = list(cache_dir.iterdir())
    assert [f.suffix for f in files] == [".cubin"] and cache.stats["compiled"] == 1
    monkeypatch.setattr(cache, "compile_cubin", lambda *a: pytest.fail("compiled despite the cache"))
    assert _get() == cubin and cache.stats["disk"] == 1
    assert cache.get_cubin(_scale_kernel, _SCALE_SIG, CC) == cubin and cache.stats["memory"] == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_entry_is_rebuilt(cache_dir, damage):
    _get()
    path = next(cache_dir.iterdir())
    data = path.read_bytes()
    path.write_bytes({"garbage": np.random.default_rng(0).bytes(len(data)),
                      "truncated": data[:len(data) // 2], "empty": b""}[damage])
    rebuilt = _get()  # not byte-equal: numba's mangled names count compiles per process
    assert cache.stats["compiled"] == 2 and entry_name(rebuilt)
    assert cache._read(path) == rebuilt


def test_failed_write_leaves_nothing_behind(cache_dir, monkeypatch):
    def crash(*_):
        raise OSError("disk full")

    monkeypatch.setattr(cache.os, "replace", crash)
    assert entry_name(_get())
    assert list(cache_dir.iterdir()) == []


def test_unwritable_cache_dir_only_costs_the_compile(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("IMPNB_CACHE_DIR", str(tmp_path / "file" / "kernels"))
    assert entry_name(_get())


# ---------------------------------------------------------------- numba's kernel ABI

def ptx_param_sizes(kernel, sig) -> list[int]:
    """Byte size of each .param of the kernel's .entry in the PTX numba generates."""
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    head = ptx[ptx.index(".entry"):]
    head = head[:head.index(")")]
    params = re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.[a-z]+(\d+)\s+\w+(?:\[(\d+)\])?", head)
    return [int(n) if n else int(bits) // 8 for bits, n in params]


def _abi_kernel(out, a, i8, u16, i64, f16, f64, flag):
    out[0] = a[0, 0] + i8 + u16 + i64 + float(f16) + f64 + flag


ABI_CASES = {
    "norm": (norm._rms_norm_warp_kernel, norm.build_signatures()[0][1]),
    "gemv_q8_0_tuple": (gemv_q8(), _GEMV_SIG),
    "embedding_q4_k_tuple": (embedding.embedding_kernel(T.Q4_K), embedding.build_signatures()[1][1].args),
    "sample_push": (sample_penalty._push_kernel, sample_penalty.build_signatures()[1][1].args),
    "scalars": (cuda.jit(_abi_kernel), (types.float64[::1], types.float32[:, :], types.int8,
                                        types.uint16, types.int64, types.float16, types.float64,
                                        types.boolean)),
}


@pytest.mark.parametrize("name", list(ABI_CASES))
def test_param_codes_match_the_ptx_entry(name):
    kernel, sig = ABI_CASES[name]
    assert [struct.calcsize("=" + c) for c in param_codes(tuple(sig))] == ptx_param_sizes(kernel, sig)


def fake_device_array(shape, strides, dtype, ptr=0x7F0000001000):
    """A DeviceNDArray over a made-up device pointer (no context needed)."""
    mem = MemoryPointer(None, binding.CUdeviceptr(ptr), 1 << 20)
    return DeviceNDArray(shape, strides, dtype, gpu_data=mem)


ARRAYS = {
    "c2d": fake_device_array((64, 48), (192, 4), np.float32),
    "reshaped": fake_device_array((64, 48), (192, 4), np.float32).reshape(3072),
    "viewed": fake_device_array((64, 48), (192, 4), np.float32).view(np.int32),
    "strided": fake_device_array((64, 4), (192, 4), np.float32, 0x7F0000002000),
    "fortran": fake_device_array((48, 64), (4, 192), np.float16),
    "broadcast": fake_device_array((8, 48), (0, 4), np.float32),
    "unit_dim_zero_stride": fake_device_array((1, 48), (0, 4), np.float32),
    "f64_4d": fake_device_array((2, 3, 4, 5), (480, 160, 40, 8), np.float64),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_array_key_agrees_with_numba_typeof(name):
    a = ARRAYS[name]
    key, _ = [], []
    flatten([a], key, _)
    ty = typeof(a, Purpose.argument)
    assert key == [(a.dtype, ty.ndim, ty.layout)]


class _NumbaArgs:
    """Just enough of numba's _Kernel to run its _prepare_args."""
    extensions = []
    _prepare_args = _Kernel._prepare_args


def test_values_match_numba_prepare_args():
    args = ((ARRAYS["reshaped"], ARRAYS["viewed"]), ARRAYS["strided"], ARRAYS["f64_4d"],
            np.int32(-7), np.float32(1.5), np.float64(2.25), np.uint8(200), True)
    key, values = [], []
    flatten(args, key, values)
    expect = []
    for ty, val in zip(signature(args), args):
        _NumbaArgs()._prepare_args(ty, val, 0, [], expect)
    expect = [getattr(v, "value", v) for v in expect]
    assert values == expect
    assert len(values) == len(param_codes(signature(args)))


def test_host_arrays_are_refused():
    with pytest.raises(TypeError, match="device arrays"):
        signature((np.zeros(3, np.float32),))


# ---------------------------------------------------------------- cubins without a GPU

def test_cubin_for_sm90_without_a_gpu():
    cubin = compile_cubin(_scale_kernel, _SCALE_SIG, CC)
    e_machine, = struct.unpack_from("<H", cubin, 0x12)
    e_flags, = struct.unpack_from("<I", cubin, 0x30)
    assert cubin[:4] == b"\x7fELF" and e_machine == 190  # EM_CUDA
    assert (e_flags >> 8) & 0xFF == 90  # SM version
    assert "_scale" in entry_name(cubin)


def test_debug_kernels_are_refused():
    with pytest.raises(NotImplementedError, match="debug"):
        compile_cubin(cuda.jit(debug=True, opt=False)(_scale), _SCALE_SIG, CC)


def programmatic_cases():
    """(kernel, sig, reads_early) a case: kernels launched early, then kernels that wait first."""
    from impnb.kernels.attention import attention_decode, attention_decode_short, attention_fa2, qkv_post
    from impnb.kernels.deltanet import conv1d, gdn_decode, gdn_prefill
    from impnb.kernels.gemv import gemv_stacked
    from impnb.kernels.moe import gemv_moe_dp4a

    short = [attention_decode_short.build_signatures()[i] for i in (0, 2, 4)]  # plain, post, cluster
    pair = [c for c in gemv_stacked.build_signatures() if c[0].py_func.__name__ == "_gemv_pair_kernel"][:1]
    assert pair
    early = [qkv_post.build_signatures()[0], gemv_moe_dp4a.build_signatures()[0], *short, *pair,
             *(m.build_signatures()[0] for m in (conv1d, gdn_decode, gdn_prefill)), *norm.build_signatures()[:2]]
    late = (attention_decode.build_signatures()[:1]
            + attention_fa2.build_signatures()[:1] + gemv_moe_dp4a.build_signatures()[1:2])
    cases = [(kernel, sig, True) for kernel, sig, _ in early] + [(kernel, sig, False) for kernel, sig, _ in late]
    return [pytest.param(*c, id=f"{i}-{c[0].py_func.__name__}") for i, c in enumerate(cases)]


def test_a_kernel_that_does_not_wait_is_not_launched_early():
    from impnb.launch.launcher import waits_on_grid

    assert not waits_on_grid(cuda.jit(_scale))


@pytest.mark.parametrize("kernel,sig,reads_early", programmatic_cases())
def test_programmatic_launch_only_for_kernels_that_wait(kernel, sig, reads_early):
    """A kernel is launched early (programmatic stream serialization) only when its body, or a
    device function it calls (attention_decode_short's), waits on the grid before its first global
    store, and before its first global load unless it reads early only what the kernel just
    before cannot write (qkv_post: pos, the block table, the norm weight; the experts' down at
    F <= 1024: the experts, their weights and W; the norms: their weights; short decode
    attention: pos, the block table and the cache rows before the step's; gemv_pair, which waits
    in its halves' device function: its first weight chunks; the DeltaNet kernels: slots, lengths,
    weights and the layer's conv or delta-rule state, written by its kernels of an earlier step).
    A case a kernel, so that -n spreads their builds."""
    from impnb.launch.launcher import waits_on_grid

    assert waits_on_grid(kernel), kernel.py_func.__name__
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    wait = ptx.index("griddepcontrol.wait")
    assert wait < ptx.index("st.global")
    assert (wait < ptx.index("ld.global")) != reads_early, kernel.py_func.__name__


def test_launch_configs():
    """cuLaunchKernelEx's attributes: programmatic serialization and / or cluster dims, else none."""
    from cuda.bindings import driver

    from impnb.launch.launcher import _config

    ids = driver.CUlaunchAttributeID
    assert _config(False, None) is None
    c = _config(True, None)
    assert c.numAttrs == 1 and c.attrs[0].id == ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    c = _config(True, (1, 1, 4))
    assert c.numAttrs == 2 and c.attrs[1].id == ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    dim = c.attrs[1].value.clusterDim
    assert (dim.x, dim.y, dim.z) == (1, 1, 4)
    assert _config(False, (2, 1, 1)).numAttrs == 1


def test_a_closure_that_holds_itself_has_no_disk_key():
    """A cycle (a list that holds itself, in a kernel's closure) has no stable repr: compiled in
    each process, never a wrong key or an endless recursion."""
    box = []
    box.append(box)

    def k(y):
        y[0] = len(box)

    assert cache.cache_key(cuda.jit(k), (F32,), CC) is None


def test_every_built_kernel_has_a_disk_key():
    """A kernel without a stable key compiles again in every process: each kernel the build
    checks list (tests/test_kernel_build.py) gets one."""
    from tests.test_kernel_build import _cases

    missing = {c.values[0].py_func.__qualname__ for c in _cases()
               if cache.cache_key(c.values[0], getattr(c.values[1], "args", c.values[1]), CC) is None}
    assert not missing


# ---------------------------------------------------------------- launch configs

def test_launch_configs_carry_programmatic_serialization_only_where_asked():
    """A launch asked to be plain (programmatic=False) gets no programmatic attribute, with or
    without cluster dims; a programmatic one gets it."""
    from cuda.bindings import driver

    from impnb.launch.launcher import _config
    ids = driver.CUlaunchAttributeID
    assert _config(False, None) is None
    programmatic, cluster = _config(True, None), _config(False, (2, 1, 1))  # alive while their attrs are read
    assert [a.id for a in programmatic.attrs] == [ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
    assert [a.id for a in cluster.attrs] == [ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION]


def test_wgmma_rs_launches_plainly_at_the_listed_token_tiles(monkeypatch):
    """gemm_wgmma_rs's kernels (Q4_K, Q6_K and the pair) launch plainly exactly at the token tiles
    tuning.WRS_PLAIN_TOKENS lists."""
    from types import SimpleNamespace

    from impnb.kernels.gemm import gemm_wgmma_rs as rs
    seen = []
    monkeypatch.setattr(rs, "launch", lambda k, g, b, s, *a, programmatic=True, **kw: seen.append((k, programmatic)))
    monkeypatch.setattr(rs, "reduce_parts", lambda *a, **k: None)
    for name in ("gemm_wgmma_rs_staged_kernel", "gemm_wgmma_rs_q6_k_kernel", "gemm_wgmma_rs_pair_kernel"):
        monkeypatch.setattr(rs, name, lambda nt, *a, name=name: (name, nt))
    monkeypatch.setattr(rs.tuning, "WRS_PLAIN_TOKENS", (32,))

    def arr(shape, dtype=np.float32):
        return SimpleNamespace(shape=shape, dtype=np.dtype(dtype), is_c_contiguous=lambda: True)

    K = 1024
    q4 = SimpleNamespace(ggml_type=T.Q4_K, rows=256, cols=K, parts=(None, None))
    q6 = SimpleNamespace(ggml_type=T.Q6_K, rows=128, cols=K, parts=(None, None, None, None))
    for M in (16, 30, 64):
        a = arr((M, K), np.float16)
        rs.gemm_wgmma_rs(a, q4, None, arr((2, M, 256)), 0, 2)
        rs.gemm_wgmma_rs(a, q6, None, arr((2, M, 128)), 0, 2)
        rs.gemm_wgmma_rs_pair(a, q4, q6, (arr((M, 128)), arr((M, 128)), arr((M, 128))), arr((2, M, 384)), 0, 2)
    assert [(k[0], k[1], p) for k, p in seen] == [
        (n, nt, nt != 32) for nt in (16, 32, 64)
        for n in ("gemm_wgmma_rs_staged_kernel", "gemm_wgmma_rs_q6_k_kernel", "gemm_wgmma_rs_pair_kernel")]
