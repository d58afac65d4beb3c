"""One qwen3moe layer's routed-expert FFN at decode (T = 1) on the GPU, piece by piece and whole.

Shapes of the synthetic Qwen3-30B-A3B in --quant (tune_moe.expert_matrices: E = 128, k = 8, D = 2048,
F = 768; Q4_K_M: gate|up Q4_K stacked per expert, down Q6_K or Q4_K) and an F32 router (E, D). The decode
path of gpu/moe.py's moe_ffn_decode, on x with ffn_norm fused into its readers. Rows:
  router   gemv_route normed (the GEMV's last block routes), per GEMV variant (span, unroll, rows);
           and writing h in int8 for dp4a as decode does (else quantize_x's work)
  gate|up  gemv_dp4a_experts with SiLU (what decode runs), and gemv_experts on float h, per variant
           of each
  down     experts_down_sum adding into x, on float act and on dp4a (experts_down_sum_dp4a)
  layer    all of it in decode's order, the down on float act or on dp4a (what decode runs)
Each call reads other expert weights: 2 copies of every matrix, 16 inputs x (so the router picks
other experts) and 16 fixed routings for the gate|up and down rows, taken in turn. --calls calls
are captured into one CUDA graph (programmatic launches as in a decode step) and replayed, the
median of 5 replays after a warm-up. GB/s counts the weight bytes a call reads (the router's and
8 experts' gate|up and down) against the 2.97 TB/s copy rate.
    python scripts/bench_moe_decode.py [--quant Q4_K_M] [--calls 32] [--json PATH]
"""

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[1]))

from tune_moe import expert_matrices  # noqa: E402

from impnb import synthetic_full as sf  # noqa: E402
from impnb.gpu.buffers import Arena  # noqa: E402
from impnb.gpu.context import GpuContext  # noqa: E402
from impnb.graphs.timing import graph_us  # noqa: E402
from impnb.kernels.gemv import gemv, gemv_experts, gemv_route  # noqa: E402
from impnb.kernels.common import repack  # noqa: E402
from impnb.kernels.gemv.gemv_dp4a_experts import gemv_dp4a_experts  # noqa: E402
from impnb.kernels.moe.gemv_moe import experts_down_sum  # noqa: E402
from impnb.kernels.moe.gemv_moe_dp4a import experts_down_sum_dp4a  # noqa: E402
from impnb.kernels.gemv.gemv_variants import Variant  # noqa: E402
from impnb.kernels.gemv.quant_x import GROUP, QuantX, quantize_x  # noqa: E402

PEAK = 2.97e12
N_IN = 16
ROUTER_VARIANTS = [None, Variant(128, 1, 1), Variant(64, 1, 1), Variant(128, 1, 2), Variant(32, 1, 1)]
GLU_VARIANTS = [None, Variant(32, 2, 4), Variant(32, 1, 4), Variant(128, 1, 2), Variant(64, 1, 8),
                Variant(32, 2, 2), Variant(64, 2, 4)]
DP4A_GLU_VARIANTS = [None, Variant(32, 2, 4), Variant(32, 1, 4), Variant(64, 1, 4), Variant(64, 2, 4),
                     Variant(32, 2, 2), Variant(64, 1, 2), Variant(128, 1, 2), Variant(32, 1, 8), Variant(64, 1, 8)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quant", default="Q4_K_M", choices=list(sf.FILE_TYPES))
    ap.add_argument("--calls", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()
    shape = sf.SHAPES["qwen3-30b-a3b"]
    E, k, D, F = shape.num_experts, shape.num_experts_per_tok, shape.hidden_size, shape.moe_intermediate_size
    ctx = GpuContext()
    dev = SimpleNamespace(ctx=ctx, arena=Arena(ctx))
    s, rng = ctx.nb_stream, np.random.default_rng(0)
    copies = [expert_matrices(dev, args.quant, seed) for seed in (0, 1)]
    gate_up = [next(w for key, w in m.items() if key[0] == "ffn_gate_up_exps") for m in copies]
    gt = T(gate_up[0].ggml_type).name
    downs = {t: [m[key] for m in copies for key in m if key[0] == "ffn_down_exps" and key[1] == t]
             for t in dict.fromkeys(key[1] for key in copies[0] if key[0] == "ffn_down_exps")}
    routers = [repack.repack((rng.standard_normal((E, D)) * 0.05).astype(np.float32), T.F32).to_device(s)
               for _ in copies]
    xs = [ctx.upload(rng.standard_normal((1, D)).astype(np.float32)) for _ in range(N_IN)]
    wn = ctx.upload((1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
    norm = (wn, 1e-6)
    routings = [ctx.upload(rng.choice(E, k, replace=False).astype(np.int32)) for _ in range(N_IN)]
    logits, experts = ctx.empty((1, E), np.float32), ctx.empty((1, k), np.int32)
    weights = ctx.upload(np.full((1, k), 1 / k, np.float32))
    act, h = ctx.empty((k, F), np.float32), ctx.empty((1, D), np.float32)
    xq = QuantX(ctx.empty((1, D // 4), np.uint32), ctx.empty((1, D // GROUP), np.float32),
                ctx.empty((1, D // GROUP), np.float32))
    counter = ctx.upload(np.zeros(1, np.uint32))
    per_expert = {"router": routers[0].nbytes, "gate_up": gate_up[0].nbytes // E,
                  **{f"down {t.name}": downs[t][0].nbytes // E for t in downs}}

    def router(i, v=None, quant=False):
        gemv_route.gemv_route(routers[i % 2], xs[i % N_IN], logits, k, True, experts, weights, counter, s, variant=v,
                        norm=norm, xq=xq if quant else None)

    def glu(i, slots=None, v=None):
        gemv_dp4a_experts(gate_up[i % 2], 2 * F, xq, act, routings[i % N_IN] if slots is None else slots, k, s,
                          glu=gemv.SILU, variant=v)

    def down(i, t, slots=None, dp4a=False):
        # adds into h, x's stand-in: what it holds is never read back in the timed calls
        fn = experts_down_sum_dp4a if dp4a else experts_down_sum
        fn(downs[t][i % 2], D, act, h, routings[i % N_IN] if slots is None else slots, weights, s, accumulate=True)

    def layer(i, t, dp4a=False):
        slots = experts.reshape(k)
        router(i, quant=True)
        glu(i, slots)
        down(i, t, slots, dp4a)

    def timed(label, fn, nbytes):
        fn(0)  # compile, load
        ctx.sync()
        us = graph_us(ctx, lambda: [fn(i) for i in range(args.calls)], args.calls)
        row = {"case": label, "us": us, "bytes": nbytes, "pct_peak": 100 * nbytes / (us * 1e-6) / PEAK}
        print(f"{label:<64} {us:8.2f} {nbytes / 1e6:7.2f} {row['pct_peak']:6.1f}", flush=True)
        rows.append(row)

    rows = []
    print(f"{'case':<64} {'µs':>8} {'MB':>7} {'% 2.97':>6}")
    rb = per_expert["router"]
    for v in ROUTER_VARIANTS:
        timed(f"router: gemv_route normed {v.name if v else 'default'}", lambda i, v=v: router(i, v), rb)
    timed("router: gemv_route normed default, h in int8", lambda i: router(i, quant=True), rb)
    timed("router: quantize_x normed alone (what that replaces)", lambda i: quantize_x(xs[i % N_IN], xq, s, norm), 0)
    gb = k * per_expert["gate_up"]
    for v in DP4A_GLU_VARIANTS:
        timed(f"gate|up {gt}: gemv_dp4a_experts {v.name if v else 'default'}", lambda i, v=v: glu(i, v=v), gb)
    for v in GLU_VARIANTS:
        timed(f"gate|up {gt}: gemv_experts {v.name if v else 'default'}",
              lambda i, v=v: gemv_experts.gemv_experts(gate_up[i % 2], 2 * F, xs[i % N_IN], act, routings[i % N_IN],
                                                       k, s, glu=gemv.SILU, variant=v), gb)
    for t in downs:
        db = k * per_expert[f"down {t.name}"]
        timed(f"down {t.name}: experts_down_sum accumulate", lambda i, t=t: down(i, t), db)
        timed(f"down {t.name}: experts_down_sum_dp4a accumulate", lambda i, t=t: down(i, t, dp4a=True), db)
        timed(f"layer, down {t.name}", lambda i, t=t: layer(i, t), rb + gb + db)
        timed(f"layer, down {t.name} on dp4a", lambda i, t=t: layer(i, t, True), rb + gb + db)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
