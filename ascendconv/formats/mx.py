"""The numpy REFERENCE of MX quantization (contract section 4): shared exponents, element codes, dequantize.

Every other implementation (numba kernels, NPU checks) must reproduce these bytes exactly.

A group is 32 consecutive values of a row. Its shared exponent ``E`` is the stored E8M0 byte
(scale ``2**(E - 127)``), chosen by one of the rules:

- ``floor``: ``E = max(max_i expfield(v_i) - emax, 0)``, ``expfield`` the biased exponent field
  of the float32 bit pattern; when ``E == 0`` every element becomes a signed zero.
- ``rceil``: the smallest ``E`` in ``[0, 254]`` with ``amax <= max_value * 2**(E - 127)``.
- ``mse``: of ``E_floor`` and ``E_floor + 1`` (capped at 254) the one whose dequantized group
  has the lower sum of squared error, ties to ``E_floor``. The sum is taken in float64 adding
  ``(float64(v_j) - float64(dequant_j))**2`` for j = 0..31 in order; that order is part of the
  contract so that a compiled kernel makes the same decisions. Under ``rceil`` and ``mse`` an
  ``E`` of 0 is the ordinary scale ``2**-127`` (the signed-zero behaviour is ``floor``'s only).

Elements: ``y = v * 2**(127 - E)`` (exact), clamp to ``+-max_value``, round to nearest-even.
"""

from __future__ import annotations

import math

import numpy as np

from .constants import E2M1, E4M3, E8M0_BIAS, E8M0_MAX_FINITE, GROUP_SIZE, ROUND_MODES, SCALE_RULES, ElementFormat
from .elements import decode_e2m1, decode_e4m3, e8m0_to_float, encode_e2m1, encode_e4m3, exact_float32


def _codec(fmt: ElementFormat, round_mode: str = "rint"):
    if round_mode not in ROUND_MODES:
        raise ValueError(f"round_mode must be one of {ROUND_MODES}, got {round_mode!r}")
    if fmt == E4M3 and round_mode == "rint":  # the only E4M3 rounding any writer or runtime here uses
        return encode_e4m3, decode_e4m3
    if fmt == E2M1:
        return (lambda y: encode_e2m1(y, round_mode)), decode_e2m1
    raise ValueError(f"unsupported element format {fmt!r} with round_mode {round_mode!r}")


def _grouped(values) -> np.ndarray:
    """Validate ``[..., K]`` float32 input and view it as ``[rows, K // 32, 32]``."""
    values = exact_float32(values, "MX input")
    if values.ndim == 0 or values.shape[-1] % GROUP_SIZE:
        raise ValueError(f"MX input needs a last dimension divisible by {GROUP_SIZE}, got shape {values.shape}")
    if not np.isfinite(values).all():
        bad = int(values.size - np.count_nonzero(np.isfinite(values)))
        raise ValueError(f"non-finite input to MX quantization: NaN/Inf count {bad}")  # formats/ imports no project module
    rows = math.prod(values.shape[:-1])  # not -1: numpy cannot infer it when K is 0
    return values.reshape(rows, values.shape[-1] // GROUP_SIZE, GROUP_SIZE)


def _check_rule(rule: str) -> None:
    if rule not in SCALE_RULES:
        raise ValueError(f"scale rule must be one of {SCALE_RULES}, got {rule!r}")


def _floor_exponents(groups: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """int32 ``[rows, G]``: ``max(max expfield - emax, 0)``; at most 254 - emax, never 255."""
    exponent_fields = (groups.view(np.uint32) >> 23) & 0xFF
    return np.maximum(exponent_fields.max(axis=-1).astype(np.int32) - fmt.emax, 0)


def _rceil_exponents(groups: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """int32 ``[rows, G]``: the smallest ``E`` with ``amax <= max_value * 2**(E - 127)``.

    With ``amax = a * 2**ea`` and ``max_value = m * 2**em`` (frexp, mantissas in [0.5, 1)),
    ``amax / max_value = (a / m) * 2**(ea - em)`` and ``a / m`` lies in (0.5, 2): the smallest
    power of two at or above it is ``2**0`` when ``a <= m`` and ``2**1`` otherwise. All exact.
    """
    amax = np.abs(groups).max(axis=-1)
    amax_mantissa, amax_exponent = np.frexp(amax)
    limit_mantissa, limit_exponent = np.frexp(np.float32(fmt.max_value))
    exponent = amax_exponent - int(limit_exponent) + (amax_mantissa > limit_mantissa) + E8M0_BIAS
    # amax == 0 needs no scale at all: the smallest E, 0. Finite float32 never needs more than 254.
    exponent = np.where(amax == 0, 0, exponent)
    return np.clip(exponent, 0, E8M0_MAX_FINITE).astype(np.int32)


def _encode_groups(groups: np.ndarray, exponents: np.ndarray, fmt: ElementFormat, round_mode: str = "rint") -> np.ndarray:
    """Codes of ``groups * 2**(127 - E)`` with the ordinary scale for every ``E`` (including 0)."""
    encode, _ = _codec(fmt, round_mode)
    # 2**(127 - E) is exact in float32 for every E in [0, 254] (2**-127 is a subnormal), and
    # multiplying by it (faster than ldexp, same result) is exact: the products never overflow
    # (E is at least what the largest element needs), and an underflow into float32 subnormals
    # only touches values below 2**-126, which round to a signed zero in E4M3 and E2M1 anyway.
    factors = np.ldexp(np.float32(1.0), E8M0_BIAS - exponents)
    return encode(groups * factors[..., None])


def _signed_zero_codes(groups: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    return np.where(np.signbit(groups), np.uint8(fmt.sign_bit), np.uint8(0))


def _decode_groups(codes: np.ndarray, exponents: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    _, decode = _codec(fmt)
    # code value * 2**(E - 127) is a float32 power-of-two product, exact down to the smallest
    # result (an E4M3 subnormal at E = 0, 2**-136). It overflows to inf only for group maxima
    # above 1.75 * 2**127 rounded up at E_floor + 1: that candidate's error is then infinite and
    # mse does not take it.
    with np.errstate(over="ignore"):
        return decode(codes) * e8m0_to_float(exponents.astype(np.uint8))[..., None]


def _sequential_sse(groups: np.ndarray, dequantized: np.ndarray) -> np.ndarray:
    """float64 ``[rows, G]``: sum over j = 0..31, in order, of ``(v_j - dequant_j)**2``."""
    sse = np.zeros(groups.shape[:-1], dtype=np.float64)
    for j in range(GROUP_SIZE):  # the addition order is part of the mse contract
        difference = groups[..., j].astype(np.float64) - dequantized[..., j].astype(np.float64)
        sse += difference * difference
    return sse


def _mse_choice(groups: np.ndarray, fmt: ElementFormat) -> tuple[np.ndarray, np.ndarray]:
    """(exponents, codes) of the mse rule."""
    low = _floor_exponents(groups, fmt)
    high = np.minimum(low + 1, E8M0_MAX_FINITE)
    low_codes = _encode_groups(groups, low, fmt)
    high_codes = _encode_groups(groups, high, fmt)
    low_sse = _sequential_sse(groups, _decode_groups(low_codes, low, fmt))
    high_sse = _sequential_sse(groups, _decode_groups(high_codes, high, fmt))
    take_high = high_sse < low_sse  # ties stay at E_floor
    exponents = np.where(take_high, high, low)
    codes = np.where(take_high[..., None], high_codes, low_codes)
    return exponents, codes


def shared_exponents(values, fmt: ElementFormat, rule: str) -> np.ndarray:
    """E8M0 bytes ``[..., K // 32]`` of float32 ``values [..., K]`` under ``rule``."""
    _check_rule(rule)
    _codec(fmt)
    groups = _grouped(values)
    if rule == "floor":
        exponents = _floor_exponents(groups, fmt)
    elif rule == "rceil":
        exponents = _rceil_exponents(groups, fmt)
    else:
        exponents, _ = _mse_choice(groups, fmt)
    return exponents.astype(np.uint8).reshape(np.shape(values)[:-1] + (groups.shape[1],))


def quantize_mx(values, fmt: ElementFormat, rule: str, round_mode: str = "rint") -> tuple[np.ndarray, np.ndarray]:
    """float32 ``values [..., K]`` -> (codes ``uint8 [..., K]``, scales ``uint8 [..., K // 32]``).

    E2M1 codes are unpacked (0..15, one per byte); see ``elements.pack_fp4``. ``round_mode``
    "round" (ties away from zero, E2M1 only) is the runtime's rounding of W4A4_MXFP4 activations;
    weights are always written with "rint". Raises ValueError when K % 32 != 0 or on NaN/Inf
    ("non-finite") input.
    """
    _check_rule(rule)
    _codec(fmt, round_mode)
    groups = _grouped(values)
    if rule == "mse":
        if round_mode != "rint":
            raise ValueError("the mse rule is a weight rule: it rounds with rint only")
        exponents, codes = _mse_choice(groups, fmt)
    elif rule == "rceil":
        exponents = _rceil_exponents(groups, fmt)
        codes = _encode_groups(groups, exponents, fmt, round_mode)
    else:
        exponents = _floor_exponents(groups, fmt)
        codes = np.where(
            (exponents == 0)[..., None],
            _signed_zero_codes(groups, fmt),
            _encode_groups(groups, exponents, fmt, round_mode),
        )
    shape = np.shape(values)
    return codes.reshape(shape), exponents.astype(np.uint8).reshape(shape[:-1] + (groups.shape[1],))


def dequantize_mx(codes, scales, fmt: ElementFormat) -> np.ndarray:
    """Codes ``uint8 [..., K]`` with E8M0 scales ``uint8 [..., K // 32]`` -> float32 ``[..., K]``.

    A scale byte of 255 (E8M0 NaN, never written) dequantizes to NaN. A value beyond float32's
    range becomes inf: rceil produces one for group maxima above about 1.75 * 2**127, where the
    largest element rounds up to 2**128.
    """
    _, decode = _codec(fmt)
    codes = np.asarray(codes)
    scales = np.asarray(scales)
    if codes.ndim == 0 or codes.shape[-1] % GROUP_SIZE:
        raise ValueError(f"codes need a last dimension divisible by {GROUP_SIZE}, got shape {codes.shape}")
    expected = codes.shape[:-1] + (codes.shape[-1] // GROUP_SIZE,)
    if scales.shape != expected:
        raise ValueError(f"scales shape {scales.shape} does not match codes {codes.shape}: expected {expected}")
    grouped = decode(codes).reshape(expected + (GROUP_SIZE,))
    return (grouped * e8m0_to_float(scales)[..., None]).reshape(codes.shape)
