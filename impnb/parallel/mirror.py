"""A model runner's calls from rank 0 to the other tensor-parallel ranks, for what only rank 0 sees
(the server's requests): rank 0's scheduler decides each step, MirroredRunner sends the step to
every other rank over a TCP connection before running it, and each of those ranks follows with
the same call on its runner, so their collectives pair up. A message is a 4-byte length and a
pickle of (method name, argument) between impnb processes of one run."""

import pickle
import socket
import struct
import time

from impnb.errors import ImpnbError, ParallelError
from impnb.parallel.rendezvous import accepted

LENGTH = struct.Struct("<I")
STOP = ("stop", None)


def send(conn, message) -> None:
    raw = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    conn.sendall(LENGTH.pack(len(raw)) + raw)


def recv(conn):
    """The next message, or STOP where rank 0 closed the connection."""
    head = _read(conn, LENGTH.size)
    if head is None:
        return STOP
    raw = _read(conn, LENGTH.unpack(head)[0])
    return STOP if raw is None else pickle.loads(raw)


def _read(conn, n: int) -> bytes | None:
    out = b""
    while len(out) < n:
        part = conn.recv(n - len(out))
        if not part:
            return None
        out += part
    return out


def accept_followers(world: int, addr: str, port: int, timeout: float) -> list:
    """Rank 0: a connection from each of ranks 1..world-1 (any order); ParallelError past timeout."""
    deadline = time.monotonic() + timeout
    conns = {}
    with socket.create_server((addr, port)) as server:
        late = (lambda missing: f"tensor-parallel serving: rank(s) {', '.join(map(str, missing))} did not "
                                f"follow within {timeout:g} s")
        for conn in accepted(server, deadline, lambda: sorted(set(range(1, world)) - set(conns)), late):
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conns[recv(conn)[1]] = conn
    return [conns[r] for r in sorted(conns)]


def connect_leader(rank: int, addr: str, port: int, timeout: float):
    """Ranks 1..: the connection to rank 0's accept_followers, retried until timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=max(0.1, deadline - time.monotonic()))
            break
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ParallelError(f"tensor-parallel serving: rank {rank} could not reach rank 0 at "
                                    f"{addr}:{port} within {timeout:g} s ({e})") from None
            time.sleep(0.1)
    conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send(conn, ("rank", rank))
    return conn


class MirroredRunner:
    """runner (rank 0's) whose execute and finished calls go to every follower first; its other
    attributes are runner's."""

    def __init__(self, runner, conns: list):
        self._runner, self._conns = runner, conns

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def execute(self, step):
        for c in self._conns:
            send(c, ("execute", step))
        return self._runner.execute(step)

    def finished(self, seq_id: int) -> None:
        for c in self._conns:
            send(c, ("finished", seq_id))
        self._runner.finished(seq_id)

    def close(self) -> None:
        for c in self._conns:
            c.close()
        self._conns = []


def follow(runner, conn) -> int:
    """Ranks 1..: run rank 0's calls on runner until it closes the connection; the calls run."""
    n = 0
    while True:
        method, arg = recv(conn)
        if method == "stop":
            return n
        if method not in ("execute", "finished"):
            raise ParallelError(f"tensor-parallel serving: rank 0 sent {method!r}")
        try:
            getattr(runner, method)(arg)
        except ImpnbError:  # rank 0's runner raised the same (its engine fails those requests)
            pass
        n += 1
