"""One qwen3moe layer's routed-expert FFN at decode (T = 1) on the GPU, piece by piece and whole.

Shapes of the synthetic Qwen3-30B-A3B Q4_K_M (tune_moe.expert_matrices: E = 128, k = 8, D = 2048,
F = 768; gate|up Q4_K stacked per expert, down Q6_K or Q4_K) and an F32 router (E, D). Rows:
  router   the router GEMV then moe_route (before), or gemv_route: the GEMV's last block routes,
           per GEMV variant (span, unroll, rows per group)
  gate|up  gemv_experts with SiLU, per variant
  down     gemv_experts + moe_combine + norm.rms_norm_add (before), or experts_down_sum with the
           residual tail (kernels/gemv_moe.py)
  layer    all of it, default variants, before and after
Each call reads other expert weights: 2 copies of every matrix, 16 inputs h (so the router picks
other experts) and 16 fixed routings for the gate|up and down rows, taken in turn. --calls calls
are captured into one CUDA graph (programmatic launches as in a decode step) and replayed, the
median of 5 replays after a warm-up. GB/s counts the weight bytes a call reads (the router's and
8 experts' gate|up and down) against the 2.97 TB/s copy rate.
    python scripts/bench_moe_decode.py [--calls 32] [--json PATH]
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
from impnb.kernels import gemv, norm, repack  # noqa: E402
from impnb.kernels.gemv_moe import experts_down_sum  # noqa: E402
from impnb.kernels.gemv_tail import Residual  # noqa: E402
from impnb.kernels.gemv_variants import Variant  # noqa: E402
from impnb.kernels.moe import moe_combine, moe_route  # noqa: E402

PEAK = 2.97e12
N_IN = 16
ROUTER_VARIANTS = [None, Variant(128, 1, 1), Variant(64, 1, 1), Variant(128, 1, 2), Variant(32, 1, 1)]
GLU_VARIANTS = [None, Variant(32, 2, 4), Variant(32, 1, 4), Variant(128, 1, 2), Variant(64, 1, 8),
                Variant(32, 2, 2), Variant(64, 2, 4)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()
    shape = sf.SHAPES["qwen3-30b-a3b"]
    E, k, D, F = shape.num_experts, shape.num_experts_per_tok, shape.hidden_size, shape.moe_intermediate_size
    ctx = GpuContext()
    dev = SimpleNamespace(ctx=ctx, arena=Arena(ctx))
    s, rng = ctx.nb_stream, np.random.default_rng(0)
    copies = [expert_matrices(dev, "Q4_K_M", seed) for seed in (0, 1)]
    gate_up = [next(w for key, w in m.items() if key[0] == "ffn_gate_up_exps") for m in copies]
    downs = {t: [m[key] for m in copies for key in m if key[0] == "ffn_down_exps" and key[1] == t]
             for t in (T.Q6_K, T.Q4_K)}
    routers = [repack.repack((rng.standard_normal((E, D)) * 0.05).astype(np.float32), T.F32).to_device(s)
               for _ in copies]
    hs = [ctx.upload(rng.standard_normal((1, D)).astype(np.float32)) for _ in range(N_IN)]
    routings = [ctx.upload(rng.choice(E, k, replace=False).astype(np.int32)) for _ in range(N_IN)]
    logits, experts = ctx.empty((1, E), np.float32), ctx.empty((1, k), np.int32)
    weights = ctx.upload(np.full((1, k), 1 / k, np.float32))
    act, y = ctx.empty((k, F), np.float32), ctx.empty((k, D), np.float32)
    out, h_next = ctx.empty((1, D), np.float32), ctx.empty((1, D), np.float32)
    x = ctx.upload(np.zeros((1, D), np.float32))
    w_next = ctx.upload(np.ones(D, np.float32))
    counter = ctx.upload(np.zeros(1, np.uint32))
    res = Residual(x, h_next, w_next, None, 1e-6, counter)
    slot_rows = ctx.upload(np.arange(k, dtype=np.int32))
    per_expert = {"router": routers[0].nbytes, "gate_up": gate_up[0].nbytes // E,
                  **{f"down {t.name}": downs[t][0].nbytes // E for t in downs}}

    def router_old(i, v=None):
        gemv.gemv(routers[i % 2], hs[i % N_IN], logits, s, variant=v)
        moe_route(logits, k, True, experts, weights, s)

    def router_new(i, v=None):
        gemv.gemv_route(routers[i % 2], hs[i % N_IN], logits, k, True, experts, weights, counter, s, variant=v)

    def glu(i, v=None, slots=None):
        gemv.gemv_experts(gate_up[i % 2], 2 * F, hs[i % N_IN], act, routings[i % N_IN] if slots is None else slots,
                          k, s, glu=gemv.SILU, variant=v)

    def down_old(i, t, slots=None):
        slots = routings[i % N_IN] if slots is None else slots
        gemv.gemv_experts(downs[t][i % 2], D, act, y, slots, 1, s)
        moe_combine(y, slot_rows, weights, out, s)
        norm.rms_norm_add(x, out, w_next, h_next, 1e-6, s)

    def down_new(i, t, slots=None):
        experts_down_sum(downs[t][i % 2], D, act, out, routings[i % N_IN] if slots is None else slots, weights, s, res)

    def layer(i, t, new_router, new_down):
        slots = experts.reshape(k)
        (router_new if new_router else router_old)(i)
        glu(i, slots=slots)
        (down_new if new_down else down_old)(i, t, slots)

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
    timed("router: gemv + moe_route (before)", router_old, rb)
    timed("router: moe_route alone", lambda i: moe_route(logits, k, True, experts, weights, s), 0)
    for v in ROUTER_VARIANTS:
        timed(f"router: gemv alone {v.name if v else 'default'}",
              lambda i, v=v: gemv.gemv(routers[i % 2], hs[i % N_IN], logits, s, variant=v), rb)
    for v in ROUTER_VARIANTS:
        timed(f"router: gemv_route {v.name if v else 'default'}", lambda i, v=v: router_new(i, v), rb)
    gb = k * per_expert["gate_up"]
    for v in GLU_VARIANTS:
        timed(f"gate|up Q4_K: gemv_experts {v.name if v else 'default'}", lambda i, v=v: glu(i, v), gb)
    hs2 = [ctx.upload(rng.standard_normal((2, D)).astype(np.float32)) for _ in range(N_IN)]
    routings2 = [ctx.upload(rng.choice(E, 2 * k, replace=False).astype(np.int32)) for _ in range(N_IN)]
    act2 = ctx.empty((2 * k, F), np.float32)
    timed("gate|up Q4_K: gemv_experts default, 2 tokens (16 slots)",
          lambda i: gemv.gemv_experts(gate_up[i % 2], 2 * F, hs2[i % N_IN], act2, routings2[i % N_IN], k, s,
                                      glu=gemv.SILU), 2 * gb)
    for t in downs:
        db = k * per_expert[f"down {t.name}"]
        timed(f"down {t.name}: experts + combine + norm (before)", lambda i, t=t: down_old(i, t), db)
        timed(f"down {t.name}: experts_down_sum + tail", lambda i, t=t: down_new(i, t), db)
        for new in (False, True):
            timed(f"layer, down {t.name} ({'after' if new else 'before'})",
                  lambda i, t=t, new=new: layer(i, t, new, new), rb + gb + db)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
