"""Inline-PTX intrinsics for Hopper's warpgroup MMA (wgmma, sm_90a only), beside ptx.py's mma.sync.

A warpgroup (4 consecutive warps, 128 threads) multiplies A (64 x 16) by B (16 x N) from shared
memory, both described by 64-bit matrix descriptors, into fp32 accumulators spread over its
threads, asynchronously: `wgmma_fence` before the first wgmma that touches registers written
since, `wgmma_commit` to close a group, `wgmma_wait(n)` until at most n groups are in flight.
Shared memory written by threads (st.shared, cp.async) must be made visible to the async proxy
that wgmma reads through: `fence_proxy_async` after the writes, before the barrier.

Operands are fp16 or bf16, by name: `MMA[dtype][n]`, `MMA_FIRST`, `MMA_RS`, `MMA_RS_K[n]` (fp16
A in registers, B K-major). Operand layout:
"K-major" A (M x K, K contiguous) and B (N x K, K contiguous), no transpose, in the 128-byte
swizzle: a row of 64 16-bit values (128 bytes), its 16-byte chunk ch stored at chunk ch ^ (row & 7), 8-row groups of 1024 bytes, the tile 1024-byte aligned (the layout TMA's
SWIZZLE_128B writes). `desc_sw128(addr)` describes rows from addr on; k step kk (16 values)
of a 64-wide tile starts 32 kk bytes further (desc + 2 kk).

The register-A form (`MMA_RS`) takes A from registers in mma.sync m16n8k16's A fragment layout
(warp w of the warpgroup rows 16 w ..) and B "MN-major" (`desc_sw128_mn`): a K x N tile stored
as rows of k, 64 n values (128 bytes) a row, swizzled as above, 8-row groups 1024 bytes apart;
N past 64 continues in a second such block `lbo` bytes on (PTX ISA, "Canonical Layouts",
MN-major 128B: ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))). So a tile of keys x head dim stored for K-major use (S = Q·Kᵀ) is also V's MN-major B for
O += P·V, with no transpose in memory.

Accumulators (PTX ISA, "Register fragment of wgmma D, .f32"): thread t = 32 w + 4 g + c of the
warpgroup holds, in register i of N/2, row 16 w + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 c + (i & 1).

Numba's simulator cannot run these; tests that need them skip there (ptx_sim has no twin).
tests/gpu/test_ptx_wgmma.py probes attention's forms (MMA_FIRST, MMA_RS) thread by thread.
"""

from numba import config

SIM = bool(config.ENABLE_CUDASIM)
WG_N = (64, 128, 256)  # wgmma widths built here (the GEMM tiles' BN, attention's keys a tile)
WG_N_RS = (64, 128)  # register-A widths (attention's head dims)
WG_N_RS_K = (16, 32, 64, 128)  # register-A widths with B K-major (gemm_wgmma_rs's token tiles)

if not SIM:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from impnb.kernels.common.ptx import inline_asm, no_operand

    _F32 = ir.FloatType()
    _I64 = ir.IntType(64)

    wgmma_fence = no_operand("wgmma.fence.sync.aligned;")
    wgmma_commit = no_operand("wgmma.commit_group.sync.aligned;")
    fence_proxy_async = no_operand("fence.proxy.async.shared::cta;")

    @intrinsic
    def wgmma_wait(typingctx, n):
        """wgmma.wait_group.sync.aligned n; n a compile-time integer."""
        if not isinstance(n, types.IntegerLiteral):
            return None
        text = f"wgmma.wait_group.sync.aligned {n.literal_value};"

        def codegen(context, builder, sig, args):
            inline_asm(builder, ir.VoidType(), [], text, "~{memory}", side_effect=True)
            return context.get_dummy_value()
        return types.void(n), codegen

    @intrinsic
    def desc_sw128(typingctx, addr):
        """Matrix descriptor of a K-major 128-byte-swizzled tile at shared-window address addr:
        start (addr >> 4, 14 bits), leading-byte offset 1 (unused by this layout), stride-byte
        offset 1024 >> 4 (between 8-row groups), layout 128B swizzle (1 << 62)."""
        if not isinstance(addr, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            a = builder.zext(builder.trunc(args[0], ir.IntType(32)), _I64)
            start = builder.and_(builder.lshr(a, _I64(4)), _I64(0x3FFF))
            return builder.or_(start, _I64((1 << 16) | (64 << 32) | (1 << 62)))
        return types.uint64(addr), codegen

    @intrinsic
    def desc_sw128_mn(typingctx, addr, lbo):
        """Matrix descriptor of an MN-major 128-byte-swizzled tile at shared-window address addr:
        start (addr >> 4), leading-byte offset lbo >> 4 (between 64-wide n blocks; lbo a
        compile-time integer), stride-byte offset 1024 >> 4 (between 8-row k groups), 128B swizzle."""
        if not (isinstance(addr, types.Integer) and isinstance(lbo, types.IntegerLiteral)):
            return None
        const = ((lbo.literal_value >> 4) << 16) | (64 << 32) | (1 << 62)

        def codegen(context, builder, sig, args):
            a = builder.zext(builder.trunc(args[0], ir.IntType(32)), _I64)
            return builder.or_(builder.and_(builder.lshr(a, _I64(4)), _I64(0x3FFF)), _I64(const))
        return types.uint64(addr, lbo), codegen

    def _mma(n, scale_d=1, dtype="f16"):
        text = (f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype} "
                "{" + ", ".join(f"${i}" for i in range(n // 2)) + "}, "
                f"${n}, ${n + 1}, {scale_d}, 1, 1, 0, 0;")
        constraints = ",".join(["=f"] * (n // 2) + [str(i) for i in range(n // 2)] + ["l", "l", "~{memory}"])

        @intrinsic
        def mma(typingctx, acc, da, db):
            """acc (n/2 float32 local array) += A·B of a 64 x 16 A and 16 x n B (descriptors da,
            db), issued asynchronously: the registers are read and written when the group is waited.
            (scale_d 0: acc = A·B, its old values ignored.)"""
            if not (isinstance(acc, types.Array) and acc.dtype == types.float32
                    and isinstance(da, types.Integer) and isinstance(db, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                data = context.make_array(sig.args[0])(context, builder, args[0]).data
                ptrs = [builder.gep(data, [ir.IntType(64)(i)]) for i in range(n // 2)]
                vals = [builder.load(p) for p in ptrs]
                res = inline_asm(builder, ir.LiteralStructType([_F32] * (n // 2)),
                           vals + [builder.zext(args[1], _I64) if args[1].type.width < 64 else args[1],
                                   builder.zext(args[2], _I64) if args[2].type.width < 64 else args[2]],
                           text, constraints, side_effect=True)
                for i, p in enumerate(ptrs):
                    builder.store(builder.extract_value(res, i), p)
                return context.get_dummy_value()
            return types.void(acc, da, db), codegen
        mma.__doc__ = text
        return mma

    def _mma_rs(n, dtype, trans_b=1):
        text = (f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype} "
                "{" + ", ".join(f"${i}" for i in range(n // 2)) + "}, "
                "{" + ", ".join(f"${n + i}" for i in range(4)) + "}, "
                f"${n + 4}, 1, 1, 1, {trans_b};")
        constraints = ",".join(["=f"] * (n // 2) + [str(i) for i in range(n // 2)] + ["r"] * 4 + ["l", "~{memory}"])

        @intrinsic
        def mma(typingctx, acc, a0, a1, a2, a3, db):
            """acc (n/2 float32 local array) += A·B of a 64 x 16 A in registers (a0..a3: this
            thread's 16-bit pairs of mma.sync's A fragment) and a 16 x n B (descriptor db,
            MN-major with trans-b 1, else K-major), asynchronously as the shared-memory form."""
            if not (isinstance(acc, types.Array) and acc.dtype == types.float32
                    and all(isinstance(t, types.Integer) for t in (a0, a1, a2, a3, db))):
                return None

            def codegen(context, builder, sig, args):
                data = context.make_array(sig.args[0])(context, builder, args[0]).data
                ptrs = [builder.gep(data, [ir.IntType(64)(i)]) for i in range(n // 2)]
                vals = [builder.load(p) for p in ptrs]
                regs = [builder.trunc(a, ir.IntType(32)) if a.type.width > 32 else a for a in args[1:5]]
                desc = builder.zext(args[5], _I64) if args[5].type.width < 64 else args[5]
                res = inline_asm(builder, ir.LiteralStructType([_F32] * (n // 2)), vals + regs + [desc],
                           text, constraints, side_effect=True)
                for i, p in enumerate(ptrs):
                    builder.store(builder.extract_value(res, i), p)
                return context.get_dummy_value()
            return types.void(acc, a0, a1, a2, a3, db), codegen
        mma.__doc__ = text
        return mma

    # by operand type and width: acc += A·B; acc = A·B (attention's S, first k step); A in
    # registers with B MN-major (attention's P·V); fp16 A in registers with B K-major
    # (gemm_wgmma_rs: W's decoded quants times a few token rows)
    MMA = {t: {n: _mma(n, 1, t) for n in WG_N} for t in ("f16", "bf16")}
    MMA_FIRST = {t: {n: _mma(n, 0, t) for n in WG_N} for t in ("f16", "bf16")}
    MMA_RS = {t: {n: _mma_rs(n, t) for n in WG_N_RS} for t in ("f16", "bf16")}
    MMA_RS_K = {n: _mma_rs(n, "f16", 0) for n in WG_N_RS_K}
