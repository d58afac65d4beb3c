"""Inline-PTX intrinsics for Hopper's warpgroup MMA (wgmma, sm_90a only), beside ptx.py's mma.sync.

A warpgroup (4 consecutive warps, 128 threads) multiplies A (64 x 16) by B (16 x N) from shared
memory, both described by 64-bit matrix descriptors, into fp32 accumulators spread over its
threads, asynchronously: `wgmma_fence` before the first wgmma that touches registers written
since, `wgmma_commit` to close a group, `wgmma_wait(n)` until at most n groups are in flight.
Shared memory written by threads (st.shared, cp.async) must be made visible to the async proxy
that wgmma reads through: `fence_proxy_async` after the writes, before the barrier.

Operand layout: "K-major" A (M x K, K contiguous) and B (N x K, K contiguous), no transpose, in
the 128-byte swizzle: a row of 64 fp16 (128 bytes), its 16-byte chunk ch stored at chunk
ch ^ (row & 7), 8-row groups of 1024 bytes, the tile 1024-byte aligned (the layout TMA's
SWIZZLE_128B writes). `desc_sw128(addr)` describes rows from addr on; k step kk (16 values)
of a 64-wide tile starts 32 kk bytes further (desc + 2 kk).

Accumulators (PTX ISA, "Register fragment of wgmma D, .f32"): thread t = 32 w + 4 g + c of the
warpgroup holds, in register i of N/2, row 16 w + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 c + (i & 1).

Numba's simulator cannot run these; tests that need them skip there (ptx_sim has no twin).
"""

from numba import config

SIM = bool(config.ENABLE_CUDASIM)
WG_N = (128, 256)  # wgmma widths built here (the tiles' BN)

if not SIM:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from impnb.kernels.ptx import _asm, _no_operand

    _F32 = ir.FloatType()
    _I64 = ir.IntType(64)

    wgmma_fence = _no_operand("wgmma.fence.sync.aligned;")
    wgmma_commit = _no_operand("wgmma.commit_group.sync.aligned;")
    fence_proxy_async = _no_operand("fence.proxy.async.shared::cta;")

    @intrinsic
    def wgmma_wait(typingctx, n):
        """wgmma.wait_group.sync.aligned n; n a compile-time integer."""
        if not isinstance(n, types.IntegerLiteral):
            return None
        text = f"wgmma.wait_group.sync.aligned {n.literal_value};"

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], text, "~{memory}", side_effect=True)
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

    def _mma(n):
        text = (f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 "
                "{" + ", ".join(f"${i}" for i in range(n // 2)) + "}, "
                f"${n}, ${n + 1}, 1, 1, 1, 0, 0;")
        constraints = ",".join(["=f"] * (n // 2) + [str(i) for i in range(n // 2)] + ["l", "l", "~{memory}"])

        @intrinsic
        def mma(typingctx, acc, da, db):
            """acc (n/2 float32 local array) += A·B of a 64 x 16 A and 16 x n B (descriptors da,
            db), issued asynchronously: the registers are read and written when the group is waited."""
            if not (isinstance(acc, types.Array) and acc.dtype == types.float32
                    and isinstance(da, types.Integer) and isinstance(db, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                data = context.make_array(sig.args[0])(context, builder, args[0]).data
                ptrs = [builder.gep(data, [ir.IntType(64)(i)]) for i in range(n // 2)]
                vals = [builder.load(p) for p in ptrs]
                res = _asm(builder, ir.LiteralStructType([_F32] * (n // 2)),
                           vals + [builder.zext(args[1], _I64) if args[1].type.width < 64 else args[1],
                                   builder.zext(args[2], _I64) if args[2].type.width < 64 else args[2]],
                           text, constraints, side_effect=True)
                for i, p in enumerate(ptrs):
                    builder.store(builder.extract_value(res, i), p)
                return context.get_dummy_value()
            return types.void(acc, da, db), codegen
        mma.__doc__ = text
        return mma

    MMA_F16 = {n: _mma(n) for n in WG_N}
