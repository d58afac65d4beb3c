"""Time the decode GEMVs of a batched step (T = 1..64 rows) on this GPU and write
impnb/tuning/gemv_rows_table.json.

For each model's matrices as DeviceModel holds them (Q|K|V or Q|K stacked, V, attn_output,
gate|up, down, the logits; one entry per distinct type, shape and use, timed rotating over every
layer's copy so that the weights come from HBM as in a step) and each T: the path MatMul takes
today (gemv_dp4a / gemv / gemv_stacked up to 8 rows, the GEMM path past that), and at T = 2..8
gemv_dp4a_multi in each of --variants (int8 x's quantize_x launch included in both dp4a paths)
and the int8 GEMM gemm_mmq ("mmq": its x quantization, split reduce and, for gate|up, the
activation kernel included),
past 8 the split-K tiles (informational: tune_gemm.py's table chooses GEMM paths).
--reps calls captured in a CUDA graph, median of 5 replays; a variant's output must match the
default path's within 2e-2 of its largest value to count (int8 x against a float-x default). The table keeps, per T bucket
(gemv_dispatch.T_BUCKETS), the fastest variant where it beat the default path by more than 3%
at that bucket's T; a printed table gives every time. The table's entries for shapes not measured
now stay where it is of the same GPU.
    python scripts/bench_gemv_rows.py -m a.gguf,b.gguf [--tokens 1,2,4,8,16,32,64] [--variants ...]
        [--reps 20] [--out PATH] [--json PATH]
"""

import argparse
import dataclasses
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))
os.environ["IMPNB_GEMV_ROWS"] = "0"  # the Linears' default paths; a variant is set per timing

from impnb.gguf_file import open_model_file  # noqa: E402
from impnb.gpu import gemm_dispatch  # noqa: E402
from impnb.gpu import gemv_dispatch as gd  # noqa: E402
from impnb.gpu.model import DeviceModel  # noqa: E402
from impnb.graphs.timing import graph_us  # noqa: E402
from impnb.kernels.gemm import gemm_mmq  # noqa: E402
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES  # noqa: E402
from impnb.kernels.gemv.gemv_dp4a_multi import MAX_T, MIN_T  # noqa: E402
from impnb.launch.cubin import arch_cc  # noqa: E402
from impnb.launch.precompile import compile_all, record  # noqa: E402
from impnb.model_registry import resolve_model  # noqa: E402

ROLES = ("attn_qkv", "attn_qk", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_up", "ffn_gate",
         "ffn_up", "ffn_down")
VARIANTS = "s32u1r2,s32u1r4,s32u2r4,s32u1r8,s64u1r4,s64u2r4,s128u1r2,s128u1r4"
MARGIN = 1.03
ROTATE_BYTES = 400e6  # at least this many weight bytes a graph's calls rotate over (past the L2)


def groups_of(m) -> dict:
    """{(type, N out, K, use): [Linear of each layer]} for the matrices of a step gemv_dp4a_multi takes."""
    groups = defaultdict(list)
    for name, lin in m.lin.items():
        role = name.split(".")[-1]
        logits = lin is m.output  # "output", or token_embd where the file ties them
        if not gd.takes(lin.ggml_type, lin.w.cols) or not (logits or name.startswith("blk.") and role in ROLES):
            continue
        use = gd.use_of(name)
        n_out = lin.w.rows // 2 if use == "glu" else lin.w.rows
        groups[(lin.ggml_type, n_out, lin.w.cols, use)].append(lin)
    return groups


def split_sizes(m, lin) -> tuple:
    cfg = m.cfg
    q, k, v = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
    sizes = (q, k, v) if lin.name.endswith("attn_qkv") else (q, k)
    assert sum(sizes) == lin.w.rows, (lin.name, sizes, lin.w.rows)
    return sizes


def call(m, lin, use, x, y, sizes):
    """One MatMul call of the Linear's use on x into y (split: into the arena's outputs)."""
    if use == "split":
        m.mm.split(x, lin, [m.arena.get(f"split{i}", (x.shape[0], n)) for i, n in enumerate(sizes)])
    elif use == "glu":
        m.mm.glu(x, lin, "silu", y)
    else:
        m.mm.linear(x, lin, y)


def output(m, use, y, sizes):
    """The host copy of the last call's output (split: its outputs side by side)."""
    if use == "split":
        n_tok = y.shape[0]
        return np.concatenate([m.arena.get(f"split{i}", (n_tok, n)).copy_to_host() for i, n in enumerate(sizes)], 1)
    return y.copy_to_host()


def cases(m, tokens, variants, rng, mmq: bool = True) -> list:
    """(key, T, use, x, y, sizes, {run name: Linears to rotate over}) of every shape and T."""
    out = []
    for (t, N, K, use), lins in groups_of(m).items():
        sizes = split_sizes(m, lins[0]) if use == "split" else ()
        lins = lins[:min(len(lins), max(1, int(-(-ROTATE_BYTES // lins[0].w.nbytes))))]
        for n_tok in tokens:
            x = m.ctx.upload(rng.standard_normal((n_tok, K)).astype(np.float32))
            y = m.ctx.upload(np.full((n_tok, N), np.nan, np.float32))
            runs = {"default": lins}
            if MIN_T <= n_tok <= MAX_T:
                for v in variants:
                    if v.rows // (2 if use == "glu" else 1) <= N and (v.span == 32 or v.span <= K // 32):
                        runs[v.name] = [dataclasses.replace(lin, multi={n_tok: v}) for lin in lins]
                if mmq and gemm_mmq.supports(t, K):
                    runs[gd.MMQ] = [dataclasses.replace(lin, multi={n_tok: gd.MMQ}) for lin in lins]
            elif n_tok > MAX_T and use != "split" and t in QUANT_TYPES:  # the split-K tiles beside the table's path
                paths = {b: "splitk" for b in gemm_dispatch.M_BUCKETS}
                runs["splitk"] = [dataclasses.replace(lin, gemm_paths=paths) for lin in lins]
            out.append((gd.shape_key(t, N, K, use), n_tok, use, x, y, sizes, runs))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--models", default="/tmp/qwen3-8b-q4_k_m.gguf,/tmp/qwen3-30b-a3b-q4_k_m.gguf")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64")
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=str(gd.TABLE_PATH))
    ap.add_argument("--json", help="every measurement")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    variants = [gd.parse_variant(v) for v in args.variants.split(",")]
    rng = np.random.default_rng(0)
    rows, choices = [], {}
    print(f"{'shape':<28} {'T':>3} {'default µs':>10} {'best multi':>10} {'µs':>8} {'speed-up':>8}  default's rate")
    for model in args.models.split(","):
        m = DeviceModel(open_model_file(resolve_model(model)), 1024)
        todo = cases(m, tokens, variants, rng)
        with record(arch_cc(m.ctx.device.compute_capability)) as rec:  # every kernel first, in parallel
            for key, n_tok, use, x, y, sizes, runs in todo:
                for name, ls in runs.items():
                    if name != "default":
                        call(m, ls[0], use, x, y, sizes)
        compile_all(rec.missing())
        for key, n_tok, use, x, y, sizes, runs in todo:
            us, outs = {}, {}
            for name, ls in runs.items():
                for lin in ls:  # warm-up: compile, module load, scratch buffers
                    call(m, lin, use, x, y, sizes)
                m.ctx.sync()
                outs[name] = output(m, use, y, sizes)
                us[name] = graph_us(m.ctx, lambda ls=ls: [call(m, ls[i % len(ls)], use, x, y, sizes)
                                                         for i in range(args.reps)], args.reps)
            ref = outs["default"]
            scale = max(float(np.abs(ref).max()), 1e-30)
            ok = {n: bool(np.isfinite(o).all() and np.abs(o - ref).max() / scale < 2e-2) for n, o in outs.items()}
            good = [n for n in us if n != "default" and ok[n]]
            best = min(good, key=us.get) if good else None
            gbps = runs["default"][0].w.nbytes / (us["default"] * 1e-6) / 1e9
            print(f"{key:<28} {n_tok:>3} {us['default']:>10.1f} {best or '-':>10} "
                  f"{us[best] if best else float('nan'):>8.1f} "
                  f"{us['default'] / us[best] if best else float('nan'):>8.2f}  {gbps:.0f} GB/s"
                  + ("" if all(ok.values()) else f"  MISMATCH {[n for n in ok if not ok[n]]}"), flush=True)
            rows.append(dict(model=model, key=key, T=n_tok, us=us, ok=ok, best=best))
            if best and n_tok in gd.T_BUCKETS and us[best] * MARGIN < us["default"]:
                choices.setdefault(key, {})[str(n_tok)] = best
        del m, todo
    models = args.models
    old = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    if old.get("gpu") == gpu_name():  # other models' shapes stay; this run's shapes are replaced
        measured = {r["key"] for r in rows}
        choices = {**{k: v for k, v in old["choices"].items() if k not in measured}, **choices}
        models = ",".join(dict.fromkeys(old["models"].split(",") + args.models.split(",")))
    table = {"note": "written by scripts/bench_gemv_rows.py on the GPU named", "gpu": gpu_name(),
             "models": models, "choices": choices}
    Path(args.out).write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {args.out}: {sum(len(v) for v in choices.values())} (shape, T) entries")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def gpu_name() -> str:
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else name


if __name__ == "__main__":
    sys.exit(main())
