"""Measure the prefill GEMM paths on this GPU and write impnb/tuning/gemm_table.json.

For each model's matrices as DeviceModel holds them (Q|K|V or its parts, attn_output, ffn_gate_up
or ffn_gate / ffn_up, ffn_down, the output matrix; the stacked Q|K|V on cuBLAS, the split-K tiles
and the few-row GEMMs only; one entry
per distinct type and shape, timed rotating over all layers' copies, as a prefill chunk reads them) and each M bucket: cuBLAS on a dequantized copy against
the mma.sync tiles at bm 64 and 128 and the wgmma tiles (MatMul.gemm in gpu/linear.py, x cast included in
all). --reps calls captured in a CUDA graph (no host launch cost, as in a prefill graph), warm-up first, median of
5 replays; a tile's output must match cuBLAS's
(max |diff| / max |ref| < 1e-2; x's int8 rounding on "mmq" is well inside it) to count. The table keeps the shapes where a tile won by more
than 3%, and at up to 32 rows those where one came within 1.6x of cuBLAS (a short prompt then
makes no cuBLAS handle: gemm_dispatch.table_choice); a printed table gives every time and the
speed-up. --from-json rebuilds the choices from an earlier run's --json file, without a GPU. Shapes measured now replace their
entries in the table at --out; the other entries (other models' shapes) stay, so models can be
tuned a few at a time (and --buckets a few M buckets at a time); --fresh writes only this run's.
    python scripts/tune_gemm.py [-m smollm2-135m,gemma3-270m] [--reps 30] [--buckets 16,32] [--out PATH] [--json PATH]
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from gguf import GGML_QUANT_SIZES  # noqa: E402

from impnb.gguf_file import open_model_file  # noqa: E402
from impnb.gpu import gemm_dispatch as gd  # noqa: E402
from impnb.gpu.model import DeviceModel  # noqa: E402
from impnb.graphs.timing import graph_us  # noqa: E402
from impnb.kernels.gemm import gemm_few, gemm_mmq, gemm_wgmma_few, gemm_wgmma_rs  # noqa: E402
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES  # noqa: E402
from impnb.kernels.gemm.gemm_wgmma import BK as WG_BK  # noqa: E402
from impnb.model_registry import resolve_model  # noqa: E402

NAMES = ("attn_output", "ffn_gate_up", "ffn_gate", "ffn_up", "ffn_down", "attn_qkv", "attn_qk", "attn_q",
         "attn_k", "attn_v")
SPLIT = ("attn_qkv", "attn_qk")  # stacked: MatMul.split takes cuBLAS or the split-K GEMMs


def weights_by_shape(m) -> tuple[dict, set]:
    """({(type, N, K): the layers' weights}, the keys whose weights are all stacked Q|K|V)."""
    groups, plain = defaultdict(list), set()
    for name, w in m.w.items():
        if (name == "output" or name.startswith("blk.") and name.split(".")[2] in NAMES) and w.ggml_type in QUANT_TYPES \
                and w.cols % GGML_QUANT_SIZES[w.ggml_type][0] == 0 and w.rows % 8 == 0:
            groups[(w.ggml_type, w.rows, w.cols)].append(w)
            if name == "output" or name.split(".")[2] not in SPLIT:
                plain.add((w.ggml_type, w.rows, w.cols))
    return groups, set(groups) - plain


def time_path(m, ws, x, y, path, reps) -> float:
    """GPU µs per call: `reps` calls (rotating over the layers' copies) captured into one CUDA
    graph, as a prefill chunk's graph runs them, replayed 6 times; the median of the last 5 / reps."""
    for i in range(len(ws)):  # warm-up: compile, module load, scratch buffers
        m.mm.gemm(x, ws[i], y, path)
    m.ctx.sync()
    return graph_us(m.ctx, lambda: [m.mm.gemm(x, ws[i % len(ws)], y, path) for i in range(reps)], reps)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=str(gd.TABLE_PATH))
    ap.add_argument("--json", help="every measurement")
    ap.add_argument("--fresh", action="store_true", help="drop the table's entries for shapes not measured now")
    ap.add_argument("--buckets", default=",".join(map(str, gd.M_BUCKETS)),
                    help="M buckets to measure; the table keeps its entries for the others")
    ap.add_argument("--from-json", help="no GPU: the choices from a --json file of an earlier run (measured on "
                    "the GPU --gpu names), merged into --out as a run would")
    ap.add_argument("--gpu", help="with --from-json: the GPU that file was measured on")
    args = ap.parse_args()
    if args.from_json:
        if not args.gpu:
            ap.error("--from-json needs --gpu")
        rows = json.loads(Path(args.from_json).read_text())
        choices = {}
        for r in rows:
            r["chosen"] = gd.table_choice(r["us"], r["M"])
            if r["chosen"] != "cublas":
                choices.setdefault(r["shape"], {})[str(r["M"])] = r["chosen"]
        return write(args, choices, rows, {r["shape"] for r in rows}, sorted({r["M"] for r in rows}),
                     list(dict.fromkeys(r["model"] for r in rows)), args.gpu)
    choices, rows, measured = {}, [], set()
    buckets = [int(b) for b in args.buckets.split(",")]
    assert set(buckets) <= set(gd.M_BUCKETS), f"buckets are among {gd.M_BUCKETS}"
    rng = np.random.default_rng(0)
    print(f"{'shape':<20} {'M':>4} " + " ".join(f"{p + ' µs':>13}" for p in gd.PATHS)
          + f" {'chosen':<12} {'speed-up':>8}")
    for model in args.models.split(","):
        m = DeviceModel(open_model_file(resolve_model(model)), 1024)
        groups, stacked = weights_by_shape(m)
        for (t, N, K), ws in groups.items():
            key = gd.shape_key(t, N, K)
            measured.add(key)
            for M in buckets:
                x = m.ctx.upload(rng.standard_normal((M, K)).astype(np.float32))
                ys = {p: m.ctx.upload(np.full((M, N), np.nan, np.float32)) for p in gd.PATHS}
                paths = [p for p in gd.PATHS if (p != "wgmma" or K % WG_BK == 0)
                         and (p != "few" or gemm_few.supports(t, K))
                         and (p != "mmq" or gemm_mmq.supports(t, K))
                         and (p != "wgmma_few" or gemm_wgmma_few.supports(t, K))
                         and (p != "wrs" or gemm_wgmma_rs.supports(t, K))
                         and ((t, N, K) not in stacked or p in ("cublas", "splitk", "few", "mmq", "wgmma_few", "wrs"))]
                us = {p: time_path(m, ws, x, ys[p], p, args.reps) if p in paths else float("inf")
                      for p in gd.PATHS}
                for p in paths:
                    m.mm.gemm(x, ws[0], ys[p], p)
                ref = ys["cublas"].copy_to_host()
                for p in paths[1:]:
                    got = ys[p].copy_to_host()
                    rel = np.abs(got - ref).max() / np.abs(ref).max()
                    if not (np.isfinite(got).all() and rel < 1e-2):
                        print(f"{key} M={M} {p}: disagrees with cuBLAS ({rel:.2e}); not used")
                        us[p] = float("inf")
                best = gd.table_choice(us, M)
                if best != "cublas":
                    choices.setdefault(key, {})[str(M)] = best
                rows.append(dict(model=model, shape=key, M=M, us=us, chosen=best))
                print(f"{key:<20} {M:>4} " + " ".join(f"{us[p]:>13.1f}" for p in gd.PATHS)
                      + f" {best:<12} {us['cublas'] / us[best]:>8.2f}")
        m.ctx.sync()
    return write(args, choices, rows, measured, buckets, args.models.split(","), _gpu_name())


def write(args, choices: dict, rows: list, measured: set, buckets: list, models: list, gpu: str) -> int:
    """The table at --out: its entries for the shapes and buckets measured now replaced by
    choices (the others kept where the table is of the same GPU), and rows at --json."""
    old = {} if args.fresh or not Path(args.out).exists() else json.loads(Path(args.out).read_text())
    if old and old.get("gpu") == gpu:
        kept = {k: {m: p for m, p in v.items() if k not in measured or int(m) not in buckets}
                for k, v in old["choices"].items()}
        for k, v in choices.items():
            kept.setdefault(k, {}).update(v)
        choices = {k: dict(sorted(v.items(), key=lambda e: int(e[0]))) for k, v in kept.items() if v}
        models = list(dict.fromkeys(old["models"].split(",") + models))
    Path(args.out).write_text(json.dumps({"note": "written by scripts/tune_gemm.py on the GPU named",
                                          "gpu": gpu, "models": ",".join(models),
                                          "choices": choices}, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out}: {sum(len(v) for v in choices.values())} tile choices")
    return 0


def _gpu_name() -> str:
    from numba import cuda

    return cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes) \
        else str(cuda.get_current_device().name)


if __name__ == "__main__":
    sys.exit(main())
