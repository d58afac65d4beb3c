"""The NCCL unique id from rank 0 to the other ranks over one local TCP socket, with a deadline.

Rank 0 listens on (MASTER_ADDR, MASTER_PORT) and answers each rank that says hello (its rank and
the world size it was given) with the 128-byte id; a rank that does not join by the deadline, or
one started for another world size, ends the set-up with a ParallelError naming it.
"""

import socket
import struct
import time

from impnb.errors import ParallelError

HELLO = struct.Struct("<4sii")  # magic, rank, world size
MAGIC = b"IMPT"


def accepted(server, deadline: float, missing, late):
    """The connections server accepts while missing() (the ranks still to come) is not empty;
    ParallelError(late(missing())) once the monotonic deadline passes."""
    while ranks := missing():
        left = deadline - time.monotonic()
        if left <= 0:
            raise ParallelError(late(ranks))
        server.settimeout(left)
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        yield conn


def serve_id(uid: bytes, world: int, addr: str, port: int, timeout: float) -> None:
    """Rank 0: hand uid to ranks 1..world-1, each once; ParallelError past timeout seconds."""
    deadline = time.monotonic() + timeout
    joined = set()
    with socket.create_server((addr, port), reuse_port=False) as server:
        late = (lambda missing: f"tensor-parallel set-up: rank(s) {', '.join(map(str, missing))} of "
                                f"{world} did not join within {timeout:g} s")
        for conn in accepted(server, deadline, lambda: sorted(set(range(1, world)) - joined), late):
            with conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    magic, rank, their_world = HELLO.unpack(_recv(conn, HELLO.size))
                except (OSError, ParallelError):
                    continue  # not one of ours, or it went away: keep waiting for the ranks
                if magic != MAGIC:
                    continue
                if their_world != world or not 0 < rank < world:
                    conn.sendall(b"\0" * len(uid))
                    raise ParallelError(f"tensor-parallel set-up: a rank joined as rank {rank} of {their_world}, "
                                        f"this run has {world} ranks")
                if rank in joined:
                    raise ParallelError(f"tensor-parallel set-up: rank {rank} joined twice")
                conn.sendall(uid)
                joined.add(rank)


def fetch_id(rank: int, world: int, addr: str, port: int, timeout: float, n_bytes: int) -> bytes:
    """Ranks 1..world-1: the id from rank 0, retrying the connection until timeout seconds pass."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=max(0.1, deadline - time.monotonic())) as conn:
                conn.sendall(HELLO.pack(MAGIC, rank, world))
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                uid = _recv(conn, n_bytes)
            if uid == b"\0" * n_bytes:
                raise ParallelError(f"tensor-parallel set-up: rank 0 refused rank {rank} of {world}")
            return uid
        except (ConnectionRefusedError, socket.timeout, ConnectionResetError) as e:
            last = e
            time.sleep(0.1)
    raise ParallelError(f"tensor-parallel set-up: rank {rank} of {world} could not reach rank 0 at "
                        f"{addr}:{port} within {timeout:g} s ({last})")


def _recv(conn, n: int) -> bytes:
    out = b""
    while len(out) < n:
        part = conn.recv(n - len(out))
        if not part:
            raise ParallelError(f"tensor-parallel set-up: the connection closed after {len(out)} of {n} bytes")
        out += part
    return out


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (for rank 0's rendezvous)."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]
