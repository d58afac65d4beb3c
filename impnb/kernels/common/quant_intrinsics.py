"""The bit-level intrinsics of impnb's quant decoders (quant_blocks32.py, quant_blocks_k.py, gemv.py):
16-byte loads and stores, bit casts, a 32-bit shift, byte permute, fp16 conversion, exact fma and a
warp sum, each with a plain-Python twin that numba's CUDA simulator runs; and the exact byte ->
float conversions built on them. Integers become floats through the 2^23 trick: the float whose
bits are 0x4B000000 | q is 2^23 + q exactly, so q - offset is one float add and d*q is one exact fma.
"""

import numpy as np
from numba import config, cuda, float32

SIM = bool(config.ENABLE_CUDASIM)

MAGIC = np.uint32(0x4B000000)  # float bits of 2^23
NEG_TWO23 = np.float32(-8388608.0)
MAGIC_S = np.int32(0x4B400000)  # float bits of 1.5 x 2^23
TWO23_S = np.float32(12582912.0)
LO4 = np.uint32(0x0F0F0F0F)
HI4 = np.uint32(0xF0F0F0F0)
LO1 = np.uint32(0x01010101)
LO2 = np.uint32(0x03030303)
BYTE = np.uint32(0xFF)
SIGN8 = np.uint32(0x80808080)
HALF = np.uint32(0xFFFF)
SPREAD4 = np.uint32(0x02040810)  # bit b of a nibble -> bit 8b+4 (with BIT4)
BIT4 = np.uint32(0x10101010)
ONE = np.float32(1.0)
FULL_MASK = 0xFFFFFFFF

if SIM:
    def _flat(a):
        return a if len(a.shape) == 1 else a.reshape(a.size)

    def ldg_u32x4(a, i):
        """Four 32-bit words a[i:i+4] (i a multiple of 4), streamed past L1."""
        f = _flat(a)
        return (f[i], f[i + 1], f[i + 2], f[i + 3])

    def ldg_f32x4(a, i):
        """Four floats a[i:i+4] (i a multiple of 4) through the read-only L1 path."""
        f = _flat(a)
        return (f[i], f[i + 1], f[i + 2], f[i + 3])

    ldg_u32x4_l1 = ldg_f32x4  # four 32-bit words through the read-only L1 path

    def _words(a, i, n):
        from impnb.kernels.common.ptx_sim import global_bytes

        return tuple(np.uint32(w) for w in global_bytes(a, i, 4 * n).view(np.uint32))

    def ldg_u32x2(a, i):
        """Two 32-bit words from element i of any array (8-byte aligned), streamed past L1."""
        return _words(a, i, 2)

    ldg_u32x2_l1 = ldg_u32x2  # the same through the read-only L1 path

    def ldg_u32_l1(a, i):
        """One 32-bit word from element i of any array (4-byte aligned) through the L1 path."""
        return _words(a, i, 1)[0]

    def rint_s32(v):
        """float32 v rounded to the nearest int32, ties to even (cvt.rni)."""
        return np.int32(np.rint(np.float32(v)))

    def _bytes(u, signed):
        b = [(int(u) >> (8 * i)) & 0xFF for i in range(4)]
        return [v - 256 if signed and v > 127 else v for v in b]

    def dp4a_us(a, b, c):
        """c + the dot of the 4 unsigned bytes of a with the 4 signed bytes of b (int32)."""
        return np.int32(int(c) + sum(p * q for p, q in zip(_bytes(a, False), _bytes(b, True))))

    def dp4a_ss(a, b, c):
        """c + the dot of the 4 signed bytes of a with the 4 signed bytes of b (int32)."""
        return np.int32(int(c) + sum(p * q for p, q in zip(_bytes(a, True), _bytes(b, True))))

    def stg_x4(a, i, v0, v1, v2, v3):
        """a[i:i+4] = v0..v3 for a 32-bit array (i a multiple of 4)."""
        f = _flat(a)
        f[i], f[i + 1], f[i + 2], f[i + 3] = v0, v1, v2, v3

    def as_f32(u):
        return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)

    def f32_bits(v):
        return np.float32(v).view(np.uint32)

    def shr32(u, s):
        return np.uint32((int(u) & 0xFFFFFFFF) >> int(s))

    def sar32(v, s):
        return np.int32(int(v) >> int(s))

    def prmt(a, b, sel):
        """Byte permute: byte i of the result is byte sel[4i:4i+3] of the 8 bytes b:a, or where
        selector bit 4i+3 is set that byte's sign bit replicated (0x00 or 0xFF)."""
        x = ((int(b) & 0xFFFFFFFF) << 32) | (int(a) & 0xFFFFFFFF)
        r = 0
        for i in range(4):
            nib = (int(sel) >> (4 * i)) & 15
            byte = (x >> (8 * (nib & 7))) & 0xFF
            r |= ((0xFF if byte & 0x80 else 0) if nib & 8 else byte) << (8 * i)
        return np.uint32(r)

    def fma_f16x2(a, b, c):
        """Each 16-bit half of a, b, c as IEEE halves: a * b + c rounded once (float64 holds the
        exact product and sum of halves), packed as they came."""
        def half(u, i):
            return np.float64(np.uint16((int(u) >> (16 * i)) & 0xFFFF).view(np.float16))
        with np.errstate(over="ignore"):
            r = [np.float16(half(a, i) * half(b, i) + half(c, i)).view(np.uint16) for i in (0, 1)]
        return np.uint32(int(r[0]) | (int(r[1]) << 16))

    def f16_to_f32(u):
        return np.float32(np.uint16(int(u) & 0xFFFF).view(np.float16))

    def f32_to_f16_bits(v):
        return np.uint32(np.float32(v).astype(np.float16).view(np.uint16))

    def fma_f32(a, b, c):
        # Exact here: every fma in these kernels has an exact float64 product and sum.
        return np.float32(np.float64(a) * np.float64(b) + np.float64(c))

    @cuda.jit(device=True)
    def warp_sum(v, scratch):
        """Sum of v over the warp, returned to every lane (simulator: through shared scratch)."""
        tid = cuda.threadIdx.x
        scratch[tid] = v
        cuda.syncthreads()
        base = tid - (tid & 31)
        s = np.float32(0.0)
        for i in range(32):
            s += scratch[base + i]
        cuda.syncthreads()
        return s
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def element_ptr(context, builder, aty, ary, idx, ity):
        data = context.make_array(aty)(context, builder, ary).data
        idx = context.cast(builder, idx, ity, types.intp)
        return builder.gep(data, [idx])

    def _ld4(ptx, reg):
        @intrinsic
        def ld4(typingctx, a, i):
            if not (isinstance(a, types.Array) and a.dtype.bitwidth == 32):
                return None
            sig = types.UniTuple(a.dtype, 4)(a, i)

            def codegen(context, builder, sig, args):
                elt = context.get_value_type(sig.args[0].dtype)
                ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                fty = ir.FunctionType(ir.LiteralStructType([elt] * 4), [ptr.type])
                asm = ir.InlineAsm(fty, ptx + " {$0, $1, $2, $3}, [$4];",
                                   f"={reg},={reg},={reg},={reg},l")
                res = builder.call(asm, [ptr])
                return context.make_tuple(builder, sig.return_type,
                                          [builder.extract_value(res, j) for j in range(4)])
            return sig, codegen
        return ld4

    # Weights are read once: keep them out of L1 so x stays there.
    ldg_u32x4 = _ld4("ld.global.nc.L1::no_allocate.v4.u32", "r")
    ldg_f32x4 = _ld4("ld.global.nc.v4.f32", "f")
    ldg_u32x4_l1 = _ld4("ld.global.nc.v4.u32", "r")  # x words: kept in L1, shared by the rows

    def _ld_words(ptx, n, doc):
        # n 32-bit words from element i of an array of any type (the address aligned to 4n bytes)
        @intrinsic
        def ld(typingctx, a, i):
            if not (isinstance(a, types.Array) and isinstance(i, types.Integer)):
                return None
            sig = (types.uint32 if n == 1 else types.UniTuple(types.uint32, n))(a, i)

            def codegen(context, builder, sig, args):
                ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                i32 = ir.IntType(32)
                ret = i32 if n == 1 else ir.LiteralStructType([i32] * n)
                outs = ", ".join(f"${j}" for j in range(n))
                asm = ir.InlineAsm(ir.FunctionType(ret, [ptr.type]),
                                   f"{ptx} {{{outs}}}, [${n}];" if n > 1 else f"{ptx} $0, [$1];",
                                   ",".join(["=r"] * n) + ",l")
                res = builder.call(asm, [ptr])
                return res if n == 1 else context.make_tuple(builder, sig.return_type,
                                                             [builder.extract_value(res, j) for j in range(n)])
            return sig, codegen
        ld.__doc__ = doc
        return ld

    ldg_u32x2 = _ld_words("ld.global.nc.L1::no_allocate.v2.u32", 2,
                          "Two 32-bit words from element i of any array (8-byte aligned), streamed past L1.")
    ldg_u32x2_l1 = _ld_words("ld.global.nc.v2.u32", 2, "The same through the read-only L1 path.")
    ldg_u32_l1 = _ld_words("ld.global.nc.u32", 1,
                           "One 32-bit word from element i of any array (4-byte aligned) through the L1 path.")

    @intrinsic
    def rint_s32(typingctx, v):
        """float32 v rounded to the nearest int32, ties to even (cvt.rni)."""
        if not isinstance(v, types.Float):
            return None

        def codegen(context, builder, sig, args):
            f = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [ir.FloatType()]), "cvt.rni.s32.f32 $0, $1;", "=r,f")
            return builder.call(asm, [f])
        return types.int32(v), codegen

    def asm3(text):
        """The codegen of a PTX instruction text of three 32-bit integer operands into one
        ($0 from $1, $2, $3)."""
        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32] * 3), text, "=r,r,r,r")
            return builder.call(asm, [as_i32(builder, v) for v in args])
        return codegen

    def _dp4a(text, doc):
        @intrinsic
        def dp4a(typingctx, a, b, c):
            if not all(isinstance(v, types.Integer) for v in (a, b, c)):
                return None
            return types.int32(a, b, c), asm3(text)
        dp4a.__doc__ = doc
        return dp4a

    dp4a_us = _dp4a("dp4a.u32.s32 $0, $1, $2, $3;",
                    "c + the dot of the 4 unsigned bytes of a with the 4 signed bytes of b (int32).")
    dp4a_ss = _dp4a("dp4a.s32.s32 $0, $1, $2, $3;",
                    "c + the dot of the 4 signed bytes of a with the 4 signed bytes of b (int32).")

    @intrinsic
    def stg_x4(typingctx, a, i, v0, v1, v2, v3):
        if not (isinstance(a, types.Array) and a.dtype.bitwidth == 32):
            return None
        sig = types.void(a, i, a.dtype, a.dtype, a.dtype, a.dtype)

        def codegen(context, builder, sig, args):
            elt = context.get_value_type(sig.args[0].dtype)
            reg = "f" if isinstance(sig.args[0].dtype, types.Float) else "r"
            ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            fty = ir.FunctionType(ir.VoidType(), [ptr.type] + [elt] * 4)
            asm = ir.InlineAsm(fty, "st.global.v4.b32 [$0], {$1, $2, $3, $4};",
                               f"l,{reg},{reg},{reg},{reg},~{{memory}}", side_effect=True)
            builder.call(asm, [ptr] + list(args[2:]))
            return context.get_dummy_value()
        return sig, codegen

    def as_i32(builder, v):
        return builder.trunc(v, ir.IntType(32)) if v.type.width > 32 else (
            builder.zext(v, ir.IntType(32)) if v.type.width < 32 else v)

    @intrinsic
    def as_f32(typingctx, u):
        """The float32 whose bits are the low 32 bits of integer u."""
        if not isinstance(u, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(as_i32(builder, args[0]), ir.FloatType())
        return types.float32(u), codegen

    @intrinsic
    def f32_bits(typingctx, v):
        """The bits of float32 v as a uint32."""
        if not isinstance(v, types.Float):
            return None

        def codegen(context, builder, sig, args):
            f = context.cast(builder, args[0], sig.args[0], types.float32)
            return builder.bitcast(f, ir.IntType(32))
        return types.uint32(v), codegen

    @intrinsic
    def shr32(typingctx, u, s):
        """(u mod 2^32) >> s as a 32-bit shift (0 <= s < 32); numba would widen to 64 bits."""
        if not (isinstance(u, types.Integer) and isinstance(s, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            return builder.lshr(as_i32(builder, args[0]), as_i32(builder, args[1]))
        return types.uint32(u, s), codegen

    @intrinsic
    def sar32(typingctx, v, s):
        """v >> s of a 32-bit signed v as a 32-bit arithmetic shift (0 <= s < 32)."""
        if not (isinstance(v, types.Integer) and isinstance(s, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            return builder.ashr(as_i32(builder, args[0]), as_i32(builder, args[1]))
        return types.int32(v, s), codegen

    @intrinsic
    def prmt(typingctx, a, b, sel):
        """prmt.b32: byte i of the result is byte sel[4i:4i+3] of the 8 bytes b:a (sel bit 4i+3 set:
        that byte's sign replicated; PTX ISA, prmt's default mode)."""
        if not all(isinstance(v, types.Integer) for v in (a, b, sel)):
            return None
        return types.uint32(a, b, sel), asm3("prmt.b32 $0, $1, $2, $3;")

    @intrinsic
    def fma_f16x2(typingctx, a, b, c):
        """fma.rn.f16x2: each 16-bit half of a * b + c as IEEE halves, rounded once (PTX ISA)."""
        if not all(isinstance(v, types.Integer) for v in (a, b, c)):
            return None
        return types.uint32(a, b, c), asm3("fma.rn.f16x2 $0, $1, $2, $3;")

    @intrinsic
    def f16_to_f32(typingctx, u):
        """float32 value of the IEEE half in the low 16 bits of integer u."""
        if not isinstance(u, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            h = builder.bitcast(builder.trunc(as_i32(builder, args[0]), ir.IntType(16)), ir.HalfType())
            return builder.fpext(h, ir.FloatType())
        return types.float32(u), codegen

    @intrinsic
    def f32_to_f16_bits(typingctx, v):
        """Bits of v rounded to IEEE half (round to nearest even), as uint32."""
        if not isinstance(v, types.Float):
            return None

        def codegen(context, builder, sig, args):
            f = context.cast(builder, args[0], sig.args[0], types.float32)
            h = builder.bitcast(builder.fptrunc(f, ir.HalfType()), ir.IntType(16))
            return builder.zext(h, ir.IntType(32))
        return types.uint32(v), codegen

    @cuda.jit(device=True, inline=True)
    def fma_f32(a, b, c):
        return cuda.fma(float32(a), float32(b), float32(c))

    @cuda.jit(device=True, inline=True)
    def warp_sum(v, scratch):
        """Sum of v over the warp, returned to every lane (xor butterfly; scratch unused)."""
        v += cuda.shfl_xor_sync(FULL_MASK, v, 16)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 8)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
        return v


@cuda.jit(device=True, inline=True)
def small_int_f32(v):
    """float32(v) of an int32 |v| < 2^22, exactly: the float whose bits are 0x4B400000 + v is
    1.5 x 2^23 + v. An integer add and a float add, where I2F runs at a quarter of their rate."""
    return as_f32(MAGIC_S + v) - TWO23_S


# -- byte helpers: 4 bytes of a word -> w[o:o+4] as 2^23 + byte - off (exact) --

@cuda.jit(device=True, inline=True)
def bytes4_minus(word, off, w, o):
    w[o] = as_f32((word & BYTE) | MAGIC) - off
    w[o + 1] = as_f32(((word >> 8) & BYTE) | MAGIC) - off
    w[o + 2] = as_f32(((word >> 16) & BYTE) | MAGIC) - off
    w[o + 3] = as_f32((word >> 24) | MAGIC) - off


@cuda.jit(device=True, inline=True)
def bytes4_affine(word, d, nd23, m, w, o):
    """w[o+b] = round(d * byte_b) + m, bit-equal to numpy's d * q + m in float32."""
    w[o] = fma_f32(d, as_f32((word & BYTE) | MAGIC), nd23) + m
    w[o + 1] = fma_f32(d, as_f32(((word >> 8) & BYTE) | MAGIC), nd23) + m
    w[o + 2] = fma_f32(d, as_f32(((word >> 16) & BYTE) | MAGIC), nd23) + m
    w[o + 3] = fma_f32(d, as_f32((word >> 24) | MAGIC), nd23) + m


@cuda.jit(device=True, inline=True)
def halves2(word, w, o):
    w[o] = f16_to_f32(word & HALF)
    w[o + 1] = f16_to_f32(word >> 16)
