"""Decode-graph replays queued ahead of the host: each copies its sampled ids (one, or a batched
step's rows) into a pinned slot and records an event, so the host reads step n's tokens while
the device already runs step n + 1."""

from dataclasses import dataclass

import numpy as np

from impnb.graphs.capture import check

SLOTS = 4  # replays in flight at most (the engine keeps two)


@dataclass
class Ticket:
    slot: int
    token: int | None  # the input token, once the host knows it


class Replays:
    """Launch a decode graph and fetch its sampled ids (int32: one, or up to width rows) without
    stalling the stream."""

    def __init__(self, ctx, out_ids, width: int = 1):
        from cuda.bindings import driver

        self._driver = driver
        self._stream = driver.CUstream(ctx.handle)
        self.width = width
        self._host = ctx.cuda.pinned_array((SLOTS, width), np.int32)
        self._src = out_ids.device_ctypes_pointer.value
        flags = driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self._events = [check(driver.cuEventCreate(flags), "cuEventCreate") for _ in range(SLOTS)]
        self._next = 0

    def launch(self, graph, token: int | None, n: int = 1) -> Ticket:
        """Replay graph and fetch its first n sampled ids."""
        graph.replay()
        return self.fetch(token, n)

    def fetch(self, token: int | None = None, n: int = 1) -> Ticket:
        """Queue the copy of the first n sampled ids into the next slot and its event."""
        assert 1 <= n <= self.width
        d, slot = self._driver, self._next
        self._next = (slot + 1) % SLOTS
        check(d.cuMemcpyDtoHAsync(self._host[slot].ctypes.data, self._src, 4 * n, self._stream),
               "cuMemcpyDtoHAsync")
        check(d.cuEventRecord(self._events[slot], self._stream), "cuEventRecord")
        return Ticket(slot, token)

    def collect(self, ticket: Ticket) -> int:
        """Wait for the ticket's replay; its (first) sampled token id."""
        self.wait(ticket)
        return int(self._host[ticket.slot, 0])

    def collect_rows(self, ticket: Ticket, n: int) -> np.ndarray:
        """Wait for the ticket's replay; its first n sampled ids (a copy)."""
        self.wait(ticket)
        return np.array(self._host[ticket.slot, :n])

    def wait(self, ticket: Ticket) -> None:
        check(self._driver.cuEventSynchronize(self._events[ticket.slot]), "cuEventSynchronize")
