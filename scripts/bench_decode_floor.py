"""The floor of a one-kernel (persistent) decode step: how fast a megakernel could run a qwen3moe
GGUF on this GPU, with the model's bytes and dependencies and none of its arithmetic.

One launch a token, one block an SM (all resident), a grid barrier after each of a layer's six
dependent phases (Q|K|V, QK-norm and RoPE, attention over the KV cache, attn_output with the
router, the routed gate|up, the routed down) and after the logits: the block's threads publish a
float each, thread 0 arrives (red.release) and polls (ld.acquire), then every thread reads a float
another block wrote (the chain's L2 round trip). After the router phase every block reads the 8
experts' ids block 0 wrote. Weights are read as 16-byte vectors and XOR-ed together; a phase's
bytes are the GGUF's (the router as impnb's fp16 fold), the KV cache's at --ctx keys in fp16.
Modes: bare barriers (relaxed, nothing published or read: the hardware's round trip); barriers
only (the chain, no weights); reads after barrier (each phase reads its weights when its barrier
opens, as kernels without early loads); routed to smem only (the 8 experts' gate|up and down
slices bulk-copied (TMA, an mbarrier each) into shared memory when the router's barrier opens);
prefetched to smem (that, and the next layer's Q|K|V, KV and attn_output + router slices
bulk-copied while the down runs: 169 KB a block); prefetched, 4 syncs (that without the
barriers after Q|K|V and after QK-norm/RoPE, as if attention fused both for free). Last, the
chain as one empty programmatic kernel a phase (the decode graph's way), for the sync alone.
Per mode the µs from barrier to barrier of a layer's phases (block 0's %globaltimer, the last
token). A real kernel adds its arithmetic to every row.

Its figures, and what they say about a one-kernel decode: docs/EXPERIMENTS.md, 'Megakernel floor'.
    python scripts/bench_decode_floor.py /tmp/moe.gguf [--tokens 16] [--threads 128]
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import cuda, float32, int32, int64, types, uint32, uint64
from numba.cuda.extending import intrinsic

sys.path.insert(0, str(Path(__file__).parents[1]))

from impnb.commands.bench import bytes_per_token  # noqa: E402
from impnb.gguf_file import ModelFile  # noqa: E402
from impnb.gpu.context import GpuContext  # noqa: E402
from impnb.graphs.timing import graph_us  # noqa: E402
from impnb.kernels.common import ptx  # noqa: E402
from impnb.kernels.common import quant_intrinsics as qi  # noqa: E402
from impnb.kernels.common.ptx import inline_asm, element_ptr, as_i32  # noqa: E402
from impnb.launch import launch  # noqa: E402
from impnb.models import model_config  # noqa: E402

VEC = 4096  # floats of a phase's output vector (the chain)
USED = 8    # experts a token
SPIN_MAX = 1 << 25  # a barrier gives up after this many polls (blocks not all resident)
# the modes, in the order they run, and their rows' names
BARE, CHAIN, READS, ROUTED, PREFETCH, FOUR_SYNCS = range(6)
MODES = ("bare barriers", "barriers only", "reads after barrier", "routed to smem only",
         "prefetched to smem", "prefetched, 4 syncs")


def _ld(sem):
    @intrinsic
    def ld(typingctx, a, i):
        """ld.<sem>.gpu.global.u32 r, [&a[i]]"""
        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            return inline_asm(builder, ir.IntType(32), [ptr], f"ld.{sem}.gpu.global.u32 $0, [$1];", "=r,l,~{memory}", True)
        return types.uint32(a, i), codegen
    return ld


def _red_add(sem):
    @intrinsic
    def red(typingctx, a, i):
        """red.<sem>.gpu.global.add.u32 [&a[i]], 1"""
        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            inline_asm(builder, ir.VoidType(), [ptr], f"red.{sem}.gpu.global.add.u32 [$0], 1;", "l,~{memory}", True)
            return context.get_dummy_value()
        return types.void(a, i), codegen
    return red


@intrinsic
def _globaltimer(typingctx):
    """mov.u64 r, %globaltimer (ns)"""
    def codegen(context, builder, sig, args):
        return inline_asm(builder, ir.IntType(64), [], "mov.u64 $0, %globaltimer;", "=l", True)
    return types.int64(), codegen


@intrinsic
def _mbar_init(typingctx, mb):
    """mbarrier.init.shared::cta.b64 [mb], 1; then the init made visible to the async proxy"""
    def codegen(context, builder, sig, args):
        inline_asm(builder, ir.VoidType(), [args[0]], "mbarrier.init.shared::cta.b64 [$0], 1; "
             "fence.mbarrier_init.release.cluster;", "r,~{memory}", True)
        return context.get_dummy_value()
    return types.void(mb), codegen


@intrinsic
def _mbar_expect(typingctx, mb, nbytes):
    """mbarrier.arrive.expect_tx.shared::cta.b64 _, [mb], nbytes"""
    def codegen(context, builder, sig, args):
        inline_asm(builder, ir.VoidType(), [args[0], as_i32(builder, args[1])],
             "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}", True)
        return context.get_dummy_value()
    return types.void(mb, nbytes), codegen


@intrinsic
def _mbar_ready(typingctx, mb, parity):
    """1 once phase `parity` of mbarrier mb completed (mbarrier.try_wait.parity), else 0"""
    def codegen(context, builder, sig, args):
        return inline_asm(builder, ir.IntType(32), [args[0], as_i32(builder, args[1])],
                    "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.u32 $0, 1, 0, p; }",
                    "=r,r,r,~{memory}", True)
    return types.uint32(mb, parity), codegen


@intrinsic
def _bulk_copy(typingctx, dst, a, i, nbytes, mb):
    """cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [&a[i]], nbytes, [mb]"""
    def codegen(context, builder, sig, args):
        ptr = element_ptr(context, builder, sig.args[1], args[1], args[2], sig.args[2])
        inline_asm(builder, ir.VoidType(), [args[0], ptr, as_i32(builder, args[3]), args[4]],
             "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
             "r,l,r,r,~{memory}", True)
        return context.get_dummy_value()
    return types.void(dst, a, i, nbytes, mb), codegen


_ld_acquire, _ld_relaxed = _ld("acquire"), _ld("relaxed")
_red_release_add, _red_relaxed_add = _red_add("release"), _red_add("relaxed")


@cuda.jit(device=True, inline=True)
def _sync(bar, target, vec, slot, acc, mode, stamp, at):
    """Publish this phase's output, wait for every block, read the next phase's input (BARE: a
    relaxed barrier, no output: the hardware's round trip alone). A barrier that gives up (blocks
    not all resident) sets bar[2]."""
    t, b = cuda.threadIdx.x, cuda.blockIdx.x
    if mode != BARE:
        vec[slot * VEC + (b * cuda.blockDim.x + t) % VEC] = float32(acc & 1)
    cuda.syncthreads()
    if t == 0:
        if mode == BARE:
            _red_relaxed_add(bar, 0)
        else:
            _red_release_add(bar, 0)
        spins = 0
        while spins < SPIN_MAX:
            seen = _ld_relaxed(bar, 0) if mode == BARE else _ld_acquire(bar, 0)
            if int64(seen) >= target:
                break
            spins += 1
        if spins == SPIN_MAX:
            bar[2] = 1
        if cuda.blockIdx.x == 0:
            stamp[at] = _globaltimer()  # when block 0 leaves barrier `at`
    cuda.syncthreads()
    if mode != BARE:
        acc ^= uint32(ptx.ld_global_cg_f32(vec, slot * VEC + (t * cuda.gridDim.x + b) % VEC) != 0)
    return acc


@cuda.jit
def _link(vec, slot):
    """One phase as a kernel of its own: wait for the kernel before, read its output, write ours."""
    ptx.grid_dep_wait()
    ptx.grid_dep_launch()
    t, b = cuda.threadIdx.x, cuda.blockIdx.x
    x = ptx.ld_global_cg_f32(vec, slot * VEC + (t * cuda.gridDim.x + b) % VEC)
    vec[(1 - slot) * VEC + (b * cuda.blockDim.x + t) % VEC] = x + float32(1)


@cuda.jit(device=True, inline=True)
def _stream(w, at, n, acc):
    """XOR of this block's n vectors from word `at` (4 loads a thread in flight)."""
    nt = cuda.blockDim.x
    for k in range(cuda.threadIdx.x, n, 4 * nt):
        a0, a1, a2, a3 = qi.ldg_u32x4(w, at + 4 * k)
        b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = uint32(0)
        if k + nt < n:
            b0, b1, b2, b3 = qi.ldg_u32x4(w, at + 4 * (k + nt))
        if k + 2 * nt < n:
            c0, c1, c2, c3 = qi.ldg_u32x4(w, at + 4 * (k + 2 * nt))
        if k + 3 * nt < n:
            d0, d1, d2, d3 = qi.ldg_u32x4(w, at + 4 * (k + 3 * nt))
        acc ^= (a0 ^ a1 ^ a2 ^ a3) ^ (b0 ^ b1 ^ b2 ^ b3) ^ (c0 ^ c1 ^ c2 ^ c3) ^ (d0 ^ d1 ^ d2 ^ d3)
    return acc


@cuda.jit(device=True, inline=True)
def _fetch(smem, s, w, at, n, mb):
    """Thread 0: a bulk copy (TMA) of this block's n vectors from word `at` to smem vector s,
    counted on mbarrier mb (armed by _arm)."""
    if cuda.threadIdx.x == 0:
        _bulk_copy(ptx.smem_addr(smem, 4 * s), w, at, 16 * n, mb)


@cuda.jit(device=True, inline=True)
def _arm(mb, nbytes):
    if cuda.threadIdx.x == 0:
        _mbar_expect(mb, nbytes)


@cuda.jit(device=True, inline=True)
def _wait(mb, parity):
    while _mbar_ready(mb, parity) == 0:
        pass


@cuda.jit(device=True, inline=True)
def _consume(smem, s, n, acc):
    for k in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        v0, v1, v2, v3 = ptx.ld_shared_v4_u32(ptx.smem_addr(smem, 4 * (s + k)))
        acc ^= v0 ^ v1 ^ v2 ^ v3
    return acc


@cuda.jit(device=True, inline=True)
def _routed(w, ids, at, stride, n, acc):
    """XOR of this block's n vectors of each of the 8 experts (8 loads a thread in flight)."""
    e0, e1, e2, e3 = int64(ids[0]) * stride, int64(ids[1]) * stride, int64(ids[2]) * stride, int64(ids[3]) * stride
    e4, e5, e6, e7 = int64(ids[4]) * stride, int64(ids[5]) * stride, int64(ids[6]) * stride, int64(ids[7]) * stride
    for k in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        a = at + 4 * k
        a0, a1, a2, a3 = qi.ldg_u32x4(w, a + e0)
        b0, b1, b2, b3 = qi.ldg_u32x4(w, a + e1)
        c0, c1, c2, c3 = qi.ldg_u32x4(w, a + e2)
        d0, d1, d2, d3 = qi.ldg_u32x4(w, a + e3)
        f0, f1, f2, f3 = qi.ldg_u32x4(w, a + e4)
        g0, g1, g2, g3 = qi.ldg_u32x4(w, a + e5)
        h0, h1, h2, h3 = qi.ldg_u32x4(w, a + e6)
        i0, i1, i2, i3 = qi.ldg_u32x4(w, a + e7)
        acc ^= ((a0 ^ a1 ^ a2 ^ a3) ^ (b0 ^ b1 ^ b2 ^ b3) ^ (c0 ^ c1 ^ c2 ^ c3) ^ (d0 ^ d1 ^ d2 ^ d3)
                ^ (f0 ^ f1 ^ f2 ^ f3) ^ (g0 ^ g1 ^ g2 ^ g3) ^ (h0 ^ h1 ^ h2 ^ h3) ^ (i0 ^ i1 ^ i2 ^ i3))
    return acc


@cuda.jit(device=True, inline=True)
def _dense(w, at, smem, s, n, mb, par, mode, acc):
    """A dense phase's n vectors a block: read from word `at` after the barrier (READS, ROUTED) or
    from smem vector s once mbarrier mb's phase `par` landed them (PREFETCH, FOUR_SYNCS)."""
    if mode == READS or mode == ROUTED:
        acc = _stream(w, at, n, acc)
    elif mode == PREFETCH or mode == FOUR_SYNCS:
        _wait(mb, par)
        acc = _consume(smem, s, n, acc)
    return acc


@cuda.jit(device=True, inline=True)
def _prefetch(smem, w, lw, b, n1, n3, n4, o3, o4, m1, m3, m4):
    """A layer's Q|K|V, KV and attn_output + router slices to smem vectors 0.. (bulk copies)."""
    _arm(m1, 16 * n1)
    _fetch(smem, 0, w, lw + 4 * b * n1, n1, m1)
    _arm(m3, 16 * n3)
    _fetch(smem, n1, w, lw + o3 + 4 * b * n3, n3, m3)
    _arm(m4, 16 * n4)
    _fetch(smem, n1 + n3, w, lw + o4 + 4 * b * n4, n4, m4)


# sizes (int64): vectors a block of Q|K|V, KV, attn_output + router, an expert's gate|up and
# down, the logits; layer and expert strides and region offsets in words are derived below
@cuda.jit(max_registers=255)  # one block an SM of up to 256 threads
def _step(w, vec, route, bar, out, stamp, sz, n_layer, n_expert, tok, mode):
    smem = cuda.shared.array(0, uint32, alignment=128)
    ids = cuda.shared.array(USED, int32)
    mbar = cuda.shared.array(5, uint64)  # gate|up's, Q|K|V's, KV's, attn_output's, down's copies
    g, b, t = cuda.gridDim.x, cuda.blockIdx.x, cuda.threadIdx.x
    n1, n3, n4, n5, n6, nl = sz[0], sz[1], sz[2], sz[3], sz[4], sz[5]
    o3 = 4 * g * n1                      # words: a layer's regions, then its experts
    o4 = o3 + 4 * g * n3
    o5 = o4 + 4 * g * n4
    es = 4 * g * (n5 + n6)               # an expert's gate|up then down
    ls = o5 + n_expert * es
    # smem vectors: the routed gate|up, later the next layer's Q|K|V, KV, o; then the routed down
    s1, s3, s4, sd = int64(0), n1, n1 + n3, max(USED * n5, n1 + n3 + n4)
    base = int64(0)
    if t == 0:
        base = int64(_ld_acquire(bar, 1))  # where the launch before left the count
        if b == 0:
            stamp[0] = _globaltimer()
    nb = int64(0)
    acc = uint32(t)
    pre = mode == PREFETCH or mode == FOUR_SYNCS  # the next layer's weights prefetched
    tma = pre or mode == ROUTED  # the routed weights copied to smem
    m0, m1, m3, m4 = ptx.smem_addr(mbar, 0), ptx.smem_addr(mbar, 1), ptx.smem_addr(mbar, 2), ptx.smem_addr(mbar, 3)
    m5 = ptx.smem_addr(mbar, 4)
    if tma:
        if t == 0:
            _mbar_init(m5)
            _mbar_init(m0)
            _mbar_init(m1)
            _mbar_init(m3)
            _mbar_init(m4)
        cuda.syncthreads()
    if pre:
        _prefetch(smem, w, int64(0), b, n1, n3, n4, o3, o4, m1, m3, m4)
    for layer in range(n_layer):
        lw = int64(layer) * ls
        par = layer & 1  # the mbarriers' phase this layer
        # Q|K|V
        acc = _dense(w, lw + 4 * b * n1, smem, s1, n1, m1, par, mode, acc)
        if mode != FOUR_SYNCS:
            nb += 1
            acc = _sync(bar, base + nb * g, vec, 0, acc, mode, stamp, nb)
        # QK-norm, RoPE, the KV write
        if mode != FOUR_SYNCS:
            nb += 1
            acc = _sync(bar, base + nb * g, vec, 1, acc, mode, stamp, nb)
        # attention
        acc = _dense(w, lw + o3 + 4 * b * n3, smem, s3, n3, m3, par, mode, acc)
        nb += 1
        acc = _sync(bar, base + nb * g, vec, 0, acc, mode, stamp, nb)
        # attn_output and the router; block 0 writes the 8 experts' ids
        acc = _dense(w, lw + o4 + 4 * b * n4, smem, s4, n4, m4, par, mode, acc)
        if b == 0 and t < USED:
            pick = t * (n_expert // USED) + (layer * 7 + tok * 13) % n_expert  # 8 distinct experts
            route[layer * USED + t] = float32(pick % n_expert)
        nb += 1
        acc = _sync(bar, base + nb * g, vec, 1, acc, mode, stamp, nb)
        if t < USED:
            ids[t] = int32(ptx.ld_global_cg_f32(route, layer * USED + t))
        cuda.syncthreads()
        # the routed gate|up (tma: its weights and the down's copied to smem at once)
        if tma:
            _arm(m0, 16 * USED * n5)
            for j in range(USED):
                _fetch(smem, j * n5, w, lw + o5 + int64(ids[j]) * es + 4 * b * n5, n5, m0)
            _arm(m5, 16 * USED * n6)
            for j in range(USED):
                _fetch(smem, sd + j * n6, w, lw + o5 + int64(ids[j]) * es + 4 * g * n5 + 4 * b * n6, n6, m5)
            _wait(m0, par)
            acc = _consume(smem, 0, USED * n5, acc)
        elif mode == READS:
            acc = _routed(w, ids, lw + o5 + 4 * b * n5, es, n5, acc)
        nb += 1
        acc = _sync(bar, base + nb * g, vec, 0, acc, mode, stamp, nb)
        # the routed down (pre: the next layer's weights' copies issued first)
        if mode == READS:
            acc = _routed(w, ids, lw + o5 + 4 * g * n5 + 4 * b * n6, es, n6, acc)
        elif tma:
            if pre and layer + 1 < n_layer:
                _prefetch(smem, w, lw + ls, b, n1, n3, n4, o3, o4, m1, m3, m4)
            _wait(m5, par)
            acc = _consume(smem, sd, USED * n6, acc)
        nb += 1
        acc = _sync(bar, base + nb * g, vec, 1, acc, mode, stamp, nb)
    if mode != BARE and mode != CHAIN:
        acc = _stream(w, int64(n_layer) * ls + 4 * b * nl, nl, acc)
    nb += 1
    acc = _sync(bar, base + nb * g, vec, 0, acc, mode, stamp, nb)
    if b == 0 and t == 0:
        bar[1] = base + nb * g
    out[b * cuda.blockDim.x + t] = acc


def phase_bytes(mf, cfg, ctx: int) -> dict:
    """Bytes a token of each phase, summed over layers (the logits' alone), the routed at k of E."""
    def nbytes(name):
        return mf.tensors[name].data.nbytes if name in mf.tensors else 0

    b = dict.fromkeys(("qkv", "kv", "o_router", "gate_up", "down"), 0)
    fold = 2 * cfg.n_expert * (cfg.n_embd + cfg.n_head * cfg.head_dim)  # Wx, Wa in fp16
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        b["qkv"] += sum(nbytes(p + f"attn_{x}.weight") for x in "qkv")
        b["kv"] += ctx * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * 2
        b["o_router"] += nbytes(p + "attn_output.weight") + fold
        k = cfg.n_expert_used
        b["gate_up"] += (nbytes(p + "ffn_gate_exps.weight") + nbytes(p + "ffn_up_exps.weight")) // cfg.n_expert * k
        b["down"] += nbytes(p + "ffn_down_exps.weight") // cfg.n_expert * k
    b["logits"] = nbytes("output.weight") or nbytes("token_embd.weight")
    return b


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=576, help="keys in the cache (tg128 after 512: 576 on average)")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=128)
    ap.add_argument("--copy-gbs", type=float, default=2970.0)
    args = ap.parse_args()
    mf = ModelFile(args.model)
    cfg = model_config(mf)
    if cfg.n_expert_used != USED:
        sys.exit(f"the skeleton routes {USED} experts a token; {args.model} uses {cfg.n_expert_used}")
    pb = phase_bytes(mf, cfg, args.ctx)
    ctx = GpuContext()
    g = ctx.cuda.get_current_device().MULTIPROCESSOR_COUNT
    L, E = cfg.n_layer, cfg.n_expert
    phases = 6 * L + 1
    per = lambda n: -(-n // (16 * g))  # vectors a block
    sz = np.array([per(pb["qkv"] // L), per(pb["kv"] // L), per(pb["o_router"] // L),
                   per(pb["gate_up"] // L // USED), per(pb["down"] // L // USED), per(pb["logits"])], np.int64)
    smem = 16 * int(USED * sz[4] + max(USED * sz[3], sz[0] + sz[1] + sz[2]))
    layer_words = 4 * g * int(sz[0] + sz[1] + sz[2] + E * (sz[3] + sz[4]))
    words = L * layer_words + 4 * g * int(sz[5])
    bound = bytes_per_token(mf, cfg)
    print(f"{cfg.arch}: {L} layers, {E} experts; MB a token: "
          + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in pb.items())
          + f"; bytes_per_token {bound / 1e6:.1f} MB; buffer {4 * words / 2**30:.1f} GiB;"
          + f" smem {smem // 1024} KB a block")
    s = ctx.nb_stream
    w = cuda.device_array(words, np.uint32)
    vec = ctx.upload(np.random.default_rng(0).standard_normal(2 * VEC).astype(np.float32))
    route = ctx.upload(np.zeros(L * USED, np.float32))
    bar = ctx.upload(np.zeros(3, np.uint32))  # the arrivals, where a launch left them, gave up
    out = ctx.empty(g * args.threads, np.uint32)
    dsz = ctx.upload(sz)
    stamp = ctx.upload(np.zeros(phases + 1, np.int64))
    print(f"{'mode':<22} {'µs a token':>10} {'µs a phase':>10} {'tok/s':>8} {'of bound':>8}")

    def row(name, us, phases=phases):
        frac = bound / (us * 1e-6) / (args.copy_gbs * 1e9)
        print(f"{name:<22} {us:>10.1f} {us / phases:>10.2f} {1e6 / us:>8.1f} {100 * frac:>7.1f}%", flush=True)

    for mode in range(len(MODES)):
        body = lambda: [launch(_step, g, args.threads, s, w, vec, route, bar, out, stamp, dsz, np.int32(L),
                               np.int32(E), np.int32(i), np.int32(mode), shared_bytes=smem)
                        for i in range(args.tokens)]
        body()
        ctx.sync()
        n = phases - 2 * L * (mode == FOUR_SYNCS)
        us = graph_us(ctx, body, args.tokens)
        if bar.copy_to_host()[2]:
            sys.exit(f"{MODES[mode]}: a barrier gave up waiting (were all {g} blocks resident?)")
        row(MODES[mode], us, n)
        d = np.diff(stamp.copy_to_host()[:n + 1]) / 1e3  # µs from barrier to barrier, the last token
        avg = d[:-1].reshape(L, (n - 1) // L)[1:].mean(axis=0)  # a layer's phases, layer 0 left out
        print(f"{'':<22} a layer's phases (µs): " + " ".join(f"{x:.2f}" for x in avg) + f"; logits {d[-1]:.2f}")
    chain = lambda: [launch(_link, g, args.threads, s, vec, np.int32(i % 2)) for i in range(phases)]
    chain()
    ctx.sync()
    row("a kernel a phase (PDL)", graph_us(ctx, chain, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
