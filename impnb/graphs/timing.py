"""GPU time of launches replayed from a CUDA graph, as the tuning scripts measure it."""

import numpy as np

from impnb.graphs.capture import Graph


def graph_us(ctx, body, calls: int, replays: int = 6) -> float:
    """GPU µs per call: body() (making `calls` launches) captured once into a CUDA graph and
    replayed `replays` times; the median of all but the first replay, divided by calls."""
    cuda, s = ctx.cuda, ctx.nb_stream
    graph = Graph(ctx.handle, body)
    times = []
    for _ in range(replays):
        start, end = cuda.event(), cuda.event()
        start.record(s)
        graph.replay()
        end.record(s)
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    graph.close()
    return float(np.median(times[1:]))
