"""Host µs per kernel launch: numba's dispatcher (`k[grid, block, stream](...)`) against
impnb.launch, on a tiny kernel and on RMSNorm's (three 2-D arrays and a float), median of --n.

Launches go to an external stream as the engine's do; the stream is synchronized every 100
launches (off the clock) so the queue never fills. Warm-up (compile, module load) is excluded.
    python scripts/bench_launch.py [--n 1000] [--json PATH]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from numba import cuda  # noqa: E402

from impnb.kernels.elementwise.norm import _rms_norm_kernel  # noqa: E402
from impnb.launch import launch  # noqa: E402


@cuda.jit
def _add_one(x, n):
    # grid 1, block 32: thread i adds one to x[i]
    i = cuda.grid(1)
    if i < n:
        x[i] += 1


def host_us(fn, stream, n: int) -> float:
    """Median host time of fn() in µs over n calls."""
    times = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
        if i % 100 == 99:
            stream.synchronize()
    stream.synchronize()
    return statistics.median(times) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--json")
    args = ap.parse_args()

    owner = cuda.stream()  # keeps the stream alive; launches go through an external view of it
    stream = cuda.external_stream(int(owner.handle))
    x = cuda.to_device(np.zeros(32, np.float32), stream=stream)
    rows = cuda.to_device(np.random.default_rng(0).standard_normal((4, 2048)).astype(np.float32))
    w, out = cuda.to_device(np.ones(2048, np.float32)), cuda.device_array((4, 2048), np.float32)
    eps = np.float32(1e-6)
    cases = {
        "tiny (1 array, int32)": (_add_one, 1, 32, (x, np.int32(32))),
        "rms_norm (3 arrays, f32)": (_rms_norm_kernel, 4, 256, (rows, w, out, eps)),
    }
    results = {}
    for name, (kernel, grid, block, kargs) in cases.items():
        numba_fn = lambda: kernel[grid, block, stream](*kargs)  # noqa: E731
        launch_fn = lambda: launch(kernel, grid, block, stream, *kargs)  # noqa: E731
        for fn in (numba_fn, launch_fn):  # warm-up
            fn()
        stream.synchronize()
        results[name] = {"numba_us": host_us(numba_fn, stream, args.n),
                         "launch_us": host_us(launch_fn, stream, args.n)}
    x_host = x.copy_to_host()
    assert np.all(x_host == x_host[0]), "tiny kernel: every element gets every launch"

    print(f"{'kernel':28} {'numba µs':>10} {'launch µs':>10} {'speed-up':>9}")
    for name, r in results.items():
        print(f"{name:28} {r['numba_us']:10.2f} {r['launch_us']:10.2f} "
              f"{r['numba_us'] / r['launch_us']:8.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
