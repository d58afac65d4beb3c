"""One rank's NCCL communicator: set up under a watchdog, then all-reduce (sum), all-gather and
broadcast of device arrays on a given CUDA stream handle (inside graph capture too: the
collectives are recorded into the capturing stream's graph like kernels)."""

import ctypes
import threading

from impnb.errors import ParallelError
from impnb.parallel import nccl


class Communicator:
    """rank of world on the device current when made; comm: the ncclComm_t."""

    def __init__(self, lib: nccl.Nccl, comm: int, rank: int, world: int):
        self.lib, self.comm, self.rank, self.world = lib, comm, rank, world

    @classmethod
    def create(cls, uid: bytes, rank: int, world: int, timeout: float, bind_device=None) -> "Communicator":
        """ncclCommInitRank on a watchdog thread (bind_device() first makes the rank's GPU current
        there); ParallelError when it fails or has not returned within timeout seconds (a rank
        that never joined): the caller then ends the process, as NCCL cannot be interrupted."""
        lib = nccl.library()
        uid = nccl.UniqueId.from_bytes(uid)
        comm = ctypes.c_void_p()
        result = {}

        def init():
            try:
                if bind_device is not None:
                    bind_device()
                result["rc"] = lib.lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank)
            except BaseException as e:  # reported by the waiting thread
                result["error"] = e

        thread = threading.Thread(target=init, name=f"nccl-init-{rank}", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise ParallelError(f"tensor-parallel set-up: NCCL's communicator on rank {rank} of {world} "
                                f"did not form within {timeout:g} s (a rank did not join)")
        if "error" in result:
            raise ParallelError(f"tensor-parallel set-up on rank {rank}: {result['error']}")
        lib.check(result["rc"], f"ncclCommInitRank (rank {rank} of {world})")
        return cls(lib, comm.value, rank, world)

    def all_reduce(self, send, recv, stream: int) -> None:
        """recv = the sum over ranks of send (float32 or float16; in place where send is recv)."""
        src, dst, n, dtype = nccl.collective_args(send, recv, send.dtype)
        self.lib.check(self.lib.lib.ncclAllReduce(src, dst, n, dtype, nccl.SUM, self.comm, stream),
                       "ncclAllReduce")

    def all_gather(self, send, recv, stream: int) -> None:
        """recv (world * n elements) = every rank's send (n elements), rank by rank."""
        src, _, n, dtype = nccl.collective_args(send, send, send.dtype)
        _, dst, m, _ = nccl.collective_args(recv, recv, send.dtype)
        if m != n * self.world:
            raise ParallelError(f"all_gather: {m} elements to receive, {self.world} x {n} sent")
        self.lib.check(self.lib.lib.ncclAllGather(src, dst, n, dtype, self.comm, stream), "ncclAllGather")

    def broadcast(self, send, recv, root: int, stream: int) -> None:
        """recv on every rank = send of rank root."""
        src, dst, n, dtype = nccl.collective_args(send, recv, send.dtype)
        self.lib.check(self.lib.lib.ncclBroadcast(src, dst, n, dtype, root, self.comm, stream), "ncclBroadcast")

    def async_error(self) -> int:
        """ncclCommGetAsyncError's result (0: none)."""
        rc = ctypes.c_int()
        self.lib.check(self.lib.lib.ncclCommGetAsyncError(self.comm, ctypes.byref(rc)), "ncclCommGetAsyncError")
        return rc.value

    def abort(self) -> None:
        """End the communicator without waiting for the other ranks (a failed run)."""
        if self.comm:
            self.lib.lib.ncclCommAbort(self.comm)
            self.comm = None

    def close(self) -> None:
        if self.comm:
            self.lib.lib.ncclCommDestroy(self.comm)
            self.comm = None
