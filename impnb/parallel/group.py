"""The tensor-parallel group a DeviceModel runs in: its rank, the NCCL communicator, and the
collectives forward calls on the model's stream (so a captured graph holds them)."""

from impnb.parallel import nccl, rendezvous
from impnb.parallel.comm import Communicator
from impnb.parallel.ranks import Rank


class TensorParallel:
    """rank of world; comm: the NCCL communicator; stream: the raw handle collectives run on."""

    def __init__(self, rank: Rank, comm: Communicator, stream: int):
        self.rank, self.world, self.comm, self.stream = rank.rank, rank.world, comm, stream
        self.local_rank = rank.local_rank

    @classmethod
    def join(cls, rank: Rank, ctx) -> "TensorParallel":
        """Set up this rank's communicator on ctx's GPU (ctx: a GpuContext made for
        rank.local_rank): rank 0 makes NCCL's unique id and hands it out, every rank then forms
        the communicator; each step under rank.timeout, else ParallelError."""
        lib = nccl.library()
        if rank.leader:
            uid = lib.unique_id().to_bytes()
            rendezvous.serve_id(uid, rank.world, rank.addr, rank.port, rank.timeout)
        else:
            uid = rendezvous.fetch_id(rank.rank, rank.world, rank.addr, rank.port, rank.timeout,
                                      nccl.UNIQUE_ID_BYTES)
        comm = Communicator.create(uid, rank.rank, rank.world, rank.timeout, ctx.device.set_current)
        return cls(rank, comm, ctx.handle)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, buf) -> None:
        """buf (float32 or float16, contiguous) = its sum over the ranks, in place."""
        self.comm.all_reduce(buf, buf, self.stream)

    def all_gather(self, part, whole) -> None:
        """whole = every rank's part, rank after rank."""
        self.comm.all_gather(part, whole, self.stream)

    def broadcast(self, buf, root: int = 0) -> None:
        """buf on every rank = rank root's buf."""
        self.comm.broadcast(buf, buf, root, self.stream)

    def close(self) -> None:
        self.comm.close()
