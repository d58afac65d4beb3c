"""The server's Prometheus metrics, written as the text exposition format without a client
library: counters, gauges read from the engine, and latency histograms."""

import bisect
import threading

# seconds; the buckets vLLM's histograms use for the same quantities
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0)
PREFIX = "impnb_"


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for bound, n in zip((*map(repr, self.buckets), "+Inf"), self.counts):
            total += n
            out.append(f'{name}_bucket{{le="{bound}"}} {total}')
        return out + [f"{name}_sum {self.sum!r}", f"{name}_count {total}"]


class Metrics:
    """Updated by the engine thread and the routes, read by GET /metrics (a lock between them)."""

    def __init__(self, model: str):
        self.model = model
        self.lock = threading.Lock()
        self.gauges = {"num_requests_running": 0, "num_requests_waiting": 0, "kv_blocks_used": 0,
                       "kv_blocks_free": 0}
        self.counters = {"prompt_tokens_total": 0, "generation_tokens_total": 0}
        self.finished: dict[str, int] = {}  # finish reason -> requests
        self.errors: dict[int, int] = {}  # HTTP status -> error responses
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    def engine_state(self, running: int, waiting: int, blocks_used: int, blocks_free: int) -> None:
        with self.lock:
            self.gauges.update(num_requests_running=running, num_requests_waiting=waiting,
                               kv_blocks_used=blocks_used, kv_blocks_free=blocks_free)

    def request_done(self, n_prompt: int, n_generated: int, reason: str, ttft: float | None,
                     decode_s: float, e2e: float) -> None:
        with self.lock:
            self.counters["prompt_tokens_total"] += n_prompt
            self.counters["generation_tokens_total"] += n_generated
            self.finished[reason] = self.finished.get(reason, 0) + 1
            if ttft is not None:
                self.ttft.observe(ttft)
            if n_generated > 1:
                self.tpot.observe(decode_s / (n_generated - 1))
            self.e2e.observe(e2e)

    def error(self, status: int) -> None:
        with self.lock:
            self.errors[status] = self.errors.get(status, 0) + 1

    def render(self) -> str:
        with self.lock:
            lines = []
            for name, value in self.gauges.items():
                lines += [f"# TYPE {PREFIX}{name} gauge", f"{PREFIX}{name} {value}"]
            for name, value in self.counters.items():
                lines += [f"# TYPE {PREFIX}{name} counter", f"{PREFIX}{name} {value}"]
            lines.append(f"# TYPE {PREFIX}request_success_total counter")
            lines += [f'{PREFIX}request_success_total{{finished_reason="{r}"}} {n}'
                      for r, n in sorted(self.finished.items())]
            lines.append(f"# TYPE {PREFIX}request_errors_total counter")
            lines += [f'{PREFIX}request_errors_total{{status="{s}"}} {n}' for s, n in sorted(self.errors.items())]
            for name, h in (("time_to_first_token_seconds", self.ttft),
                            ("time_per_output_token_seconds", self.tpot),
                            ("e2e_request_latency_seconds", self.e2e)):
                lines.append(f"# TYPE {PREFIX}{name} histogram")
                lines += h.lines(PREFIX + name)
        return "\n".join(lines) + "\n"
