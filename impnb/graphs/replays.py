"""Decode-graph replays queued ahead of the host: each copies its sampled id into a pinned slot
and records an event, so the host reads token n while the device already runs step n + 1."""

from dataclasses import dataclass

import numpy as np

from impnb.graphs.capture import check

SLOTS = 4  # replays in flight at most (the engine keeps two)


@dataclass
class Ticket:
    slot: int
    token: int | None  # the input token, once the host knows it


class Replays:
    """Launch a decode graph and fetch its 4-byte result without stalling the stream."""

    def __init__(self, ctx, out_ids):
        from cuda.bindings import driver

        self._driver = driver
        self._stream = driver.CUstream(ctx.handle)
        self._host = ctx.cuda.pinned_array(SLOTS, np.int32)
        self._src = out_ids.device_ctypes_pointer.value
        flags = driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self._events = [check(driver.cuEventCreate(flags), "cuEventCreate") for _ in range(SLOTS)]
        self._next = 0

    def launch(self, graph, token: int | None) -> Ticket:
        d, slot = self._driver, self._next
        self._next = (slot + 1) % SLOTS
        graph.replay()
        check(d.cuMemcpyDtoHAsync(self._host.ctypes.data + 4 * slot, self._src, 4, self._stream),
               "cuMemcpyDtoHAsync")
        check(d.cuEventRecord(self._events[slot], self._stream), "cuEventRecord")
        return Ticket(slot, token)

    def collect(self, ticket: Ticket) -> int:
        """Wait for the ticket's replay; its sampled token id."""
        check(self._driver.cuEventSynchronize(self._events[ticket.slot]), "cuEventSynchronize")
        return int(self._host[ticket.slot])
