"""Inline-PTX intrinsics for tensor-core kernels: mma.sync, ldmatrix, cp.async, 16-byte moves, packing.

Each is a numba `@intrinsic` emitting one PTX instruction through llvmlite's `ir.InlineAsm`
(several outputs come back through a `LiteralStructType` and are returned as a tuple). Shared
memory is addressed by its 32-bit shared-window address, `smem_addr(array, i)`, as CUTLASS does;
global memory by (array, flat element index). Integer arguments of any width are truncated to 32
bits. The per-lane fragment layouts are those of the PTX ISA ("Matrix Fragments for
mma.m16n8k16", "Warp-level matrix load instruction: ldmatrix"); tests/gpu/test_ptx.py probes
every lane against them. Memory-touching instructions are volatile (`side_effect`) with a memory
clobber so LLVM never moves them across a barrier or merges two reads of a reused buffer.

Numba's CUDA simulator cannot run inline PTX: under it these names are the plain-Python twins of
ptx_sim.py (warp collectives through a per-warp barrier), so the tensor-core kernels run there too.
"""

from numba import config

SIM = bool(config.ENABLE_CUDASIM)
SMEM_ALIGN = None if SIM else 128  # alignment= for cuda.shared.array (the simulator takes none)

if SIM:
    from impnb.kernels.common.ptx_sim import (  # noqa: F401
        cluster_sync, cp_async_16, cp_async_16_zfill, cp_async_commit, cp_async_wait_all,
        cp_async_wait_group, cvta_to_shared, ex2_approx_ftz, grid_dep_launch, grid_dep_wait,
        ld_cluster_f32, ld_global_cg_f32, ld_global_cg_v4_f32, ld_global_v4_u32, ld_shared_u32, ld_shared_v2_u32,
        ld_shared_v4_f32, ld_shared_v4_u32,
        ldmatrix_x1, ldmatrix_x1_trans, ldmatrix_x2, ldmatrix_x2_trans, ldmatrix_x4, ldmatrix_x4_trans,
        mma_bf16, mma_f16, mma_s8_k16, mma_s8_k32, pack_bf16x2, pack_f16x2, prefetch_l2, smem_addr, st_global_v2_f32,
        st_global_v4_u32, st_shared_v4_u32)
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I32 = ir.IntType(32)
    _F32 = ir.FloatType()

    def as_i32(builder, v):
        """Low 32 bits of an integer value (zero-extended when narrower)."""
        w = v.type.width
        return builder.trunc(v, _I32) if w > 32 else (builder.zext(v, _I32) if w < 32 else v)

    def _f32(context, builder, v, ty):
        return context.cast(builder, v, ty, types.float32)

    def element_ptr(context, builder, aty, ary, idx, ity):
        """Generic pointer to element idx (flat, C order) of array ary."""
        data = context.make_array(aty)(context, builder, ary).data
        return builder.gep(data, [context.cast(builder, idx, ity, types.intp)])

    def inline_asm(builder, ret, args, text, constraints, side_effect=False):
        fty = ir.FunctionType(ret, [a.type for a in args])
        return builder.call(ir.InlineAsm(fty, text, constraints, side_effect=side_effect), args)

    def _tuple(context, builder, sig, res, n):
        return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, j) for j in range(n)])

    def _ints(*tys):
        return all(isinstance(t, types.Integer) for t in tys)

    # -- mma.sync m16n8k16: A 4 x b32 (2 halves each), B 2 x b32, C/D 4 x f32 --

    def _mma(dtype):
        text = (f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32 "
                "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")

        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            if not (_ints(a0, a1, a2, a3, b0, b1)
                    and all(isinstance(t, types.Float) for t in (c0, c1, c2, c3))):
                return None
            sig = types.UniTuple(types.float32, 4)(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

            def codegen(context, builder, sig, args):
                regs = [as_i32(builder, v) for v in args[:6]]
                acc = [_f32(context, builder, v, t) for v, t in zip(args[6:], sig.args[6:])]
                res = inline_asm(builder, ir.LiteralStructType([_F32] * 4), regs + acc, text,
                           "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
                return _tuple(context, builder, sig, res, 4)
            return sig, codegen
        mma.__doc__ = text
        return mma

    # D = A·B + C; A 16x16 row-major in a0..a3, B 16x8 col-major in b0, b1, C/D 16x8 f32.
    mma_f16 = _mma("f16")    # mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
    mma_bf16 = _mma("bf16")  # mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32

    # -- int8 mma.sync: A m16 x k row-major (4 int8 a b32), B k x n8 col-major, C/D 16x8 s32 --

    def _mma_s8_text(k):
        na, nb = k // 8, k // 16  # A and B registers
        return (f"mma.sync.aligned.m16n8k{k}.row.col.s32.s8.s8.s32 "
                + "{$0, $1, $2, $3}, {" + ", ".join(f"${4 + j}" for j in range(na)) + "}, {"
                + ", ".join(f"${4 + na + j}" for j in range(nb)) + "}, {"
                + ", ".join(f"${4 + na + nb + j}" for j in range(4)) + "};")

    def _mma_s8_codegen(text, n_in):
        def codegen(context, builder, sig, args):
            res = inline_asm(builder, ir.LiteralStructType([_I32] * 4), [as_i32(builder, v) for v in args],
                             text, ",".join(["=r"] * 4 + ["r"] * n_in))
            return _tuple(context, builder, sig, res, 4)
        return codegen

    _MMA_S8_K32 = _mma_s8_text(32)
    _MMA_S8_K16 = _mma_s8_text(16)

    @intrinsic
    def mma_s8_k32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A·B + C in int32, A 16x32 s8 in a0..a3, B 32x8 s8 in b0, b1:
        mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32."""
        args = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        if not _ints(*args):
            return None
        return types.UniTuple(types.int32, 4)(*args), _mma_s8_codegen(_MMA_S8_K32, 10)

    @intrinsic
    def mma_s8_k16(typingctx, a0, a1, b0, c0, c1, c2, c3):
        """D = A·B + C in int32, A 16x16 s8 in a0, a1, B 16x8 s8 in b0:
        mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32."""
        args = (a0, a1, b0, c0, c1, c2, c3)
        if not _ints(*args):
            return None
        return types.UniTuple(types.int32, 4)(*args), _mma_s8_codegen(_MMA_S8_K16, 7)

    # -- ldmatrix: n 8x8 b16 matrices from shared memory, lanes 8i..8i+7 give matrix i's row addresses --

    def _ldmatrix(n, trans):
        text = (f"ldmatrix.sync.aligned.m8n8.x{n}{'.trans' if trans else ''}.shared.b16 "
                + "{" + ", ".join(f"${j}" for j in range(n)) + "}" + f", [${n}];")

        @intrinsic
        def ldmatrix(typingctx, addr):
            if not isinstance(addr, types.Integer):
                return None
            sig = (types.uint32 if n == 1 else types.UniTuple(types.uint32, n))(addr)

            def codegen(context, builder, sig, args):
                ret = _I32 if n == 1 else ir.LiteralStructType([_I32] * n)
                res = inline_asm(builder, ret, [as_i32(builder, args[0])], text,
                           ",".join(["=r"] * n) + ",r,~{memory}", side_effect=True)
                return res if n == 1 else _tuple(context, builder, sig, res, n)
            return sig, codegen
        ldmatrix.__doc__ = text
        return ldmatrix

    ldmatrix_x1 = _ldmatrix(1, False)        # ldmatrix.sync.aligned.m8n8.x1.shared.b16 {r0}, [addr]
    ldmatrix_x2 = _ldmatrix(2, False)        # ... .x2 {r0, r1}
    ldmatrix_x4 = _ldmatrix(4, False)        # ... .x4 {r0, r1, r2, r3}
    ldmatrix_x1_trans = _ldmatrix(1, True)   # ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16
    ldmatrix_x2_trans = _ldmatrix(2, True)
    ldmatrix_x4_trans = _ldmatrix(4, True)

    # -- cp.async: 16 bytes global -> shared, bypassing L1 and registers --

    @intrinsic
    def cp_async_16(typingctx, saddr, a, i):
        """cp.async.cg.shared.global [saddr], [&a[i]], 16;"""
        if not (isinstance(saddr, types.Integer) and isinstance(a, types.Array) and isinstance(i, types.Integer)):
            return None
        sig = types.void(saddr, a, i)

        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[1], args[1], args[2], sig.args[2])
            inline_asm(builder, ir.VoidType(), [as_i32(builder, args[0]), ptr],
                 "cp.async.cg.shared.global [$0], [$1], 16;", "r,l,~{memory}", side_effect=True)
            return context.get_dummy_value()
        return sig, codegen

    @intrinsic
    def cp_async_16_zfill(typingctx, saddr, a, i, src_bytes):
        """cp.async.cg.shared.global [saddr], [&a[i]], 16, src_bytes; bytes past src_bytes (0..16) are zero."""
        if not (_ints(saddr, i, src_bytes) and isinstance(a, types.Array)):
            return None
        sig = types.void(saddr, a, i, src_bytes)

        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[1], args[1], args[2], sig.args[2])
            inline_asm(builder, ir.VoidType(), [as_i32(builder, args[0]), ptr, as_i32(builder, args[3])],
                 "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}", side_effect=True)
            return context.get_dummy_value()
        return sig, codegen

    def no_operand(text):
        @intrinsic
        def op(typingctx):
            def codegen(context, builder, sig, args):
                inline_asm(builder, ir.VoidType(), [], text, "~{memory}", side_effect=True)
                return context.get_dummy_value()
            return types.void(), codegen
        op.__doc__ = text
        return op

    cp_async_commit = no_operand("cp.async.commit_group;")
    cp_async_wait_all = no_operand("cp.async.wait_all;")
    # Programmatic dependent launch (sm_90): a kernel launched with programmatic stream
    # serialization may start while its predecessor runs; grid_dep_wait blocks until the
    # predecessor grids completed and their memory is visible, grid_dep_launch lets the next
    # kernel start once every block of this one has called it (impnb.launch, programmatic).
    grid_dep_wait = no_operand("griddepcontrol.wait;")
    grid_dep_launch = no_operand("griddepcontrol.launch_dependents;")

    def _redux(op):
        @intrinsic
        def redux(typingctx, v):
            if not isinstance(v, types.Integer):
                return None

            def codegen(context, builder, sig, args):
                return inline_asm(builder, _I32, [as_i32(builder, args[0])],
                            f"redux.sync.{op}.u32 $0, $1, 0xffffffff;", "=r,r")
            return types.uint32(v), codegen
        redux.__doc__ = f"redux.sync.{op}.u32 over the warp's 32 lanes (sm_80+); every lane gets it. Whole warps only."
        return redux

    redux_max_u32 = _redux("max")
    redux_min_u32 = _redux("min")

    # Thread-block clusters (sm_90; launched with impnb.launch's cluster=): every thread of every
    # block of the cluster arrives, then waits; shared-memory writes before it (release) are seen
    # by the cluster's blocks after it (acquire), through ld_cluster_f32.
    cluster_sync = no_operand("barrier.cluster.arrive.release; barrier.cluster.wait.acquire;")

    @intrinsic
    def ld_cluster_f32(typingctx, saddr, rank):
        """mapa.shared::cluster.u32 r, saddr, rank; ld.shared::cluster.f32 d, [r]: the float at
        shared-window address saddr (smem_addr) of the cluster's block `rank`."""
        if not _ints(saddr, rank):
            return None

        def codegen(context, builder, sig, args):
            return inline_asm(builder, _F32, [as_i32(builder, args[0]), as_i32(builder, args[1])],
                        "{ .reg .u32 r; mapa.shared::cluster.u32 r, $1, $2; ld.shared::cluster.f32 $0, [r]; }",
                        "=f,r,r,~{memory}", side_effect=True)
        return types.float32(saddr, rank), codegen

    @intrinsic
    def cp_async_wait_group(typingctx, n):
        """cp.async.wait_group n; n a compile-time integer (a literal or a global constant)."""
        if not isinstance(n, types.IntegerLiteral):
            return None
        text = f"cp.async.wait_group {n.literal_value};"

        def codegen(context, builder, sig, args):
            inline_asm(builder, ir.VoidType(), [], text, "~{memory}", side_effect=True)
            return context.get_dummy_value()
        return types.void(n), codegen

    @intrinsic
    def prefetch_l2(typingctx, a, byte0, nbytes):
        """cp.async.bulk.prefetch.L2.global [&a + byte0], nbytes (sm_90): nbytes of a from byte
        byte0 on brought into L2 in the background, nothing waiting for them; a's data 16-byte
        aligned and both multiples of 16. A hint: the lines may be evicted before they are read."""
        if not (isinstance(a, types.Array) and _ints(byte0, nbytes)):
            return None
        sig = types.void(a, byte0, nbytes)

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            base = builder.bitcast(data, ir.PointerType(ir.IntType(8)))
            ptr = builder.gep(base, [context.cast(builder, args[1], sig.args[1], types.intp)])
            inline_asm(builder, ir.VoidType(), [ptr, as_i32(builder, args[2])],
                       "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r,~{memory}", side_effect=True)
            return context.get_dummy_value()
        return sig, codegen

    # -- 16-byte global and shared moves --

    @intrinsic
    def ld_global_v4_u32(typingctx, a, i):
        """ld.global.v4.u32 {r0, r1, r2, r3}, [&a[i]]; a a 32-bit array, i a multiple of 4."""
        if not (isinstance(a, types.Array) and a.dtype.bitwidth == 32 and isinstance(i, types.Integer)):
            return None
        sig = types.UniTuple(types.uint32, 4)(a, i)

        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            res = inline_asm(builder, ir.LiteralStructType([_I32] * 4), [ptr],
                       "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l,~{memory}", side_effect=True)
            return _tuple(context, builder, sig, res, 4)
        return sig, codegen

    @intrinsic
    def ld_global_cg_f32(typingctx, a, i):
        """ld.global.cg.f32 r, [&a[i]]: ld_global_cg_v4_f32's one-float form."""
        if not (isinstance(a, types.Array) and a.dtype == types.float32 and isinstance(i, types.Integer)):
            return None
        sig = types.float32(a, i)

        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            return inline_asm(builder, _F32, [ptr], "ld.global.cg.f32 $0, [$1];", "=f,l,~{memory}",
                        side_effect=True)
        return sig, codegen

    @intrinsic
    def ld_global_cg_v4_f32(typingctx, a, i):
        """ld.global.cg.v4.f32 {r0, r1, r2, r3}, [&a[i]]; cached in L2 only, so it sees other
        blocks' writes made visible by a threadfence (L1 is not coherent across SMs); a a float32
        array, i a multiple of 4."""
        if not (isinstance(a, types.Array) and a.dtype == types.float32 and isinstance(i, types.Integer)):
            return None
        sig = types.UniTuple(types.float32, 4)(a, i)

        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            res = inline_asm(builder, ir.LiteralStructType([_F32] * 4), [ptr],
                       "ld.global.cg.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l,~{memory}",
                       side_effect=True)
            return _tuple(context, builder, sig, res, 4)
        return sig, codegen

    @intrinsic
    def st_global_v4_u32(typingctx, a, i, v0, v1, v2, v3):
        """st.global.v4.u32 [&a[i]], {v0, v1, v2, v3}; a a 32-bit array, i a multiple of 4."""
        if not (isinstance(a, types.Array) and a.dtype.bitwidth == 32 and _ints(i, v0, v1, v2, v3)):
            return None
        sig = types.void(a, i, v0, v1, v2, v3)

        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            inline_asm(builder, ir.VoidType(), [ptr] + [as_i32(builder, v) for v in args[2:]],
                 "st.global.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r,~{memory}", side_effect=True)
            return context.get_dummy_value()
        return sig, codegen

    @intrinsic
    def st_global_v2_f32(typingctx, a, i, v0, v1):
        """st.global.v2.f32 [&a[i]], {v0, v1}; a a float32 array, i even."""
        if not (isinstance(a, types.Array) and a.dtype == types.float32 and isinstance(i, types.Integer)
                and isinstance(v0, types.Float) and isinstance(v1, types.Float)):
            return None
        sig = types.void(a, i, v0, v1)

        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            vals = [_f32(context, builder, v, t) for v, t in zip(args[2:], sig.args[2:])]
            inline_asm(builder, ir.VoidType(), [ptr] + vals,
                 "st.global.v2.f32 [$0], {$1, $2};", "l,f,f,~{memory}", side_effect=True)
            return context.get_dummy_value()
        return sig, codegen

    @intrinsic
    def ld_shared_v4_u32(typingctx, saddr):
        """ld.shared.v4.u32 {r0, r1, r2, r3}, [saddr]; saddr 16-byte aligned."""
        if not isinstance(saddr, types.Integer):
            return None
        sig = types.UniTuple(types.uint32, 4)(saddr)

        def codegen(context, builder, sig, args):
            res = inline_asm(builder, ir.LiteralStructType([_I32] * 4), [as_i32(builder, args[0])],
                       "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r,~{memory}", side_effect=True)
            return _tuple(context, builder, sig, res, 4)
        return sig, codegen

    def _ld_shared_vec(elem, n, ty):
        # an ordinary LLVM load of n elements from the shared window (not inline asm): the compiler
        # schedules it freely between barriers, as it does an array read
        @intrinsic
        def ld(typingctx, saddr):
            if not isinstance(saddr, types.Integer):
                return None
            sig = types.UniTuple(ty, n)(saddr)

            def codegen(context, builder, sig, args):
                vec = ir.VectorType(elem, n)
                ptr = builder.inttoptr(as_i32(builder, args[0]), ir.PointerType(vec, 3))
                res = builder.load(ptr, align=4 * n)
                return context.make_tuple(builder, sig.return_type,
                                          [builder.extract_element(res, ir.Constant(_I32, j)) for j in range(n)])
            return sig, codegen
        return ld

    @intrinsic
    def ld_shared_u32(typingctx, saddr):
        """ld.shared.u32 at a shared-window address (an LLVM load, as ld_shared_v2_u32)."""
        if not isinstance(saddr, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            return builder.load(builder.inttoptr(as_i32(builder, args[0]), ir.PointerType(_I32, 3)), align=4)
        return types.uint32(saddr), codegen

    ld_shared_v2_u32 = _ld_shared_vec(_I32, 2, types.uint32)
    ld_shared_v2_u32.__doc__ = "ld.shared.v2.u32 at a shared-window address, 8-byte aligned."
    ld_shared_v4_f32 = _ld_shared_vec(_F32, 4, types.float32)
    ld_shared_v4_f32.__doc__ = "ld.shared.v4.f32 at a shared-window address, 16-byte aligned."

    @intrinsic
    def st_shared_v4_u32(typingctx, saddr, v0, v1, v2, v3):
        """st.shared.v4.u32 [saddr], {v0, v1, v2, v3}; saddr 16-byte aligned."""
        if not _ints(saddr, v0, v1, v2, v3):
            return None
        sig = types.void(saddr, v0, v1, v2, v3)

        def codegen(context, builder, sig, args):
            inline_asm(builder, ir.VoidType(), [as_i32(builder, v) for v in args],
                 "st.shared.v4.u32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r,~{memory}", side_effect=True)
            return context.get_dummy_value()
        return sig, codegen

    # -- f32 pairs -> packed 16-bit pairs (round to nearest even); lo in bits 0..15 --

    def _pack(dtype):
        # cvt.rn.{f16x2,bf16x2}.f32 d, a, b puts a in the upper half and b in the lower one.
        text = f"cvt.rn.{dtype}x2.f32 $0, $2, $1;"

        @intrinsic
        def pack(typingctx, lo, hi):
            if not (isinstance(lo, types.Float) and isinstance(hi, types.Float)):
                return None

            def codegen(context, builder, sig, args):
                vals = [_f32(context, builder, v, t) for v, t in zip(args, sig.args)]
                return inline_asm(builder, _I32, vals, text, "=r,f,f")
            return types.uint32(lo, hi), codegen
        pack.__doc__ = f"cvt.rn.{dtype}x2.f32 d, hi, lo: d = hi << 16 | lo as {dtype}."
        return pack

    pack_f16x2 = _pack("f16")    # cvt.rn.f16x2.f32 d, hi, lo
    pack_bf16x2 = _pack("bf16")  # cvt.rn.bf16x2.f32 d, hi, lo

    # -- special functions --

    @intrinsic
    def ex2_approx_ftz(typingctx, x):
        """ex2.approx.ftz.f32 d, x: 2^x in one MUFU.EX2 (max rel. error 2^-22; subnormals flush to 0)."""
        if not isinstance(x, types.Float):
            return None

        def codegen(context, builder, sig, args):
            return inline_asm(builder, _F32, [_f32(context, builder, args[0], sig.args[0])],
                        "ex2.approx.ftz.f32 $0, $1;", "=f,f")
        return types.float32(x), codegen

    # -- shared-window addresses --

    @intrinsic
    def smem_addr(typingctx, a, i):
        """32-bit shared-window address of a[i] (a a cuda.shared.array): an LLVM addrspacecast to
        addrspace(3), which NVVM folds into the array symbol's address (`mov.u32 r, smem_sym`)."""
        if not (isinstance(a, types.Array) and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            shared = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 3))
            return builder.ptrtoint(shared, _I32)
        return types.uint32(a, i), codegen

    @intrinsic
    def cvta_to_shared(typingctx, a, i):
        """cvta.to.shared.u64 on the generic address of a[i], truncated to the 32-bit window address."""
        if not (isinstance(a, types.Array) and isinstance(i, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            gen = builder.ptrtoint(ptr, ir.IntType(64))
            res = inline_asm(builder, ir.IntType(64), [gen], "cvta.to.shared.u64 $0, $1;", "=l,l")
            return builder.trunc(res, _I32)
        return types.uint32(a, i), codegen
