"""Element encodings: E4M3 and E2M1 codes, E8M0 scale bytes, FP4 nibble packing, BF16 rounding.

Codes are ``uint8``: E4M3 codes are the raw OCP ``float8_e4m3fn`` bits, E2M1 codes are 0..15
(``sign << 3 | index`` into ``constants.E2M1_GRID``), one per byte until ``pack_fp4``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .constants import E2M1, E2M1_GRID, E4M3, E8M0_BIAS, E8M0_NAN, ROUND_MODES

# Dtypes that widen to float32 without rounding.
_EXACT_IN_FLOAT32 = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))

# Decode table of all 256 E4M3 codes (0x7F / 0xFF are NaN); a table lookup beats the ml_dtypes cast.
_E4M3_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)

# Signed decode table of E2M1: codes 0..7 positive, 8..15 the same magnitudes negated.
_E2M1_VALUES = np.array(E2M1_GRID + tuple(-v for v in E2M1_GRID), dtype=np.float32)
# Midpoints between neighbouring E2M1 magnitudes (all exact in float32).
_E2M1_MIDPOINTS = np.array([(a + b) / 2 for a, b in zip(E2M1_GRID, E2M1_GRID[1:])], dtype=np.float32)


def exact_float32(x, what: str = "input") -> np.ndarray:
    """``x`` as a float32 array, refusing dtypes whose conversion to float32 would round.

    Encoders round once, from float32; a float64 input would be rounded twice (once to float32,
    once to the element format), so the caller must decide how to get to float32.
    """
    array = np.asarray(x)
    if array.dtype not in _EXACT_IN_FLOAT32:
        raise TypeError(
            f"{what} must be float32 (or float16/bfloat16), got {array.dtype}; "
            "cast explicitly so that rounding happens once"
        )
    return array.astype(np.float32, copy=False)


def _as_codes(codes, what: str) -> np.ndarray:
    array = np.asarray(codes)
    if array.dtype != np.uint8:
        raise TypeError(f"{what} must be uint8, got {array.dtype}")
    return array


def encode_e4m3(y) -> np.ndarray:
    """float32 -> E4M3 codes: clamp to +-448, then round to nearest-even. NaN -> 0x7F/0xFF."""
    y = exact_float32(y, "E4M3 encode input")
    # Clamp first: ml_dtypes maps float32 magnitudes above 464 (the midpoint past 448) to NaN,
    # and +-inf to NaN; the MX rules saturate instead.
    clamped = np.clip(y, np.float32(-E4M3.max_value), np.float32(E4M3.max_value))
    return clamped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def decode_e4m3(codes) -> np.ndarray:
    """E4M3 codes -> float32 (exact; codes 0x7F/0xFF decode to NaN)."""
    return _E4M3_VALUES[_as_codes(codes, "E4M3 codes")]


def encode_e2m1(y, round_mode: str = "rint") -> np.ndarray:
    """float32 -> E2M1 codes 0..15: clamp to +-6, round on the grid, -0.0 -> 8.

    ``round_mode`` "rint" rounds a tie to the even code (the MX rule), "round" away from zero
    (what Ascend's dynamic MX quantization does to W4A4_MXFP4 activations with round_mode="round").
    Raises ValueError on NaN, which E2M1 cannot represent.
    """
    y = exact_float32(y, "E2M1 encode input")
    if np.isnan(y).any():
        raise ValueError("NaN has no E2M1 code")
    clamped = np.clip(y, np.float32(-E2M1.max_value), np.float32(E2M1.max_value))
    if round_mode == "round":
        # a magnitude at or past the midpoint between two grid values takes the larger one
        index = np.searchsorted(_E2M1_MIDPOINTS, np.abs(clamped), side="right").astype(np.uint8)
        return np.where(np.signbit(clamped), index | np.uint8(8), index).astype(np.uint8)
    if round_mode != "rint":
        raise ValueError(f"round_mode must be one of {ROUND_MODES}, got {round_mode!r}")
    # ml_dtypes >= 0.5.1 rounds float32 -> float4_e2m1fn to nearest-even and keeps the sign
    # (earlier versions lost it); the tests check both against an independent rounding.
    return clamped.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)


def decode_e2m1(codes) -> np.ndarray:
    """E2M1 codes 0..15 -> float32 (exact)."""
    codes = _as_codes(codes, "E2M1 codes")
    if codes.size and codes.max() > 0x0F:
        raise ValueError(f"E2M1 codes must be 0..15, found {int(codes.max())}")
    return _E2M1_VALUES[codes]


def pack_fp4(codes) -> np.ndarray:
    """E2M1 codes ``[..., K]`` (K even) -> bytes ``[..., K//2]``: element 2j in the low nibble of
    byte j, element 2j+1 in the high nibble (contract section 3)."""
    codes = _as_codes(codes, "FP4 codes")
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dimension, got shape {codes.shape}")
    if codes.size and codes.max() > 0x0F:
        raise ValueError(f"FP4 codes must be 0..15, found {int(codes.max())}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed) -> np.ndarray:
    """Bytes ``[..., K//2]`` -> E2M1 codes ``[..., K]`` (inverse of ``pack_fp4``)."""
    packed = _as_codes(packed, "packed FP4 bytes")
    if packed.ndim == 0:
        raise ValueError("unpack_fp4 needs at least one dimension")
    codes = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), dtype=np.uint8)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    return codes


def e8m0_to_float(scale_bytes) -> np.ndarray:
    """E8M0 bytes -> float32 ``2**(b - 127)`` (byte 0 is the subnormal 2**-127; 255 -> NaN).

    Built from the integer exponent with ldexp, not through an ml_dtypes E8M0 cast.
    """
    scale_bytes = _as_codes(scale_bytes, "E8M0 scale bytes")
    # Byte 255 would overflow to inf; it is replaced by NaN below, so compute it as 254.
    exponents = np.minimum(scale_bytes, E8M0_NAN - 1).astype(np.int32) - E8M0_BIAS
    values = np.ldexp(np.float32(1.0), exponents)
    return np.where(scale_bytes == E8M0_NAN, np.float32(np.nan), values).astype(np.float32)


def bf16_round(x) -> np.ndarray:
    """float32 -> float32 holding the nearest-even BF16 value."""
    x = exact_float32(x, "BF16 rounding input")
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)
