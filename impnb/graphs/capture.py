"""Capture a run of kernel launches on our stream into a CUDA graph and replay it (cuda-python).

Whatever is captured must allocate nothing, synchronize nothing and copy nothing from
pageable host memory: callers warm up (compile, allocate) with one eager run first.
"""

import logging

log = logging.getLogger("impnb.graphs")


class CaptureError(RuntimeError):
    """Capture or instantiation failed; the message is the named reason."""


def check(result, what: str):
    from cuda.bindings import driver

    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CaptureError(f"{what} failed: {err.name}")
    return rest[0] if rest else None


class Graph:
    """An instantiated graph of everything `body()` launched on `stream_handle`."""

    def __init__(self, stream_handle: int, body):
        from cuda.bindings import driver

        self._driver = driver
        self.stream = driver.CUstream(stream_handle)
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(driver.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        try:
            body()
        except BaseException as e:
            err, graph = driver.cuStreamEndCapture(self.stream)
            if err == driver.CUresult.CUDA_SUCCESS and graph:
                driver.cuGraphDestroy(graph)
            if isinstance(e, Exception):
                raise CaptureError(f"launching during capture failed: {e}") from e
            raise
        self.graph = check(driver.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
        self.exec = check(driver.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")
        self.n_nodes = driver.cuGraphGetNodes(self.graph, 0)[-1]

    def replay(self) -> None:
        check(self._driver.cuGraphLaunch(self.exec, self.stream), "cuGraphLaunch")

    def close(self) -> None:
        if getattr(self, "exec", None) is not None:
            self._driver.cuGraphExecDestroy(self.exec)
            self._driver.cuGraphDestroy(self.graph)
            self.exec = None
