"""Tensor-parallel ranks: one process per GPU. `start(tp, argv)` makes this process rank 0 and
spawns ranks 1..tp-1 running argv, or, where RANK / WORLD_SIZE are set (by impnb or a launcher
such as torchrun), reads this process's rank from them.

Rank 0 watches the ranks it spawned: one that exits with an error ends the run with one line on
stderr and exit status 2 (the others are killed, never left waiting in a collective). A rank
impnb spawned dies with rank 0 (PR_SET_PDEATHSIG). Each one's stdout is dropped (rank 0 writes
the output) and its stderr kept in a log file the error line quotes.
"""

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from impnb.errors import ParallelError
from impnb.parallel.rendezvous import free_port

POLL_S = 0.1
EXIT_GRACE_S = 60.0  # at rank 0's end, how long the other ranks get to finish before they are killed
DEFAULT_TIMEOUT_S = 300.0  # every set-up step (rendezvous, NCCL's init); IMPNB_TP_TIMEOUT overrides


@dataclass(frozen=True)
class Rank:
    """This process's place: rank of world, its GPU (local_rank) and rank 0's rendezvous address."""

    rank: int
    world: int
    local_rank: int
    addr: str
    port: int
    timeout: float = DEFAULT_TIMEOUT_S

    @property
    def leader(self) -> bool:
        return self.rank == 0


def timeout_s(environ=os.environ) -> float:
    raw = environ.get("IMPNB_TP_TIMEOUT", "")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ParallelError(f"IMPNB_TP_TIMEOUT must be a positive number of seconds, got {raw!r}")
    return value


def from_env(environ=os.environ) -> Rank | None:
    """The rank the environment gives (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
    or None where WORLD_SIZE is unset; ParallelError on values that do not fit together."""
    if "WORLD_SIZE" not in environ:
        return None
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    missing = [n for n in ("RANK", "MASTER_PORT") if n not in environ]
    if missing:
        raise ParallelError(f"WORLD_SIZE is set but {' and '.join(missing)} not")
    try:
        rank, world, port = int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ["MASTER_PORT"])
        local = int(environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise ParallelError("RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be integers, got "
                            + ", ".join(f"{n}={environ.get(n)!r}" for n in names)) from None
    if not (world >= 1 and 0 <= rank < world and local >= 0 and 0 < port < 65536):
        raise ParallelError(f"RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local} MASTER_PORT={port} "
                            f"do not fit together")
    if "IMPNB_TP_PORT" in environ:
        port = int(environ["IMPNB_TP_PORT"])
    elif "TORCHELASTIC_RUN_ID" in environ:
        port += 1  # torchrun's agent may hold a store on MASTER_PORT itself
    return Rank(rank, world, local, environ.get("MASTER_ADDR", "127.0.0.1"), port, timeout_s(environ))


def start(tp: int, worker_argv: list[str]) -> Rank | None:
    """This process's rank for a run over tp GPUs (None for tp 1 outside a launcher)."""
    if tp < 1:
        raise ParallelError(f"--tp must be >= 1, got {tp}")
    rank = from_env()
    if rank is not None:
        if rank.world != tp:
            raise ParallelError(f"--tp {tp} but WORLD_SIZE={rank.world}")
        if os.environ.get("IMPNB_TP_PARENT"):
            _die_with_parent(int(os.environ["IMPNB_TP_PARENT"]))
        return rank if rank.world > 1 else None
    if tp == 1:
        return None
    rank = Rank(0, tp, 0, "127.0.0.1", free_port(), timeout_s())
    Workers.spawn(rank, worker_argv)
    return rank


def worker_env(rank: Rank, r: int, environ=os.environ) -> dict:
    """The environment of spawned rank r."""
    env = dict(environ)
    env.update(RANK=str(r), WORLD_SIZE=str(rank.world), LOCAL_RANK=str(r), MASTER_ADDR=rank.addr,
               MASTER_PORT=str(rank.port), IMPNB_TP_PORT=str(rank.port), IMPNB_TP_PARENT=str(os.getpid()),
               IMPNB_TP_TIMEOUT=str(rank.timeout), NCCL_NVLS_ENABLE="0")
    return env


class Workers:
    """The ranks rank 0 spawned, watched from a daemon thread."""

    current: "Workers | None" = None

    def __init__(self, procs: dict, logs: dict):
        self.procs, self.logs = procs, logs
        self.done = False

    @classmethod
    def spawn(cls, rank: Rank, argv: list[str]) -> "Workers":
        log_dir = Path(os.environ.get("IMPNB_TP_LOG_DIR") or tempfile.mkdtemp(prefix="impnb-tp-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        procs, logs = {}, {}
        for r in range(1, rank.world):
            logs[r] = log_dir / f"rank{r}.log"
            with open(logs[r], "wb") as err:
                procs[r] = subprocess.Popen(argv, env=worker_env(rank, r), stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=err)
        workers = cls.current = cls(procs, logs)
        threading.Thread(target=workers.watch, name="impnb-tp-watch", daemon=True).start()
        atexit.register(workers.finish)
        return workers

    def failure(self) -> str | None:
        """The line for the first rank that exited with an error, or None."""
        for r, p in self.procs.items():
            code = p.poll()
            if code not in (None, 0):
                return (f"impnb: error: tensor-parallel rank {r} exited with status {code}: "
                        f"{last_line(self.logs[r])} (log: {self.logs[r]})")
        return None

    def watch(self) -> None:
        while not self.done:
            line = self.failure()
            if line is not None:
                self.kill()
                print(line, file=sys.stderr, flush=True)
                os._exit(2)
            time.sleep(POLL_S)

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            p.wait()

    def finish(self, grace: float = EXIT_GRACE_S) -> None:
        """At rank 0's end: the ranks get grace seconds to end, then are killed; one that ended
        with an error after rank 0's work was done is named in a warning line."""
        self.done = True
        deadline = time.monotonic() + grace
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self.kill()
        for r, p in self.procs.items():
            if p.returncode not in (0, -signal.SIGKILL):
                print(f"impnb: warning: tensor-parallel rank {r} ended with status {p.returncode}: "
                      f"{last_line(self.logs[r])}", file=sys.stderr)


def exit_rank(code: int) -> None:
    """End a tensor-parallel rank's process with code: rank 0 first waits for the ranks it
    started; then out, without the interpreter's teardown (NCCL's and the driver's state go with
    the process, in no order that could fail)."""
    if Workers.current is not None:
        Workers.current.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def abort_workers() -> None:
    """Kill the ranks this process spawned (rank 0 failed: they would wait in a collective)."""
    if Workers.current is not None:
        Workers.current.done = True
        Workers.current.kill()


def last_line(path: Path) -> str:
    """The last non-empty line of a rank's stderr log (or a note that it wrote none)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else "no message on stderr"


def _die_with_parent(parent: int) -> None:
    """A spawned rank: SIGKILL when rank 0 ends (Linux), and now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(2)
