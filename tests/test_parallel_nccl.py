"""parallel/nccl.py and comm.py on the CPU: importing needs no library; a missing libnccl is one
ParallelError; against a stand-in libnccl built here from C (it takes host pointers: a world of
two ranks holding the same array) the binding passes every argument through (pointers, counts,
types, the 128-byte id by value, root, communicator and stream handles), and the set-up watchdog
ends a hung ncclCommInitRank with a ParallelError in time."""

import ctypes
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from impnb.errors import ParallelError
from impnb.parallel import nccl
from impnb.parallel.comm import Communicator

FAKE_NCCL = r"""
#include <string.h>
#include <stddef.h>
#include <unistd.h>
typedef struct { char internal[128]; } ncclUniqueId;
static ncclUniqueId seen_id;
static long long last[8];  /* count, dtype, op, stream, comm, root, rank, nranks */
static int comm_token = 0x5eed;
static size_t size_of(int t) { return t == 6 ? 2 : (t == 4 || t == 5 || t == 8) ? 8 : (t <= 1 ? 1 : 4); }
int ncclGetVersion(int* v) { *v = 22805; return 0; }
int ncclGetUniqueId(ncclUniqueId* u) { for (int i = 0; i < 128; i++) u->internal[i] = (char)(i * 7 + 3); return 0; }
int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
  if (rank == 99) for (;;) usleep(100000);   /* a peer that never comes: hangs */
  if (rank == 98) return 3;                  /* ncclInternalError */
  seen_id = id; last[6] = rank; last[7] = nranks; *comm = &comm_token; return 0;
}
int ncclCommDestroy(void* c) { return 0; }
int ncclCommAbort(void* c) { return 0; }
int ncclCommGetAsyncError(void* c, int* r) { *r = 0; return 0; }
int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }
const char* ncclGetErrorString(int r) { return r == 3 ? "internal error (stand-in)" : "stand-in"; }
static void note(size_t n, int t, int op, void* c, void* s, int root) {
  last[0] = n; last[1] = t; last[2] = op; last[3] = (long long)s; last[4] = (long long)c; last[5] = root;
}
int ncclAllReduce(const void* a, void* b, size_t n, int t, int op, void* c, void* s) {
  note(n, t, op, c, s, -1);
  if (t == 7) for (size_t i = 0; i < n; i++) ((float*)b)[i] = 2 * ((const float*)a)[i];
  else memmove(b, a, n * size_of(t));
  return 0;
}
int ncclAllGather(const void* a, void* b, size_t n, int t, void* c, void* s) {
  note(n, t, -1, c, s, -1);
  memmove(b, a, n * size_of(t)); memmove((char*)b + n * size_of(t), a, n * size_of(t)); return 0;
}
int ncclBroadcast(const void* a, void* b, size_t n, int t, int root, void* c, void* s) {
  note(n, t, -1, c, s, root); memmove(b, a, n * size_of(t)); return 0;
}
void fake_last(long long* out) { memcpy(out, last, sizeof last); }
void fake_id(char* out) { memcpy(out, seen_id.internal, 128); }
int* fake_comm(void) { return &comm_token; }
"""


class HostArray:
    """A numpy array presented as a device array (the stand-in reads host pointers)."""

    def __init__(self, a: np.ndarray):
        self.a, self.dtype = a, a.dtype
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
                                         "strides": None if a.flags.c_contiguous else a.strides, "version": 3}


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in libnccl")
    d = tmp_path_factory.mktemp("nccl")
    (d / "fake_nccl.c").write_text(FAKE_NCCL)
    so = d / "libnccl.so.2"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(d / "fake_nccl.c")], check=True)
    return so


@pytest.fixture
def lib(fake_lib, monkeypatch):
    monkeypatch.setenv("IMPNB_NCCL_LIBRARY", str(fake_lib))
    monkeypatch.setattr(nccl, "_loaded", None)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    loaded = nccl.library()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"  # multicast forced off in every process that loads it
    return loaded


def last(lib) -> list:
    out = (ctypes.c_longlong * 8)()
    lib.lib.fake_last(out)
    return list(out)


def test_import_needs_no_library():
    code = "import impnb.parallel.group, impnb.parallel.comm, impnb.parallel.nccl, impnb.engine_cuda; print('ok')"
    env = dict(os.environ, IMPNB_NCCL_LIBRARY="/nonexistent/libnccl.so.2")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_missing_library_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(nccl, "_loaded", None)
    monkeypatch.setattr(nccl, "candidates", lambda: [str(tmp_path / "libnccl.so.2"), "libnccl-none.so.9"])
    with pytest.raises(ParallelError, match="tensor parallelism needs NCCL.*nvidia-nccl-cu13") as e:
        nccl.library()
    assert "\n" not in str(e.value)


def test_arguments_pass_through(lib):
    uid = lib.unique_id()
    raw = uid.to_bytes()
    assert len(raw) == 128 and raw == bytes((i * 7 + 3) & 0xFF for i in range(128))
    shuffled = bytes(np.random.default_rng(0).permutation(np.frombuffer(raw, np.uint8)))
    comm = Communicator.create(shuffled, rank=1, world=2, timeout=10.0)
    got = ctypes.create_string_buffer(128)
    lib.lib.fake_id(got)
    assert got.raw == shuffled  # the id went by value, every byte
    assert last(lib)[6:] == [1, 2]
    comm_ptr = ctypes.cast(lib.lib.fake_comm, ctypes.c_void_p).value
    assert comm.comm not in (None, 0) and lib.version() == 22805 and comm_ptr

    rng = np.random.default_rng(3)
    for n, std in ((1, 1e-3), (19, 1.0), (989, 300.0)):
        x = (rng.standard_normal(n) * std).astype(np.float32)
        out = np.full(n, np.nan, np.float32)
        comm.all_reduce(HostArray(x), HostArray(out), stream=0x1234)
        assert np.array_equal(out, 2 * x)  # two ranks holding x
        count, dtype, op, stream, c, root = last(lib)[:6]
        assert (count, dtype, op, stream, c) == (n, 7, nccl.SUM, 0x1234, comm.comm)
    h = rng.standard_normal(37).astype(np.float16)
    out16 = np.full(37, np.nan, np.float16)
    comm.all_reduce(HostArray(h), HostArray(out16), stream=7)
    assert last(lib)[:4] == [37, 6, nccl.SUM, 7] and np.array_equal(out16, h)

    part = rng.standard_normal(19).astype(np.float32)
    whole = np.full(38, np.nan, np.float32)
    comm.all_gather(HostArray(part), HostArray(whole), stream=9)
    assert last(lib)[:2] == [19, 7] and np.array_equal(whole, np.concatenate([part, part]))
    ids = np.array([41], np.int32)
    dst = np.array([-1], np.int32)
    comm.broadcast(HostArray(ids), HostArray(dst), root=0, stream=11)
    assert last(lib)[:6][0:2] == [1, 2] and last(lib)[5] == 0 and dst[0] == 41
    assert comm.async_error() == 0
    comm.abort()
    assert comm.comm is None


def test_bad_buffers_are_refused(lib):
    comm = Communicator.create(lib.unique_id().to_bytes(), rank=0, world=2, timeout=10.0)
    x = np.zeros(8, np.float32)
    with pytest.raises(ParallelError, match="float64 where float32"):
        comm.all_reduce(HostArray(x), HostArray(np.zeros(8)), stream=0)
    with pytest.raises(ParallelError, match="contiguous"):
        comm.all_reduce(HostArray(np.zeros((8, 4), np.float32)[:, :2]), HostArray(np.zeros((8, 2), np.float32)), 0)
    with pytest.raises(ParallelError, match="16 elements to receive, 2 x 7"):
        comm.all_gather(HostArray(np.zeros(7, np.float32)), HostArray(np.zeros(16, np.float32)), 0)
    with pytest.raises(ParallelError, match="collectives take"):
        comm.all_reduce(HostArray(np.zeros(2, np.complex64)), HostArray(np.zeros(2, np.complex64)), 0)
    with pytest.raises(ParallelError, match="128 bytes, got 5"):
        nccl.UniqueId.from_bytes(b"short")


def test_init_error_and_hang_end_in_parallel_error(lib):
    with pytest.raises(ParallelError, match=r"ncclCommInitRank \(rank 98 of 2\).*internal error \(stand-in\)"):
        Communicator.create(lib.unique_id().to_bytes(), rank=98, world=2, timeout=10.0)
    t0 = time.monotonic()
    with pytest.raises(ParallelError, match="rank 99 of 2 did not form within 0.5 s"):
        Communicator.create(lib.unique_id().to_bytes(), rank=99, world=2, timeout=0.5)
    assert time.monotonic() - t0 < 3.0
