"""Gated DeltaNet prefill kernels timed against each other at a model's head layout: token by token
(kernels/deltanet/gdn_prefill.py) and chunked on the tensor cores (gdn_chunked.py), over a prompt of
T tokens of one sequence run as the engine runs it (prompt chunks of up to --prompt-chunk rows,
the state carried), Gaussian inputs. Prints one row a (T, kernel): µs a layer (median of -r runs,
CUDA events), and the chunked output's largest difference from the token-by-token one as a
fraction of each (row, head)'s largest output; --chunks: the chunked kernel at each chunk size.
    python scripts/bench_gdn_prefill.py -T 512,4096 [--chunks 64,32] [--heads 16,32 --dims 128,128]
"""

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb.kernels.deltanet.gdn_chunked import gdn_chunked  # noqa: E402
from impnb.kernels.deltanet.gdn_prefill import gdn_prefill  # noqa: E402
from impnb.tuning import PREFILL_CHUNK_MOE  # noqa: E402


def run(kernel, dev, state, T, stream, prompt_chunk):
    """The prompt's chunks of up to prompt_chunk rows through `kernel`, the state carried."""
    for lo in range(0, T, prompt_chunk):
        hi = min(T, lo + prompt_chunk)
        qkv, z, b, a, out = (dev[n][lo:hi] for n in ("qkv", "z", "b", "a", "out"))
        kernel(qkv, z, b, a, dev["ssm_a"], dev["dt_bias"], dev["norm_w"], 1e-6, state, dev["slots"],
               dev["Hk"], True, out, stream)


def bench(T, Hk, Hv, dk, dv, chunks, reps, rng, prompt_chunk):
    stream = cuda.stream()
    host = dict(qkv=rng.standard_normal((T, 2 * Hk * dk + Hv * dv), dtype=np.float32),
                z=rng.standard_normal((T, Hv * dv), dtype=np.float32),
                b=(1.5 * rng.standard_normal((T, Hv))).astype(np.float32),
                a=(0.5 * rng.standard_normal((T, Hv))).astype(np.float32),
                ssm_a=-np.exp(rng.uniform(-1, 0, Hv)).astype(np.float32),
                dt_bias=np.linspace(-3, 0.3, Hv).astype(np.float32),
                norm_w=(1 + 0.3 * rng.standard_normal(dv)).astype(np.float32),
                slots=np.zeros(1, np.int32), out=np.full((T, Hv * dv), np.nan, np.float32))
    dev = {k: cuda.to_device(v, stream=stream) for k, v in host.items()}
    dev["Hk"] = Hk
    state0 = (0.3 * rng.standard_normal((1, Hv, dk, dv))).astype(np.float32)
    rows, outs = [], {}
    kernels = {"token": gdn_prefill}
    kernels.update({f"chunk{c}": functools.partial(gdn_chunked, chunk=c) for c in chunks})
    for name, kernel in kernels.items():
        state = cuda.to_device(state0, stream=stream)
        run(kernel, dev, state, T, stream, prompt_chunk)  # compiles, and the output compared below
        outs[name] = dev["out"].copy_to_host(stream=stream)
        times = []
        for _ in range(reps):
            start, end = cuda.event(), cuda.event()
            start.record(stream)
            run(kernel, dev, state, T, stream, prompt_chunk)
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        rows.append(dict(T=T, kernel=name, us=float(np.median(times)), heads=[Hk, Hv], dims=[dk, dv]))
    want = outs["token"].reshape(T, Hv, dv)
    scale = np.abs(want).max(-1, keepdims=True) + 1e-30
    for r in rows:
        r["max_rel_diff"] = float((np.abs(outs[r["kernel"]].reshape(T, Hv, dv) - want) / scale).max())
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-T", default="512,4096", help="prompt lengths, comma-separated")
    ap.add_argument("--heads", default="16,32", help="QK heads, V heads (Qwen3.6-35B-A3B's)")
    ap.add_argument("--dims", default="128,128", help="QK and V head dims")
    ap.add_argument("--chunks", default="64,32", help="the chunked kernel's chunk sizes, comma-separated")
    ap.add_argument("--prompt-chunk", type=int, default=PREFILL_CHUNK_MOE,
                    help="prompt tokens a forward call takes (the engine's for a mixture of experts)")
    ap.add_argument("-r", type=int, default=5, help="repetitions (median)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    Hk, Hv = (int(x) for x in args.heads.split(","))
    dk, dv = (int(x) for x in args.dims.split(","))
    rows = []
    for T in (int(t) for t in args.T.split(",")):
        chunks = [int(c) for c in args.chunks.split(",")]
        rows += bench(T, Hk, Hv, dk, dv, chunks, args.r, np.random.default_rng(T), args.prompt_chunk)
    print(f"{'T':>6} {'kernel':>8} {'us/layer':>10} {'tok/s/layer':>12} {'max rel diff':>13}")
    for r in rows:
        print(f"{r['T']:>6} {r['kernel']:>8} {r['us']:>10.1f} {r['T'] / r['us'] * 1e6:>12.0f} {r['max_rel_diff']:>13.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
