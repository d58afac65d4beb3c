"""bench_gemv.py --sweep: every T = 1 GEMV variant (gemv_variants.sweep) on decode shapes.

Shapes: 4096x14336 and 14336x4096 (rows x cols) for Q8_0, Q4_K, Q4_1, Q6_K; SmolLM2-135M's
576x1536 and 1536x576 (Q4_1, Q8_0); Gemma3-270M's 262144x640 logits (Q8_0); and
Qwen3-30B-A3B's routed experts through gemv_experts, 8 slots of one token: gate|up 2x768 rows x
2048 cols with SiLU, down 2048 x 768 (Q4_K, Q6_K; 128 experts, launch i reads experts 8i..8i+7
mod 128, so 16 launches sweep the tensor). Bytes are the weight bytes a launch reads. Kernels
compile first in a process pool into the disk cache (impnb.launch.cache), so timing compiles
nothing; the table gives each kernel's registers and local (spill) bytes from the driver.
"""

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from cuda.bindings import driver
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import cuda

from bench_gemv import PEAK, device_copies, random_weight, time_launches
from impnb.kernels.gemv import gemv as g
from impnb.kernels.gemv.gemv_experts import gemv_experts
from impnb.kernels.common.repack import repack
from impnb.launch import cache
from impnb.launch.cubin import arch_cc, entry_name

E, SLOTS = 128, 8  # Qwen3-30B-A3B: experts, experts per token
# (label, rows, cols, types, experts' epilogue or None for a plain gemv)
SWEEP_CASES = [
    ("4096x14336", 4096, 14336, (T.Q8_0, T.Q4_K, T.Q4_1, T.Q6_K), None),
    ("14336x4096", 14336, 4096, (T.Q8_0, T.Q4_K, T.Q4_1, T.Q6_K), None),
    ("smollm2 576x1536", 576, 1536, (T.Q4_1, T.Q8_0), None),
    ("smollm2 1536x576", 1536, 576, (T.Q4_1, T.Q8_0), None),
    ("gemma3 262144x640", 262144, 640, (T.Q8_0,), None),  # 640 cols: no K-quant rows
    ("qwen3moe gate|up 8x1536x2048", 2 * 768, 2048, (T.Q4_K, T.Q6_K), g.SILU),
    ("qwen3moe down 8x2048x768", 2048, 768, (T.Q4_K, T.Q6_K), g.NO_GLU),
]


def _kernels():
    """(type, variant, glu, experts) of every kernel the sweep launches."""
    return sorted({(t, v, glu or 0, glu is not None) for _, _, _, types, glu in SWEEP_CASES
                   for t in types for v in g.sweep(t)})


def _compile(job):
    t, v, glu, experts, cc = job
    t0 = time.perf_counter()
    cache.get_cubin(g.variant_kernel(t, 1, v, glu, experts), g.kernel_args(t, experts), cc)
    return time.perf_counter() - t0


def precompile(cc) -> None:
    jobs = [(*k, cc) for k in _kernels()]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(min(len(jobs), os.cpu_count() or 1), mp_context=get_context("spawn")) as pool:
        secs = list(pool.map(_compile, jobs))
    print(f"{len(jobs)} kernels ready in {time.perf_counter() - t0:.0f} s "
          f"(compile or disk; longest {max(secs):.1f} s)", flush=True)


def kernel_resources(t, v, glu, experts, cc) -> tuple:
    """(registers, local bytes per thread) of a kernel's cached cubin, as the driver loads it."""
    cubin = cache.get_cubin(g.variant_kernel(t, 1, v, glu, experts), g.kernel_args(t, experts), cc)
    _, module = driver.cuModuleLoadData(cubin)
    _, func = driver.cuModuleGetFunction(module, entry_name(cubin).encode())
    attr = driver.CUfunction_attribute
    _, regs = driver.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, func)
    _, local = driver.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, func)
    driver.cuModuleUnload(module)
    return regs, local


def expert_copies(t, rows, cols, rng):
    """One device copy of the stacked experts per 4x L2 it takes (at least one)."""
    block, size = GGML_QUANT_SIZES[t]
    one = E * rows * cols // block * size
    return [repack(random_weight(t, E * rows, cols, rng), t).to_device()
            for _ in range(max(1, int(np.ceil(200e6 / one))))]


def time_case(label, rows, cols, t, glu, reps, rng, cc):
    stream = cuda.stream()
    if glu is None:
        weights = device_copies(t, rows, cols, rng)
        x = cuda.to_device(rng.standard_normal((1, cols)).astype(np.float32), stream=stream)
        y = cuda.to_device(np.full((1, rows), np.nan, np.float32), stream=stream)
        nbytes = weights[0].nbytes

        def run(v):
            return lambda i, s: g.gemv(weights[i % len(weights)], x, y, s, variant=v)
    else:
        weights = expert_copies(t, rows, cols, rng)
        groups = [cuda.to_device(((np.arange(SLOTS) + SLOTS * i) % E).astype(np.int32)) for i in range(E // SLOTS)]
        x_div = SLOTS if glu else 1  # gate|up: one token for all slots; down: a row per slot
        x = cuda.to_device(rng.standard_normal((SLOTS // x_div, cols)).astype(np.float32), stream=stream)
        y = cuda.to_device(np.full((SLOTS, rows // 2 if glu else rows), np.nan, np.float32), stream=stream)
        nbytes = SLOTS * rows * cols // GGML_QUANT_SIZES[t][0] * GGML_QUANT_SIZES[t][1]

        def run(v):
            return lambda i, s: gemv_experts(weights[i % len(weights)], rows, x, y,
                                             groups[i // len(weights) % len(groups)], x_div, s, glu, variant=v)
    default = g.choose(t, 1, cols, rows)
    out = []
    for v in g.sweep(t):
        n_launch = len(weights) * (1 if glu is None else E // SLOTS)
        med, b2b = time_launches(run(v), n_launch, reps, stream)
        assert np.isfinite(y.copy_to_host()).all(), (label, t.name, v)
        regs, local = kernel_resources(t, v, glu or 0, glu is not None, cc)
        out.append({"shape": label, "rows": rows, "cols": cols, "type": t.name, "variant": v.name,
                    "span": v.span, "unroll": v.unroll, "rows_per_group": v.rows, "default": v == default,
                    "registers": regs, "local_bytes": local, "bytes": nbytes, "median_us": med, "b2b_us": b2b,
                    "bytes_per_s": nbytes / (b2b * 1e-6), "pct_peak": 100 * nbytes / (b2b * 1e-6) / PEAK})
    best = min(out, key=lambda r: r["b2b_us"])
    for r in out:
        r["best"] = r is best
    return out


def sweep_main(reps, json_path) -> None:
    t_start = time.perf_counter()
    cc = arch_cc(cuda.get_current_device().compute_capability)
    precompile(cc)
    before = cache.stats["compiled"]
    rng = np.random.default_rng(0)
    results = []
    print(f"{'shape':30} {'type':5} {'variant':10} {'regs':>4} {'lmem':>4} {'MB':>7} {'med us':>8} "
          f"{'b2b us':>8} {'GB/s':>6} {'% 2.97':>7}")
    for label, rows, cols, types, glu in SWEEP_CASES:
        for t in types:
            rs = time_case(label, rows, cols, t, glu, reps, rng, cc)
            results += rs
            for r in rs:
                mark = " <- best" if r["best"] else ""
                mark += " (default)" if r["default"] else ""
                print(f"{label:30} {r['type']:5} {r['variant']:10} {r['registers']:4} {r['local_bytes']:4} "
                      f"{r['bytes'] / 1e6:7.2f} {r['median_us']:8.2f} {r['b2b_us']:8.2f} "
                      f"{r['bytes_per_s'] / 1e9:6.0f} {r['pct_peak']:6.1f}%{mark}", flush=True)
    print(f"sweep: {time.perf_counter() - t_start:.0f} s; kernels compiled while timing: "
          f"{cache.stats['compiled'] - before}")
    if json_path:
        Path(json_path).write_text(json.dumps({"peak_bytes_per_s": PEAK, "timing": "b2b", "results": results},
                                              indent=1))
