"""One packed row decoded with SIMD vectors, written as LLVM IR (a numba intrinsic).

numba types integer arithmetic as 64-bit, so its loops over a row's codes compile to scalar
shifts and conversions (measured: one `cvtsi2ss` per code). Here a row of M words of 8 codes
(`bits` bytes each) is one <bits*M x i8> load; each code slot j of all words is one vector of M
lanes: shift, mask, convert (or look up a codebook of <= 16 entries with `vpermps`), scale, and
one store. The row comes out slot-major: position j * M + m holds dim 8 m + j.
"""
from __future__ import annotations

import functools

from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I8, I32, I64, F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
PERMUTE = "llvm.x86.avx2.permps"  # out[l] = table[idx[l] & 7], eight float lanes
AVX2 = bool(binding.get_host_cpu_features().get("avx2"))


def _vector(ty, values):
    return ir.Constant(ir.VectorType(ty, len(values)), list(values))


def _pointer(builder, address, ty):
    return builder.inttoptr(address, ty.as_pointer())


def _lanes(builder, address, count: int, per_unit: int, lanes: int):
    """`count` float32 scalars at address, each repeated over `per_unit` lanes."""
    vec = ir.Constant(ir.VectorType(F32, count), ir.Undefined)
    base = _pointer(builder, address, F32)
    for g in range(count):
        value = builder.load(builder.gep(base, [ir.Constant(I32, g)]), align=4)
        vec = builder.insert_element(vec, value, ir.Constant(I32, g))
    return builder.shuffle_vector(vec, ir.Constant(vec.type, ir.Undefined),
                                  _vector(I32, [m // per_unit for m in range(lanes)]))


def _look_up(builder, codes, table_address, entries: int, lanes: int):
    """table[codes] for a vector of codes: eight lanes at a time through vpermps (two tables
    and a select for 16 entries), or lane by lane without AVX2 or for larger tables. The table
    holds a multiple of 8 entries (vpermps reads eight)."""
    table = _pointer(builder, table_address, F32)
    if not AVX2 or entries > 16:
        out = ir.Constant(ir.VectorType(F32, lanes), ir.Undefined)
        for lane in range(lanes):
            code = builder.extract_element(codes, ir.Constant(I32, lane))
            value = builder.load(builder.gep(table, [code]), align=4)
            out = builder.insert_element(out, value, ir.Constant(I32, lane))
        return out
    v8f, v8i = ir.VectorType(F32, 8), ir.VectorType(I32, 8)
    permute = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8f, [v8f, v8i]),
                                             PERMUTE)
    halves = [builder.load(builder.bitcast(builder.gep(table, [ir.Constant(I32, first)]),
                                           v8f.as_pointer()), align=4)
              for first in range(0, entries, 8)]
    pieces = []
    for first in range(0, lanes, 8):
        piece = builder.shuffle_vector(codes, ir.Constant(codes.type, ir.Undefined), _vector(
            I32, [first + lane if first + lane < lanes else 0 for lane in range(8)]))
        out = builder.call(permute, [halves[0], piece])
        if len(halves) > 1:
            upper = builder.icmp_unsigned(">", piece, _vector(I32, [7] * 8))
            out = builder.select(upper, builder.call(permute, [halves[1], piece]), out)
        pieces.append(out)
    width = 8
    while len(pieces) > 1:  # concatenated pairwise, then cut to `lanes`
        if len(pieces) % 2:
            pieces.append(ir.Constant(pieces[0].type, ir.Undefined))
        pieces = [builder.shuffle_vector(pieces[i], pieces[i + 1], _vector(I32, range(2 * width)))
                  for i in range(0, len(pieces), 2)]
        width *= 2
    return builder.shuffle_vector(pieces[0], ir.Constant(pieces[0].type, ir.Undefined),
                                  _vector(I32, range(lanes)))


@functools.cache
def row_decoder(bits: int, dim: int, per_unit: int, has_min: bool, lookup: bool):
    """decode_row(out, packed, scales, mins, table): the row of `dim` codes of `bits` bits at
    address `packed` decoded into the float32 row at `out`, slot-major. `scales` (and `mins`)
    hold the row's float32 scale (and min) per `per_unit` words; a value is code * scale + min,
    or table[code] * scale (lookup)."""
    lanes, mask = dim // 8, (1 << bits) - 1
    groups = -(-lanes // per_unit)

    @intrinsic
    def decode_row(typingctx, out, packed, scales, mins, table):
        sig = types.void(types.uintp, types.uintp, types.uintp, types.uintp, types.uintp)

        def codegen(context, builder, signature, args):
            out_address, packed_address, scale_address, min_address, table_address = args
            row_bytes = ir.VectorType(I8, bits * lanes)
            raw = builder.load(_pointer(builder, packed_address, row_bytes), align=1)
            word = I64 if bits > 4 else I32  # a word is `bits` bytes
            word_type = ir.VectorType(word, lanes)
            words = ir.Constant(word_type, None)
            for k in range(bits):
                byte_k = builder.shuffle_vector(raw, ir.Constant(row_bytes, ir.Undefined),
                                                _vector(I32, [m * bits + k for m in range(lanes)]))
                wide = builder.zext(byte_k, word_type)
                if k:
                    wide = builder.shl(wide, _vector(word, [8 * k] * lanes))
                words = builder.or_(words, wide)
            scale = _lanes(builder, scale_address, groups, per_unit, lanes)
            zmin = _lanes(builder, min_address, groups, per_unit, lanes) if has_min else None
            row = _pointer(builder, out_address, F32)
            for j in range(8):
                codes = builder.and_(builder.lshr(words, _vector(word, [j * bits] * lanes)),
                                     _vector(word, [mask] * lanes))
                if bits > 4:
                    codes = builder.trunc(codes, ir.VectorType(I32, lanes))
                if lookup:
                    value = _look_up(builder, codes, table_address, 1 << bits, lanes)
                else:
                    value = builder.sitofp(codes, ir.VectorType(F32, lanes))
                value = builder.fmul(value, scale)
                if has_min:
                    value = builder.fadd(value, zmin)
                target = builder.gep(row, [ir.Constant(I32, j * lanes)])
                builder.store(value, builder.bitcast(target, value.type.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return decode_row


@intrinsic
def as_pointer(typingctx, address):
    """The int64 `address` as a pointer, for numba.carray: a view of memory the caller holds."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.PointerType(I8))

    return types.voidptr(types.int64), codegen
