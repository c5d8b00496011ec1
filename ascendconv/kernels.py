"""numba fast path of `requantize.py`: the same four functions, bit-identical results.

`requantize_rows`, `quantize_rows`, `resolve_rows_bf16` and `first_nan_code` have the signatures
and results of their numpy counterparts in `requantize.py` (the reference, built on resolve.py and
mx.py), plus an optional keyword `out` to write into a caller's buffer; tests/test_kernels.py
proves the bytes equal on random and adversarial inputs, on every path below. `quantize_rows`
(float values of a plain source) has a kernel of its own, with no tables: values are not codes.

How it is fast (contract section 4, "byte-domain conversion"):

- A source tile has one scale ``s``, so a resolved value is a function of its code alone:
  ``val[c] = R(float32(fp8(c)) * s)`` (R = BF16 round-nearest-even or nothing): one 256-entry
  table per tile replaces the per-element resolve.
- With ``bk % 32 == 0`` each MX group lies in one tile. ``|val|`` is non-decreasing in the code
  magnitude ``c & 0x7F`` (finite E4M3 codes are ordered like their values, and float32 and BF16
  rounding are monotone), so the group maximum is found on bytes (one 32-byte vector max) and
  the shared exponent ``E`` from it, once per (tile, maximum).
- Per (tile, E) a 256-entry code -> output-code table makes quantization a lookup (eight 16-byte
  ``vpshufb`` per group where AVX2 is available, scalar loads elsewhere). For ``mse``, a pair
  table holds each code's squared errors at E_floor and E_floor + 1 (float64, the reference's
  exact arithmetic), so the two sums of a group advance as the two lanes of one vector add, still
  sequentially j = 0..31.
- ``mse`` needs those sums only when the group maximum, scaled for E_floor, exceeds 464 (E4M3) or
  7 (E2M1). Below that, E_floor wins for sure: the E_floor + 1 grid, restricted to the group's
  range, is a subset of the E_floor grid (doubling a representable magnitude up to the maximum
  stays representable), so an element up to the maximum is at least as close to its E_floor
  value; an element saturating at E_floor (above 448, or 6) but at most 464 (or 7) rounds at
  E_floor + 1 to the same value or to one as far away (232 -> 224 and 3.5 -> 4 are ties to even).
  Every squared error at E_floor is then at most the one at E_floor + 1, squaring and float64
  addition are monotone, so ``sse_high < sse_low`` cannot hold and the reference keeps E_floor too.
- Groups that straddle two tiles (``bk % 32 != 0``) take a direct per-element path computing the
  same float32/float64 operations as the reference.

Everything runs in `_requantize_kernel`, a row-order walk over the codes with per-thread scratch
tables (`_scratch`), except groups across two tiles, which `_requantize_direct_kernel` fills. The
entry points have explicit signatures and are compiled on first use, not at import
(`compile_entry_points` lets convert compile what a run needs up front and say so); every jitted
function has ``cache=True`` (the cache lives in ``__pycache__`` next to this file, or numba's
per-user cache directory when that is not writable) and ``nogil=True``, so convert's worker
threads run them in parallel. No fastmath anywhere: the float operations and their order are
the reference's.

First-run compilation is part of the user's wait, so `_requantize_kernel` is built to type
quickly (see `_requantize_kernel_for` and the kernel's docstring).

Inputs the reference rejects (NaN codes, non-finite resolved values, bad shapes or options) are
handed to the reference itself, so the exception raised is the reference's, word for word.
"""

from __future__ import annotations

import math
import threading
import time

import ml_dtypes
import numpy as np

from ascendconv.formats import requantize as _reference
from ascendconv.formats.constants import E2M1, E2M1_GRID, E4M3, GROUP_SIZE, SCALE_RULES
from ascendconv.io.libraries import address_space_too_small

try:  # LLVM (llvmlite's 150 MiB library) and the extension modules numba loads
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic
except (ImportError, OSError) as exc:
    # under `ulimit -v` dlopen fails with words that blame the file (FileSystemError, or a traceback)
    too_small = address_space_too_small(exc, "the compiled kernels")
    if too_small is None:
        raise
    raise too_small from exc

# --- entry points, compiled on first use -----------------------------------------------------


class _EntryPoint:
    """A kernel with an explicit signature, compiled (or loaded from numba's cache) on its first
    call or by `compile_entry_points`, never at import: a run compiles only the kernels it uses."""

    def __init__(self, signature, function):
        self.signature = signature
        self.function = function
        self._dispatcher = None
        self._lock = threading.Lock()

    @property
    def dispatcher(self):
        if self._dispatcher is None:
            with self._lock:  # convert's workers may arrive together
                if self._dispatcher is None:
                    self._dispatcher = njit(self.signature, cache=True, nogil=True)(self.function)
        return self._dispatcher

    def __call__(self, *args):
        return self.dispatcher(*args)


def _entry_point(signature):
    return lambda function: _EntryPoint(signature, function)


COMPILING_NOTICE = "compiling the conversion kernels for this machine (once: later runs load them from numba's cache) ..."


def compile_entry_points(names, notice=None) -> float:
    """Make the named entry points ready (ENTRY_POINTS' keys): load each from numba's cache, or
    compile it there the first time. When something is compiled, `notice(text)` is told so as
    the first compilation starts, then how long it took (loading from the cache is quick and says
    nothing). Returns the seconds spent compiling, else 0."""
    from numba.core import event

    class Listener(event.Listener):
        compiled = False

        def on_start(self, ev):
            if not self.compiled:
                self.compiled = True
                if notice is not None:
                    notice(COMPILING_NOTICE)

        def on_end(self, ev):
            pass

    listener = Listener()
    started = time.perf_counter()
    event.register("numba:compile", listener)
    try:
        for name in names:
            ENTRY_POINTS[name].dispatcher
    finally:
        event.unregister("numba:compile", listener)
    if not listener.compiled:
        return 0.0
    seconds = time.perf_counter() - started
    if notice is not None:
        notice(f"kernels compiled in {seconds:.1f} s ({', '.join(names)}); later runs load them from the cache")
    return seconds


# --- scalar helpers --------------------------------------------------------------------------


@intrinsic
def _f32_bits(typingctx, x):
    """float32 -> its uint32 bit pattern."""
    if isinstance(x, types.Float) and x.bitwidth == 32:

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))

        return types.uint32(types.float32), codegen
    return None


@intrinsic
def _bits_f32(typingctx, x):
    """Low 32 bits of an integer, as a float32 bit pattern."""
    if isinstance(x, types.Integer):

        def codegen(context, builder, signature, args):
            value = args[0]
            if value.type.width > 32:
                value = builder.trunc(value, ir.IntType(32))
            return builder.bitcast(value, ir.FloatType())

        return types.float32(x), codegen
    return None


_FMT_E4M3 = 0
_FMT_E2M1 = 1
_RULE_IDS = {"floor": 0, "rceil": 1, "mse": 2}
_FLOOR, _RCEIL, _MSE = 0, 1, 2
_ZERO_KEY = 255  # table key of floor's "E == 0: signed zeros" (255 is never a shared exponent)

# Decode tables (float32), as the reference decodes: ml_dtypes for E4M3, the grid for E2M1.
_E4M3_DECODE = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
_E2M1_DECODE = np.array(E2M1_GRID + tuple(-v for v in E2M1_GRID), dtype=np.float32)


@njit(cache=True, nogil=True, inline="always")
def _pow2f(e):
    """float32 2**e for integer e in [-149, 127], exact (subnormals included)."""
    if e >= -126:
        return _bits_f32(np.uint32((e + 127) << 23))
    return _bits_f32(np.uint32(1 << (e + 149)))


@njit(cache=True, nogil=True, inline="always")
def _bf16_round(x):
    """float32 -> float32 holding the nearest-even BF16 value (ml_dtypes' cast; NaN stays a quiet
    NaN of the same sign). Branch-free, so that table loops vectorize."""
    bits = _f32_bits(x)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    quiet_nan = (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return _bits_f32(quiet_nan if is_nan else rounded)


@njit(cache=True, nogil=True, inline="always")
def _resolve(code_value, s, bf16):
    v = code_value * s  # float32 * float32: one IEEE rounding, as the reference
    return _bf16_round(v) if bf16 else v


@njit(cache=True, nogil=True, inline="always")
def _encode_e4m3(y):
    """Finite float32 -> E4M3 code: clamp to +-448, round to nearest-even (ml_dtypes' cast).

    Branch-free: both the normal and the subnormal rounding are computed, one is selected.
    """
    bits = _f32_bits(y)
    sign = (bits >> np.uint32(24)) & np.uint32(0x80)
    a = min(bits & np.uint32(0x7FFFFFFF), np.uint32(0x43E00000))  # clamp |y| to 448 (bit order)
    # normal E4M3 (|y| >= 2**-6): round the float32 mantissa to 3 bits, rebias the exponent by -120
    normal = ((a + np.uint32(0x7FFFF) + ((a >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)) - np.uint32(960)
    # subnormal E4M3: multiples of 2**-9; |y| * 512 is exact, and adding then subtracting 2**23
    # in float32 rounds it to an integer, half to even
    q = _bits_f32(a) * np.float32(512.0)
    subnormal = np.uint32((q + np.float32(8388608.0)) - np.float32(8388608.0))
    return np.uint8((subnormal if a < np.uint32(0x3C800000) else normal) | sign)


@njit(cache=True, nogil=True, inline="always")
def _encode_e2m1(y):
    """Finite float32 -> E2M1 code 0..15: clamp to +-6, round to nearest-even on the grid
    [0, .5, 1, 1.5, 2, 3, 4, 6] (ties go to the even index). Branch-free."""
    bits = _f32_bits(y)
    sign = (bits >> np.uint32(28)) & np.uint32(0x8)
    a = _bits_f32(bits & np.uint32(0x7FFFFFFF))
    index = (
        np.uint32(a > np.float32(0.25))
        + np.uint32(a >= np.float32(0.75))
        + np.uint32(a > np.float32(1.25))
        + np.uint32(a >= np.float32(1.75))
        + np.uint32(a > np.float32(2.5))
        + np.uint32(a >= np.float32(3.5))
        + np.uint32(a > np.float32(5.0))
    )
    return np.uint8(index | sign)


@njit(cache=True, nogil=True, inline="always")
def _encode(y, fmt):
    return _encode_e4m3(y) if fmt == _FMT_E4M3 else _encode_e2m1(y)


@njit(cache=True, nogil=True, inline="always")
def _format_constants(fmt):
    """(emax, sign bit of a code, mse's saturation bound, max mantissa, max exponent) of a format:
    the floor rule's emax, the rceil rule's max_value = max mantissa x 2**max exponent (frexp form),
    and the bound above which mse compares two exponents (the module docstring's 464 and 7)."""
    if fmt == _FMT_E4M3:
        return 8, np.uint8(0x80), np.float32(464.0), 0.875, 9
    return 2, np.uint8(0x08), np.float32(7.0), 0.75, 3


@njit(cache=True, nogil=True)
def _floor_exponent(a_bits, emax):
    """max(expfield - emax, 0) of a non-negative float32 given by its bits."""
    e = np.int64(a_bits >> np.uint32(23)) - emax
    return e if e > 0 else 0


@njit(cache=True, nogil=True)
def _rceil_exponent(a, max_mantissa, max_exponent):
    """Smallest E in [0, 254] with a <= max_value * 2**(E - 127) (mx._rceil_exponents)."""
    if a == np.float32(0.0):
        return 0
    m, e = math.frexp(np.float64(a))  # exact: a float32 widened to float64
    out = e - max_exponent + (1 if m > max_mantissa else 0) + 127
    if out < 0:
        return 0
    if out > 254:
        return 254
    return out


@intrinsic
def _group_max_magnitude(typingctx, codes, start):
    """max(c & 0x7F) over codes[start : start + 32] of a 1-D uint8 array, as uint64.

    One unaligned 32-byte vector load and LLVM's generic unsigned-max reduction (vpmaxub on x86,
    umaxv on AArch64); the caller guarantees the bounds.
    """
    if not (isinstance(codes, types.Array) and codes.dtype == types.uint8 and codes.ndim == 1):
        return None
    if not isinstance(start, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        byte_ptr = builder.bitcast(array.data, ir.IntType(8).as_pointer())
        vector_type = ir.VectorType(ir.IntType(8), GROUP_SIZE)
        vector_ptr = builder.bitcast(builder.gep(byte_ptr, [args[1]]), vector_type.as_pointer())
        magnitudes = builder.and_(builder.load(vector_ptr, align=1), ir.Constant(vector_type, [0x7F] * GROUP_SIZE))
        reduce = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(8), [vector_type]), "llvm.vector.reduce.umax.v32i8"
        )
        return builder.zext(builder.call(reduce, [magnitudes]), ir.IntType(64))

    return types.uint64(codes, start), codegen


def _avx2_available() -> bool:
    """Whether numba compiles for a CPU with AVX2 (the host, unless NUMBA_CPU_NAME overrides it)."""
    from numba.core import config

    if config.CPU_NAME or config.CPU_FEATURES:
        return False  # a portable or foreign target: no x86-specific intrinsics
    try:
        import llvmlite.binding as llvm

        return bool(llvm.get_host_cpu_features().get("avx2", False))
    except Exception:  # pragma: no cover - unknown platform
        return False


_AVX2 = _avx2_available()
_I8 = ir.IntType(8)
_V32 = ir.VectorType(_I8, 32)
_V16 = ir.VectorType(_I8, 16)


def _splat(vector_type, value):
    return ir.Constant(vector_type, [value] * vector_type.count)


@intrinsic
def _lookup_group_avx2(typingctx, codes, start, tables, table_at, out, out_at, fp4):
    """out[...] = tables[table_at + codes[start : start + 32]] with AVX2 byte shuffles.

    The 128 magnitude entries of the table are looked up with eight 16-byte ``vpshufb``; the code's
    sign flips the output's sign bit (table[c | 0x80] == table[c] ^ sign bit). E4M3 stores 32
    bytes at out_at; E2M1 (``fp4``) packs pairs of nibbles and stores 16. Only compiled for AVX2
    targets (`_AVX2`); elsewhere it is an empty body that the kernels never reach.
    """
    sig = types.void(codes, start, tables, table_at, out, out_at, fp4)

    def codegen(context, builder, signature, args):
        if not _AVX2:
            return context.get_dummy_value()
        arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 2, 4)]

        def pointer(array, offset, vector_type):
            byte_ptr = builder.gep(builder.bitcast(array.data, _I8.as_pointer()), [offset])
            return builder.bitcast(byte_ptr, vector_type.as_pointer())

        v = builder.load(pointer(arrays[0], args[1], _V32), align=1)
        magnitude = builder.and_(v, _splat(_V32, 0x7F))
        sign = builder.and_(v, _splat(_V32, 0x80))
        pshufb = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V32, [_V32, _V32]), "llvm.x86.avx2.pshuf.b"
        )
        add_saturated = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V32, [_V32, _V32]), "llvm.uadd.sat.v32i8"
        )
        both_lanes = ir.Constant(ir.VectorType(ir.IntType(32), 32), list(range(16)) * 2)
        result = _splat(_V32, 0)
        for i in range(8):
            offset = builder.add(args[3], ir.Constant(args[3].type, 16 * i))
            chunk = builder.load(pointer(arrays[1], offset, _V16), align=1)
            chunk = builder.shuffle_vector(chunk, chunk, both_lanes)
            # bytes of chunk i get index m - 16 i (bit 7 clear), all others bit 7 set: zero
            index = builder.call(add_saturated, [builder.xor(magnitude, _splat(_V32, 16 * i)), _splat(_V32, 0x70)])
            result = builder.or_(result, builder.call(pshufb, [chunk, index]))
        with builder.if_else(args[6]) as (fp4_branch, fp8_branch):
            with fp4_branch:
                nibbles = builder.xor(result, builder.lshr(sign, _splat(_V32, 4)))
                v16 = ir.VectorType(ir.IntType(16), 16)
                pairs = builder.bitcast(nibbles, v16)
                pairs = builder.or_(pairs, builder.lshr(pairs, ir.Constant(v16, [4] * 16)))
                builder.store(builder.trunc(pairs, _V16), pointer(arrays[2], args[5], _V16), align=1)
            with fp8_branch:
                builder.store(builder.xor(result, sign), pointer(arrays[2], args[5], _V32), align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _sse_decisions(typingctx, codes, c0, c1, c2, c3, pairs, p0, p1, p2, p3):
    """For four groups (codes at c0..c3, pair tables at p0..p3): bit q of the result is set when
    group q's sum of squared error at E_floor + 1 is below the one at E_floor.

    Each group's two float64 sums advance together as the lanes of one <2 x double> vector: a
    lane-wise IEEE add is the same operation as the scalar one, and the 32 additions per sum run
    in index order j = 0..31, exactly as mx._sequential_sse (generic LLVM vectors: SSE2, NEON).
    """
    sig = types.int64(codes, c0, c1, c2, c3, pairs, p0, p1, p2, p3)

    def codegen(context, builder, signature, args):
        codes_array = context.make_array(signature.args[0])(context, builder, args[0])
        pairs_array = context.make_array(signature.args[5])(context, builder, args[5])
        code_ptr = builder.bitcast(codes_array.data, _I8.as_pointer())
        double = ir.DoubleType()
        v2 = ir.VectorType(double, 2)
        pair_ptr = builder.bitcast(pairs_array.data, double.as_pointer())
        i64 = ir.IntType(64)
        starts = [args[1], args[2], args[3], args[4]]
        tables = [args[6], args[7], args[8], args[9]]
        sums = [ir.Constant(v2, [0.0, 0.0]) for _ in range(4)]
        for j in range(GROUP_SIZE):
            for q in range(4):
                position = builder.add(starts[q], ir.Constant(i64, j))
                code = builder.zext(builder.load(builder.gep(code_ptr, [position])), i64)
                index = builder.add(tables[q], builder.shl(code, ir.Constant(i64, 1)))
                pair = builder.load(builder.bitcast(builder.gep(pair_ptr, [index]), v2.as_pointer()), align=8)
                sums[q] = builder.fadd(sums[q], pair)
        mask = ir.Constant(i64, 0)
        for q in range(4):
            low = builder.extract_element(sums[q], ir.Constant(ir.IntType(32), 0))
            high = builder.extract_element(sums[q], ir.Constant(ir.IntType(32), 1))
            below = builder.zext(builder.fcmp_ordered("<", high, low), i64)
            mask = builder.or_(mask, builder.shl(below, ir.Constant(i64, q)))
        return mask

    return sig, codegen


# --- tables ----------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _fill_values(val, s, bf16):
    """val[c] = R(fp8(c) * s) for the 256 codes (NaN codes give NaN, never used)."""
    if bf16:
        for c in range(256):
            val[c] = _bf16_round(_E4M3_DECODE[c] * s)
    else:
        for c in range(256):
            val[c] = _E4M3_DECODE[c] * s


@njit(cache=True, nogil=True)
def _fill_codes(tab, val, key, fmt, sbit):
    """tab[c] = output code of val[c] under shared exponent `key` (or signed zeros for _ZERO_KEY).

    Entries 0..127 are computed, 128..255 mirrored: val[c | 0x80] == -val[c] exactly and the
    rounding is symmetric. (127 and 255, NaN codes, hold garbage that is never used.)
    """
    if key == _ZERO_KEY:
        for c in range(128):
            z = np.uint8((_f32_bits(val[c]) >> np.uint32(31)) * sbit)
            tab[c] = z
            tab[c + 128] = z ^ sbit
        return
    factor = _pow2f(127 - key)
    if fmt == _FMT_E4M3:
        for c in range(128):
            code = _encode_e4m3(val[c] * factor)
            tab[c] = code
            tab[c + 128] = code ^ sbit
    else:
        for c in range(128):
            code = _encode_e2m1(val[c] * factor)
            tab[c] = code
            tab[c + 128] = code ^ sbit


@njit(cache=True, nogil=True)
def _fill_sq_pairs(pairs, low_tab, high_tab, val, key, fmt):
    """pairs[2c], pairs[2c + 1] = the squared errors of val[c] at E = key and E = key + 1:
    (float64(val[c]) - float64(dequant(code, E)))**2, the reference's arithmetic. Side by side,
    so that the two sums of a group advance with one two-lane load and add."""
    decode = _E4M3_DECODE if fmt == _FMT_E4M3 else _E2M1_DECODE
    for which in range(2):
        tab = low_tab if which == 0 else high_tab
        unit = _pow2f(key + which - 127)
        for c in range(128):
            deq = decode[tab[c]] * unit  # float32 product (inf on overflow), as mx.py
            d = np.float64(val[c]) - np.float64(deq)
            e = d * d
            pairs[2 * c + which] = e
            pairs[2 * (c + 128) + which] = e


# --- the group paths -------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _direct_group(v, out, fmt, rule, emax, max_mantissa, max_exponent, sbit, lo_codes, hi_codes):
    """Direct per-element path for one group of 32 resolved float32 values `v` (any tiling).

    Writes the unpacked output codes to `out` and returns the shared exponent, or -1 when a
    value is not finite.
    """
    amax_bits = np.uint32(0)
    for j in range(GROUP_SIZE):
        b = _f32_bits(v[j]) & np.uint32(0x7FFFFFFF)
        if b >= np.uint32(0x7F800000):
            return -1
        if b > amax_bits:
            amax_bits = b
    amax = _bits_f32(amax_bits)
    if rule == _RCEIL:
        e = _rceil_exponent(amax, max_mantissa, max_exponent)
        factor = _pow2f(127 - e)
        for j in range(GROUP_SIZE):
            out[j] = _encode(v[j] * factor, fmt)
        return e
    low = _floor_exponent(amax_bits, emax)
    if rule == _FLOOR:
        if low == 0:
            for j in range(GROUP_SIZE):
                out[j] = sbit if _f32_bits(v[j]) >> np.uint32(31) else np.uint8(0)
            return 0
        factor = _pow2f(127 - low)
        for j in range(GROUP_SIZE):
            out[j] = _encode(v[j] * factor, fmt)
        return low
    # mse compares E_floor with E_floor + 1 only when the group saturates at E_floor (the module
    # docstring's bound: at most 464 for E4M3, 7 for E2M1, E_floor wins for sure)
    sse_above = _format_constants(fmt)[2]
    if low >= 254 or amax * _pow2f(127 - low) <= sse_above:
        factor = _pow2f(127 - low)
        for j in range(GROUP_SIZE):
            out[j] = _encode(v[j] * factor, fmt)
        return low
    high = low + 1
    sse = np.zeros(2, dtype=np.float64)
    for which in range(2):
        e = low if which == 0 else high
        codes = lo_codes if which == 0 else hi_codes
        factor = _pow2f(127 - e)
        unit = _pow2f(e - 127)
        total = 0.0
        for j in range(GROUP_SIZE):
            code = _encode(v[j] * factor, fmt)
            codes[j] = code
            if fmt == _FMT_E4M3:
                deq = _E4M3_DECODE[code] * unit
            else:
                deq = _E2M1_DECODE[code] * unit
            d = np.float64(v[j]) - np.float64(deq)
            total += d * d
        sse[which] = total
    chosen = hi_codes if sse[1] < sse[0] else lo_codes
    for j in range(GROUP_SIZE):
        out[j] = chosen[j]
    return high if sse[1] < sse[0] else low




_ROWS_IN = (  # the arguments both requantize entry points start with
    types.Array(types.uint8, 2, "C", readonly=True),  # codes [R, K]
    types.Array(types.float32, 2, "C", readonly=True),  # tile scales
    types.int64,  # bn
    types.int64,  # bk
    types.int64,  # row_offset
    types.boolean,  # BF16 resolve
    types.int64,  # format
    types.int64,  # rule
)
_ROWS_OUT = (types.Array(types.uint8, 2, "C"), types.Array(types.uint8, 2, "C"))  # payload, scale bytes
_FLAT_IN = types.Array(types.uint8, 1, "C", readonly=True)
_FLAT = types.Array(types.uint8, 1, "C")
_INT64S = types.Array(types.int64, 1, "C")
_REQUANT_SIG = types.int64(
    _FLAT_IN,  # codes [R * K], row-major
    types.int64,  # K
    types.Array(types.float32, 1, "C", readonly=True),  # tile scales, row-major [tile rows * tile columns]
    types.int64,  # tile columns
    *_ROWS_IN[2:],  # bn, bk, row_offset, BF16 resolve, format, rule
    _FLAT,  # payload [R * K] (E4M3) or [R * K / 2] (packed E2M1)
    _FLAT,  # scale bytes [R * K / 32]
    _FLAT,  # scratch: code tables
    types.Array(types.float64, 1, "C"),  # scratch: squared-error pair tables
    _INT64S,  # scratch: key stamps, key slots, pair stamps, band counter
    _INT64S,  # scratch: (column, group maximum) -> info word
    types.Array(types.float32, 1, "C"),  # scratch: per tile column, code -> resolved value
    _INT64S,  # scratch: per group of a row, its tile column, table offset, and the mse list
)

_SLOTS_EXHAUSTED = 2  # kernel status: the scratch needs more table slots (the wrapper grows it)
# info word of a (tile column, group maximum): E_floor's slot | E_floor + 1's slot << 24 |
# scale byte << 48 | _SSE_FLAG when the group saturates at E_floor and mse must compare sums
_SSE_FLAG = 1 << 56
_SLOT_MASK = (1 << 24) - 1


@intrinsic
def _load_word(typingctx, array, at):
    """The 8 bytes of a 1-D uint8 array at byte offset `at`, as a little-endian uint64."""
    if not (isinstance(array, types.Array) and array.dtype == types.uint8 and isinstance(at, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        word_ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(word_ptr, align=1)

    return types.uint64(array, at), codegen


@intrinsic
def _store_word(typingctx, array, at, word):
    """Store a uint64 as the 8 bytes of a 1-D uint8 array at byte offset `at` (little-endian)."""
    if not (isinstance(array, types.Array) and array.dtype == types.uint8 and isinstance(at, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        word_ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        builder.store(args[2], word_ptr, align=1)
        return context.get_dummy_value()

    return types.void(array, at, types.uint64), codegen


@njit(cache=True, nogil=True)
def _scan_row(codes, row_start, g, n_groups, work, info, scales_out, scale_row, n_sse):
    """Pass 1 over one row from group g: each group's table offset and scale byte (and the list of
    mse groups that need their sums), until a group whose (column, maximum) has no info yet.
    Returns (that group, or n_groups at the end of the row; the updated count of mse groups)."""
    while g < n_groups:
        tc = work[g]
        if tc >= 0:
            cmax = _group_max_magnitude(codes, row_start + np.uint64(g * GROUP_SIZE))
            word_info = info[np.uint64(tc * 128) + cmax]
            if word_info < 0:
                return g, n_sse
            scales_out[scale_row + np.uint64(g)] = np.uint8((word_info >> 48) & 0xFF)
            work[n_groups + g] = (word_info & _SLOT_MASK) * 256
            if word_info & _SSE_FLAG:
                work[2 * n_groups + n_sse] = g
                work[3 * n_groups + n_sse] = word_info
                n_sse += 1
        g += 1
    return g, n_sse


def _requantize_kernel_for(vector_lookup):
    """`_requantize_kernel` with AVX2 (`vector_lookup`) or scalar table lookups. The flag is a
    constant of the closure: numba prunes the other lookup before typing, so a machine compiles
    only the lookup it runs (tests compile the scalar one on AVX2 machines too)."""

    def _requantize_kernel(
        codes, k, scale, tile_cols, bn, bk, row_offset, bf16, fmt, rule, payload, scales_out, code_tabs, sq_tabs,
        meta, info, vals, work,
    ):
        """Fill payload and scale bytes of R = len(codes) // K rows, all arrays flat and row-major.
        Status 0: done; 1: NaN/Inf input (the caller asks the reference for its error);
        _SLOTS_EXHAUSTED: call again with larger scratch. Groups across two tiles are left to
        _requantize_direct_kernel.

        Rows are walked in order, streaming through memory. Per tile row (a "band"), each tile
        column gets its resolved-value table (``vals[tc * 256 + code]``), and each (column, key)
        that a group needs (key = E, or _ZERO_KEY for floor's signed zeros) a slot:
        ``code_tabs[slot * 256 + code]`` is the output code, and for mse
        ``sq_tabs[slot * 512 + 2 * code + {0, 1}]`` the squared errors at E and E + 1 side by side.
        ``meta`` holds, for the C = len(info) // 128 columns it was sized for, the band that last
        gave each (column, key) a slot [0, 256 C), that slot [256 C, 512 C), the band that filled
        each slot's pair table [512 C, 512 C + slots), and the running band counter (last entry,
        kept across calls), so that nothing needs a reset between bands or calls. ``work`` holds
        four arrays of one entry per group of a row: its tile column (-1 across tiles), its table
        offset, then the groups whose mse needs the sums and their info words.

        The arrays come flat and the scratch from the caller, with no numpy calls here: numba
        compiles an internal function for each reshape, view or np.empty, which would take more
        time than all the rest of the kernel's typing.
        """
        n_codes = codes.shape[0]
        if n_codes == 0:
            return 0
        rows = n_codes // k
        n_groups = k // GROUP_SIZE
        pk = payload.shape[0] // rows
        capacity = code_tabs.shape[0] // 256
        key_slot0 = info.shape[0] * 2  # 256 * columns
        pair_stamp0 = key_slot0 * 2
        counter = meta.shape[0] - 1
        emax, sbit, sse_above, max_mantissa, max_exponent = _format_constants(fmt)
        gtab0, sse_groups0, sse_info0 = n_groups, 2 * n_groups, 3 * n_groups  # the arrays in `work`
        for g in range(n_groups):
            first = g * GROUP_SIZE // bk
            work[g] = first if first == (g * GROUP_SIZE + GROUP_SIZE - 1) // bk else -1

        for t in range(row_offset // bn, (row_offset + rows - 1) // bn + 1):
            r0 = t * bn - row_offset
            r0 = r0 if r0 > 0 else 0
            r1 = (t + 1) * bn - row_offset
            r1 = r1 if r1 < rows else rows
            meta[counter] += 1
            band = meta[counter]
            n_slots = 0
            for tc in range(tile_cols):
                _fill_values(vals[tc * 256 : tc * 256 + 256], scale[t * tile_cols + tc], bf16)
            for i in range(tile_cols * 128):
                info[i] = -1
            for r in range(r0, r1):
                row_start = np.uint64(r * k)
                scale_row = np.uint64(r * n_groups)
                # pass 1: per group, the table (and scale byte) its maximum magnitude selects; the
                # first group of a tile with a given maximum stops the scan to find the exponent(s)
                # and fill tables, then the scan resumes at that group
                n_sse = np.int64(0)  # not the literal 0: _scan_row would be compiled twice (0, then int64)
                g = np.int64(0)
                while True:
                    g, n_sse = _scan_row(codes, row_start, g, n_groups, work, info, scales_out, scale_row, n_sse)
                    if g == n_groups:
                        break
                    tc = work[g]
                    cmax = _group_max_magnitude(codes, row_start + np.uint64(g * GROUP_SIZE))
                    if cmax == 0x7F:
                        return 1  # NaN code
                    amax = abs(vals[np.uint64(tc * 256) + cmax])
                    a_bits = _f32_bits(amax)
                    if a_bits >= np.uint32(0x7F800000):
                        return 1  # the resolved value overflowed to inf
                    need_sse = False
                    if rule == _FLOOR:
                        e = _floor_exponent(a_bits, emax)
                        key = e if e > 0 else _ZERO_KEY
                    elif rule == _RCEIL:
                        key = _rceil_exponent(amax, max_mantissa, max_exponent)
                    else:
                        key = _floor_exponent(a_bits, emax)
                        need_sse = key < 254 and amax * _pow2f(127 - key) > sse_above
                    if n_slots + 2 > capacity:
                        return _SLOTS_EXHAUSTED
                    val = vals[tc * 256 : tc * 256 + 256]
                    word_info = (0 if key == _ZERO_KEY else key) << 48
                    for which in range(2 if need_sse else 1):
                        at_key = tc * 256 + key + which
                        if meta[at_key] == band:
                            slot = meta[key_slot0 + at_key]
                        else:
                            slot = n_slots
                            n_slots += 1
                            meta[at_key] = band
                            meta[key_slot0 + at_key] = slot
                            meta[pair_stamp0 + slot] = 0
                            _fill_codes(code_tabs[slot * 256 : slot * 256 + 256], val, key + which, fmt, sbit)
                        word_info |= slot << (24 * which)
                    if need_sse:
                        low = word_info & _SLOT_MASK
                        if meta[pair_stamp0 + low] != band:
                            high = (word_info >> 24) & _SLOT_MASK
                            _fill_sq_pairs(
                                sq_tabs[low * 512 : low * 512 + 512],
                                code_tabs[low * 256 : low * 256 + 256],
                                code_tabs[high * 256 : high * 256 + 256],
                                val,
                                key,
                                fmt,
                            )
                            meta[pair_stamp0 + low] = band
                        word_info |= _SSE_FLAG
                    info[tc * 128 + cmax] = word_info
                # pass 2 (mse): the two sums of squared error of each saturating group, four groups
                # interleaved so that the eight sequential float64 chains overlap
                i = 0
                while i < n_sse:
                    # four groups at a time (the last ones repeated to fill the four)
                    last = n_sse - 1
                    q0 = i
                    q1 = i + 1 if i + 1 < last else last
                    q2 = i + 2 if i + 2 < last else last
                    q3 = i + 3 if i + 3 < last else last
                    decisions = _sse_decisions(
                        codes,
                        row_start + np.uint64(work[sse_groups0 + q0] * GROUP_SIZE),
                        row_start + np.uint64(work[sse_groups0 + q1] * GROUP_SIZE),
                        row_start + np.uint64(work[sse_groups0 + q2] * GROUP_SIZE),
                        row_start + np.uint64(work[sse_groups0 + q3] * GROUP_SIZE),
                        sq_tabs,
                        np.uint64((work[sse_info0 + q0] & _SLOT_MASK) * 512),
                        np.uint64((work[sse_info0 + q1] & _SLOT_MASK) * 512),
                        np.uint64((work[sse_info0 + q2] & _SLOT_MASK) * 512),
                        np.uint64((work[sse_info0 + q3] & _SLOT_MASK) * 512),
                    )
                    for d in range(4 if n_sse - i > 4 else n_sse - i):
                        if decisions & (1 << d):  # ties stay at E_floor: switch to E_floor + 1's table and scale
                            g = work[sse_groups0 + i + d]
                            work[gtab0 + g] = ((work[sse_info0 + i + d] >> 24) & _SLOT_MASK) * 256
                            scales_out[scale_row + np.uint64(g)] += np.uint8(1)
                    i += 4
                # pass 3: table lookups
                if vector_lookup:
                    fp4 = fmt == _FMT_E2M1
                    out_group = pk // n_groups  # payload bytes per group: 32 (E4M3) or 16 (E2M1)
                    for g in range(n_groups):
                        if work[g] >= 0:
                            _lookup_group_avx2(
                                codes, r * k + g * GROUP_SIZE, code_tabs, work[gtab0 + g], payload, r * pk + g * out_group,
                                fp4,
                            )
                elif fmt == _FMT_E4M3:
                    for g in range(n_groups):
                        if work[g] < 0:
                            continue
                        tab = np.uint64(work[gtab0 + g])
                        at = row_start + np.uint64(g * GROUP_SIZE)
                        for q in range(4):
                            word = _load_word(codes, at + np.uint64(8 * q))
                            o = np.uint64(0)
                            for b in range(8):
                                code = code_tabs[tab + ((word >> np.uint64(8 * b)) & np.uint64(0xFF))]
                                o |= np.uint64(code) << np.uint64(8 * b)
                            _store_word(payload, at + np.uint64(8 * q), o)
                else:
                    for g in range(n_groups):
                        if work[g] < 0:
                            continue
                        tab = np.uint64(work[gtab0 + g])
                        at = row_start + np.uint64(g * GROUP_SIZE)
                        out_at = np.uint64(r * pk + g * (GROUP_SIZE // 2))
                        for half in range(2):
                            o = np.uint64(0)
                            for q in range(2):
                                word = _load_word(codes, at + np.uint64(16 * half + 8 * q))
                                for b in range(8):
                                    code = code_tabs[tab + ((word >> np.uint64(8 * b)) & np.uint64(0xFF))]
                                    o |= np.uint64(code) << np.uint64(32 * q + 4 * b)
                            _store_word(payload, out_at + np.uint64(8 * half), o)
        return 0

    return _requantize_kernel


_requantize_kernel = _EntryPoint(_REQUANT_SIG, _requantize_kernel_for(_AVX2))
# the scalar lookups, for tests on AVX2 machines (elsewhere they are what _requantize_kernel runs)
_requantize_scalar_kernel = _EntryPoint(_REQUANT_SIG, _requantize_kernel_for(False)) if _AVX2 else _requantize_kernel


_DIRECT_SIG = types.int64(*_ROWS_IN, types.boolean, *_ROWS_OUT)  # boolean: every group, not only those across tiles


@_entry_point(_DIRECT_SIG)
def _requantize_direct_kernel(codes2d, scale, bn, bk, row_offset, bf16, fmt, rule, every_group, payload2d, scales2d):
    """The groups _requantize_kernel leaves out: those across two tiles (bk % 32 != 0), or every
    group with `every_group`, one element at a time. Status 0: done; 1: NaN/Inf input. A separate
    entry point, so that only checkpoints whose tiles split MX groups ever compile it."""
    rows, k = codes2d.shape
    n_groups = k // GROUP_SIZE
    emax, sbit, _, max_mantissa, max_exponent = _format_constants(fmt)
    gv = np.empty(GROUP_SIZE, dtype=np.float32)
    gout = np.empty(GROUP_SIZE, dtype=np.uint8)
    glo = np.empty(GROUP_SIZE, dtype=np.uint8)
    ghi = np.empty(GROUP_SIZE, dtype=np.uint8)
    for t in range(row_offset // bn, (row_offset + rows - 1) // bn + 1):
        r0 = max(t * bn - row_offset, 0)
        r1 = min((t + 1) * bn - row_offset, rows)
        for r in range(r0, r1):
            for g in range(n_groups):
                kk = g * GROUP_SIZE
                if not every_group and kk // bk == (kk + GROUP_SIZE - 1) // bk:
                    continue
                for j in range(GROUP_SIZE):
                    c = codes2d[r, kk + j]
                    if (c & np.uint8(0x7F)) == 0x7F:
                        return 1
                    gv[j] = _resolve(_E4M3_DECODE[c], scale[t, (kk + j) // bk], bf16)
                e = _direct_group(gv, gout, fmt, rule, emax, max_mantissa, max_exponent, sbit, glo, ghi)
                if e < 0:
                    return 1
                scales2d[r, g] = np.uint8(e)
                if fmt == _FMT_E4M3:
                    for j in range(GROUP_SIZE):
                        payload2d[r, kk + j] = gout[j]
                else:
                    h0 = g * (GROUP_SIZE // 2)
                    for j in range(GROUP_SIZE // 2):
                        payload2d[r, h0 + j] = gout[2 * j] | (gout[2 * j + 1] << np.uint8(4))
    return 0


_ERROR_SIG = types.none(
    *_ROWS_IN[:6],  # codes [R, K], tile scales, bn, bk, row_offset, BF16 resolve
    types.int64,  # format
    types.Array(types.uint8, 2, "C", readonly=True),  # package payload [R, K] or packed [R, K/2]
    types.Array(types.uint8, 2, "C", readonly=True),  # package scale bytes [R, K/32]
    types.Array(types.float64, 1, "C"),  # in/out: sum ref^2, sum err^2, max |err|, saturated codes
)


@njit(cache=True, nogil=True, inline="always")
def _error_terms(vals, col_tile, src, decode, gcodes, unit, base, j):
    """(resolved source value, dequantized package value - it) of element base + j, in float64."""
    i = np.uint64(base + j)  # unsigned indices: no negative-index wraparound code
    ref = np.float64(vals[np.uint64(col_tile[i]) * np.uint64(256) + np.uint64(src[i])])
    return ref, np.float64(decode[gcodes[np.uint64(j)]] * unit) - ref


@_entry_point(_ERROR_SIG)
def _error_kernel(codes2d, scale, bn, bk, row_offset, bf16, fmt, payload2d, scales2d, sums):
    """Add the error of a dequantized MX package block against its resolved source rows to `sums`,
    with the definitions of metrics.ErrorAccumulator (float64 error of float32 values; a scale byte
    255 dequantizes to NaN and makes the sums NaN). One 256-entry value table per tile; four
    partial sums per quantity (element j adds to partial j % 4), so that no chain of dependent float
    additions sets the pace."""
    rows, k = codes2d.shape
    if rows == 0:
        return
    tile_cols = scale.shape[1]
    tables = np.empty((tile_cols, 256), dtype=np.float32)
    vals = tables.reshape(-1)
    col_tile = np.empty(k, dtype=np.int64)
    for col in range(k):
        col_tile[col] = col // bk
    if fmt == _FMT_E4M3:
        decode, magnitude, top = _E4M3_DECODE, np.uint8(0x7F), np.uint8(0x7E)
    else:
        decode, magnitude, top = _E2M1_DECODE, np.uint8(0x07), np.uint8(0x07)
    # four independent partial sums of each quantity (element j adds to partial j % 4)
    ref0 = ref1 = ref2 = ref3 = err0 = err1 = err2 = err3 = 0.0
    max_abs = 0.0
    saturated = 0
    gcodes = np.empty(GROUP_SIZE, dtype=np.uint8)
    for t in range(row_offset // bn, (row_offset + rows - 1) // bn + 1):
        r0 = max(t * bn - row_offset, 0)
        r1 = min((t + 1) * bn - row_offset, rows)
        for tc in range(tile_cols):
            _fill_values(tables[tc], scale[t, tc], bf16)
        for r in range(r0, r1):
            src = codes2d[r]
            for g in range(k // GROUP_SIZE):
                base = g * GROUP_SIZE
                if fmt == _FMT_E4M3:
                    for j in range(GROUP_SIZE):
                        gcodes[j] = payload2d[r, base + j]
                else:
                    for j in range(GROUP_SIZE // 2):
                        byte = payload2d[r, g * (GROUP_SIZE // 2) + j]
                        gcodes[2 * j] = byte & np.uint8(0x0F)
                        gcodes[2 * j + 1] = byte >> np.uint8(4)
                e = scales2d[r, g]
                unit = np.float32(np.nan) if e == 255 else _pow2f(np.int64(e) - 127)
                for j in range(0, GROUP_SIZE, 4):
                    a0, d0 = _error_terms(vals, col_tile, src, decode, gcodes, unit, base, j)
                    a1, d1 = _error_terms(vals, col_tile, src, decode, gcodes, unit, base, j + 1)
                    a2, d2 = _error_terms(vals, col_tile, src, decode, gcodes, unit, base, j + 2)
                    a3, d3 = _error_terms(vals, col_tile, src, decode, gcodes, unit, base, j + 3)
                    ref0 += a0 * a0
                    ref1 += a1 * a1
                    ref2 += a2 * a2
                    ref3 += a3 * a3
                    err0 += d0 * d0
                    err1 += d1 * d1
                    err2 += d2 * d2
                    err3 += d3 * d3
                    max_abs = max(max_abs, abs(d0), abs(d1), abs(d2), abs(d3))
                for j in range(GROUP_SIZE):
                    saturated += (gcodes[j] & magnitude) == top
    total_err = (err0 + err1) + (err2 + err3)
    sums[0] += (ref0 + ref1) + (ref2 + ref3)
    sums[1] += total_err
    # a NaN error makes err_sq NaN (and only a NaN error does): then the maximum is NaN, as in np.max
    block_max = np.nan if total_err != total_err else max_abs
    if sums[2] == sums[2] and not block_max <= sums[2]:
        sums[2] = block_max
    sums[3] += saturated


_RESOLVE_SIG = types.int64(
    types.Array(types.uint8, 2, "C", readonly=True),
    types.Array(types.float32, 2, "C", readonly=True),
    types.int64,
    types.int64,
    types.int64,
    types.Array(types.uint16, 2, "C"),
)


@_entry_point(_RESOLVE_SIG)
def _resolve_bf16_kernel(codes, scale, bn, bk, row_offset, out):
    """out[r, k] = BF16 bits of R(fp8 * s), one 256-entry table per tile. Status 0: done; 1: a
    value is NaN or Inf, from a NaN code or an overflow (the caller asks the reference for its error)."""
    rows, k = codes.shape
    tab = np.empty(256, dtype=np.uint16)
    if rows == 0:
        return 0
    # bit 15 of (bits & 0x7F80) + 0x80 is set only where the exponent is all ones (NaN / Inf)
    exponents = np.uint16(0)
    for t in range(row_offset // bn, (row_offset + rows - 1) // bn + 1):
        r0 = max(t * bn - row_offset, 0)
        r1 = min((t + 1) * bn - row_offset, rows)
        for tc in range(scale.shape[1]):
            s = scale[t, tc]
            for c in range(256):
                tab[c] = np.uint16(_f32_bits(_bf16_round(_E4M3_DECODE[c] * s)) >> np.uint32(16))
            k0 = tc * bk
            k1 = min(k0 + bk, k)
            for r in range(r0, r1):
                for kk in range(k0, k1):
                    bits = tab[codes[r, kk]]
                    out[r, kk] = bits
                    exponents |= (bits & np.uint16(0x7F80)) + np.uint16(0x80)
    return 1 if exponents & np.uint16(0x8000) else 0


@_entry_point(types.int64(types.Array(types.uint8, 1, "C", readonly=True)))
def _first_nan_kernel(flat):
    """Flat index of the first code with (c & 0x7F) == 0x7F, or -1."""
    n = flat.shape[0]
    block = 4096
    for start in range(0, n, block):
        stop = min(start + block, n)
        acc = np.uint8(0)
        for i in range(start, stop):
            acc |= (flat[i] & np.uint8(0x7F)) + np.uint8(1)  # bit 7 set only for 0x7F
        if acc & np.uint8(0x80):
            for i in range(start, stop):
                if (flat[i] & np.uint8(0x7F)) == 0x7F:
                    return i
    return -1


@njit(cache=True, nogil=True)
def _mse_float_group(row, kk, low, fmt, lo_codes, hi_codes, d_low, d_high):
    """mse's choice for the group row[kk : kk + 32], which saturates at E_floor = `low`: the codes
    at E_floor and E_floor + 1 and their squared errors, computed as the direct path does (float32
    dequantization, float64 differences) and summed sequentially j = 0..31. Returns the exponent
    chosen; its codes are left in `hi_codes`."""
    high = low + 1
    f_low, f_high = _pow2f(127 - low), _pow2f(127 - high)
    u_low, u_high = _pow2f(low - 127), _pow2f(high - 127)
    for j in range(GROUP_SIZE):
        v = row[kk + j]
        c_low = _encode(v * f_low, fmt)
        c_high = _encode(v * f_high, fmt)
        lo_codes[j], hi_codes[j] = c_low, c_high
        if fmt == _FMT_E4M3:
            q_low, q_high = _E4M3_DECODE[c_low] * u_low, _E4M3_DECODE[c_high] * u_high
        else:
            q_low, q_high = _E2M1_DECODE[c_low] * u_low, _E2M1_DECODE[c_high] * u_high
        d_low[j] = np.float64(v) - np.float64(q_low)
        d_high[j] = np.float64(v) - np.float64(q_high)
    sse_low = 0.0
    sse_high = 0.0
    for j in range(GROUP_SIZE):
        sse_low += d_low[j] * d_low[j]
        sse_high += d_high[j] * d_high[j]
    if sse_high < sse_low:
        return high
    for j in range(GROUP_SIZE):
        hi_codes[j] = lo_codes[j]
    return low


_FLOAT_ROWS_SIG = types.int64(
    types.Array(types.float32, 2, "C", readonly=True),  # values [R, K]
    types.int64,  # format
    types.int64,  # rule
    *_ROWS_OUT,  # payload, scale bytes
)


@_entry_point(_FLOAT_ROWS_SIG)
def _quantize_float_kernel(values, fmt, rule, payload2d, scales2d):
    """Float rows (a BF16 / F16 / F32 source) -> MX payload and scale bytes. Status 0: done;
    1: NaN/Inf.

    Per group: the maximum magnitude from the bits, the shared exponent by the rule, then the 32
    encodes as one branch-free loop per format (which LLVM vectorizes). mse compares two exponents
    only for a group that saturates at E_floor (the module docstring's bound: a fifth to a quarter
    of the groups of Gaussian weights), in `_mse_float_group`."""
    rows, k = values.shape
    n_groups = k // GROUP_SIZE
    emax, _, sse_above, max_mantissa, max_exponent = _format_constants(fmt)
    glo = np.empty(GROUP_SIZE, dtype=np.uint8)
    ghi = np.empty(GROUP_SIZE, dtype=np.uint8)
    dlo = np.empty(GROUP_SIZE, dtype=np.float64)
    dhi = np.empty(GROUP_SIZE, dtype=np.float64)
    for r in range(rows):
        row = values[r]
        out = payload2d[r]
        for g in range(n_groups):
            kk = g * GROUP_SIZE
            amax_bits = np.uint32(0)
            for j in range(GROUP_SIZE):
                amax_bits = max(amax_bits, _f32_bits(row[kk + j]) & np.uint32(0x7FFFFFFF))
            if amax_bits >= np.uint32(0x7F800000):
                return 1
            amax = _bits_f32(amax_bits)
            if rule == _RCEIL:
                e = _rceil_exponent(amax, max_mantissa, max_exponent)
            else:
                e = _floor_exponent(amax_bits, emax)
                if rule == _MSE and e < 254 and amax * _pow2f(127 - e) > sse_above:
                    e = _mse_float_group(row, kk, e, fmt, glo, ghi, dlo, dhi)
                    scales2d[r, g] = np.uint8(e)
                    if fmt == _FMT_E4M3:
                        for j in range(GROUP_SIZE):
                            out[kk + j] = ghi[j]
                    else:
                        for j in range(GROUP_SIZE // 2):
                            out[g * (GROUP_SIZE // 2) + j] = ghi[2 * j] | (ghi[2 * j + 1] << np.uint8(4))
                    continue
            scales2d[r, g] = np.uint8(e)
            # floor with E = 0: the group is below the smallest scale, written as signed zeros
            # (mx._floor_exponents); the factor 0 keeps each sign, as the reference does
            factor = np.float32(0.0) if (rule == _FLOOR and e == 0) else _pow2f(127 - e)
            if fmt == _FMT_E4M3:
                for j in range(GROUP_SIZE):
                    out[kk + j] = _encode_e4m3(row[kk + j] * factor)
            else:
                h0 = g * (GROUP_SIZE // 2)
                for j in range(GROUP_SIZE // 2):
                    lo = _encode_e2m1(row[kk + 2 * j] * factor)
                    hi = _encode_e2m1(row[kk + 2 * j + 1] * factor)
                    out[h0 + j] = lo | (hi << np.uint8(4))
    return 0


ENTRY_POINTS = {
    "quantize_float": _quantize_float_kernel,
    "requantize": _requantize_kernel,
    "requantize_scalar": _requantize_scalar_kernel,
    "requantize_direct": _requantize_direct_kernel,
    "resolve_bf16": _resolve_bf16_kernel,
    "first_nan": _first_nan_kernel,
    "error": _error_kernel,
}


def entry_points_for(mx: bool, resolve: bool, tiles_split_groups: bool) -> list[str]:
    """The entry points a conversion needs: requantize for MX weights (and the direct path when
    some tiles split MX groups: bk % 32 != 0), resolve_bf16 for weights kept in BF16. (Both find
    NaN codes themselves; first_nan then only names the first one, and is compiled on that first
    error.)"""
    names = []
    if mx:
        names.append("requantize")
        if tiles_split_groups:
            names.append("requantize_direct")
    if resolve:
        names.append("resolve_bf16")
    return names


# --- the public functions (requantize.py's signatures) -----------------------------------------


def _fmt_id(fmt) -> int | None:
    if fmt == E4M3:
        return _FMT_E4M3
    if fmt == E2M1:
        return _FMT_E2M1
    return None


def _prepare(codes, scale_inv, block, row_offset):
    """(codes, scale, bn, bk) ready for a kernel, or None when the reference must decide."""
    if not isinstance(codes, np.ndarray) or codes.dtype != np.uint8 or codes.ndim != 2:
        return None
    scale = np.asarray(scale_inv)
    if scale.dtype not in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        return None
    try:
        bn, bk = (int(b) for b in block)
        row_offset = int(row_offset)
    except (TypeError, ValueError):
        return None
    if bn <= 0 or bk <= 0 or row_offset < 0:
        return None
    rows, k = codes.shape
    if rows == 0 or k == 0:
        return None
    if scale.ndim != 2 or scale.shape[1] != -(-k // bk) or scale.shape[0] < -(-(row_offset + rows) // bn):
        return None
    codes = np.ascontiguousarray(codes)  # (the kernels load and store unaligned words and vectors)
    scale = np.ascontiguousarray(scale, dtype=np.float32)  # exact widening of f16/bf16
    return codes, scale, bn, bk, row_offset


_THREAD = threading.local()


def _scratch(tile_cols: int, slots: int = 0) -> tuple[np.ndarray, ...]:
    """This thread's kernel scratch (see `_requantize_kernel`) for `tile_cols` tile columns and at
    least `slots` table slots, kept across calls: a few MB, touched only where used."""
    held = getattr(_THREAD, "scratch", None)
    if held is None or held[0] < tile_cols or held[1] < slots:
        columns = max(tile_cols, 64, held[0] if held else 0)
        capacity = max(slots, 8 * columns + 64, held[1] if held else 0)
        held = (
            columns,
            capacity,
            np.empty(capacity * 256, dtype=np.uint8),
            np.empty(capacity * 512, dtype=np.float64),
            np.zeros(512 * columns + capacity + 1, dtype=np.int64),
            np.empty(128 * columns, dtype=np.int64),
            np.empty(256 * columns, dtype=np.float32),
        )
        _THREAD.scratch = held
    return held[2:]


def requantize_rows(
    codes: np.ndarray,
    scale_inv: np.ndarray,
    block: tuple[int, int],
    row_offset: int,
    resolve_dtype: str,
    fmt,
    rule: str,
    *,
    out: np.ndarray | None = None,
    _path: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """Rows [row_offset, row_offset + len(codes)) of a block-FP8 weight -> (payload, scale bytes).

    Same contract and bytes as `requantize.requantize_rows`. `out`, optional, is a C-contiguous
    uint8 array of the payload's shape to write the payload into (convert recycles its buffers).
    `_path` is for tests: "auto" (tables, AVX2 lookups where available), "scalar" (tables, scalar
    lookups) or "direct" (the per-element path for every group).
    """
    prepared = _prepare(codes, scale_inv, block, row_offset)
    fmt_id = _fmt_id(fmt)
    if (
        prepared is None
        or fmt_id is None
        or resolve_dtype not in ("bf16", "fp32")
        or rule not in SCALE_RULES
        or prepared[0].shape[1] % GROUP_SIZE
    ):
        return _reference.requantize_rows(codes, scale_inv, block, row_offset, resolve_dtype, fmt, rule)
    c, scale, bn, bk, offset = prepared
    rows, k = c.shape
    payload_shape = (rows, k if fmt_id == _FMT_E4M3 else k // 2)
    payload = _output(out, payload_shape, np.uint8)
    scales = np.empty((rows, k // GROUP_SIZE), dtype=np.uint8)
    every_group = _path == "direct"
    status = 0
    if not every_group:
        kernel = _requantize_scalar_kernel if _path == "scalar" else _requantize_kernel
        work = np.empty(4 * (k // GROUP_SIZE), dtype=np.int64)
        slots = 0
        while True:
            status = kernel(
                c.reshape(-1),
                k,
                scale.reshape(-1),
                scale.shape[1],
                bn,
                bk,
                offset,
                resolve_dtype == "bf16",
                fmt_id,
                _RULE_IDS[rule],
                payload.reshape(-1),
                scales.reshape(-1),
                *_scratch(scale.shape[1], slots),
                work,
            )
            if status != _SLOTS_EXHAUSTED:
                break
            slots = 2 * _THREAD.scratch[1]  # a tile row needed more tables than usual: start over
    if status == 0 and (every_group or bk % GROUP_SIZE):  # groups across tiles
        status = _requantize_direct_kernel(
            c, scale, bn, bk, offset, resolve_dtype == "bf16", fmt_id, _RULE_IDS[rule], every_group, payload, scales
        )
    if status:  # NaN code or non-finite value: the reference raises its own error
        return _reference.requantize_rows(codes, scale_inv, block, row_offset, resolve_dtype, fmt, rule)
    return payload, scales


def quantize_rows(values: np.ndarray, fmt, rule: str, *, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Float rows -> (payload, scale bytes): the bytes of `requantize.quantize_rows`. `out` as in
    `requantize_rows`."""
    fmt_id = _fmt_id(fmt)
    if (
        not isinstance(values, np.ndarray)
        or values.ndim != 2
        or values.dtype != np.float32
        or fmt_id is None
        or rule not in SCALE_RULES
        or values.shape[1] % GROUP_SIZE
        or values.shape[0] == 0
    ):
        return _reference.quantize_rows(values, fmt, rule)
    rows, k = values.shape
    payload = _output(out, (rows, k if fmt_id == _FMT_E4M3 else k // 2), np.uint8)
    scales = np.empty((rows, k // GROUP_SIZE), dtype=np.uint8)
    if _quantize_float_kernel(np.ascontiguousarray(values), fmt_id, _RULE_IDS[rule], payload, scales):
        return _reference.quantize_rows(values, fmt, rule)  # NaN/Inf: the reference raises its own error
    return payload, scales


def resolve_rows_bf16(
    codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int], row_offset: int, *, out: np.ndarray | None = None
) -> np.ndarray:
    """Rows of a block-FP8 weight resolved to BF16 (same bytes as `requantize.resolve_rows_bf16`).

    `out`, optional, is a C-contiguous 2-byte array (uint16 or bfloat16) of the codes' shape to
    write the result into."""
    prepared = _prepare(codes, scale_inv, block, row_offset)
    if prepared is None:
        return _reference.resolve_rows_bf16(codes, scale_inv, block, row_offset)
    c, scale, bn, bk, offset = prepared
    result = _output(out, c.shape, np.uint16)
    if _resolve_bf16_kernel(c, scale, bn, bk, offset, result):  # NaN/Inf: the reference raises its own error
        return _reference.resolve_rows_bf16(codes, scale_inv, block, row_offset)
    return result.view(ml_dtypes.bfloat16)


def _output(out: np.ndarray | None, shape: tuple[int, ...], dtype) -> np.ndarray:
    """`out` checked and viewed as `dtype`, or a new array. (numba's arrays assume elements at
    addresses that are multiples of their size.)"""
    if out is None:
        return np.empty(shape, dtype=dtype)
    dtype = np.dtype(dtype)
    if (
        not isinstance(out, np.ndarray)
        or out.shape != shape
        or out.dtype.itemsize != dtype.itemsize
        or not out.flags.c_contiguous
        or not out.flags.writeable
        or out.ctypes.data % dtype.itemsize
    ):
        raise ValueError(
            f"out must be a writable, C-contiguous, aligned array of shape {shape} and itemsize {dtype.itemsize}"
        )
    return out.view(dtype)


def first_nan_code(codes: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first E4M3 NaN code (0x7F / 0xFF), or None."""
    if not isinstance(codes, np.ndarray) or codes.dtype != np.uint8 or codes.ndim == 0:
        return _reference.first_nan_code(codes)
    flat = np.ascontiguousarray(codes).reshape(-1)
    hit = _first_nan_kernel(flat)
    return None if hit < 0 else tuple(int(i) for i in np.unravel_index(hit, codes.shape))


def error_sums(
    codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int], row_offset: int, resolve_dtype: str,
    fmt, payload: np.ndarray, scales: np.ndarray,
) -> tuple[float, float, float, int]:
    """(sum ref^2, sum err^2, max |err|, saturated codes) of an MX package block (payload as stored:
    E4M3 codes or packed E2M1) against the resolved source rows it came from; what
    metrics.ErrorAccumulator sums for these rows, at kernel speed."""
    c, scale, bn, bk, offset = _prepare(codes, scale_inv, block, row_offset)
    sums = np.zeros(4, dtype=np.float64)
    _error_kernel(
        c, scale, bn, bk, offset, resolve_dtype == "bf16", _fmt_id(fmt),
        np.ascontiguousarray(payload, dtype=np.uint8), np.ascontiguousarray(scales, dtype=np.uint8), sums,
    )
    return float(sums[0]), float(sums[1]), float(sums[2]), int(sums[3])
