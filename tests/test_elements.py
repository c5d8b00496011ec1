"""Element encodings checked against independent bit-level and grid-search references."""

import math

import ml_dtypes
import numpy as np
import pytest

from ascendconv.formats.constants import E2M1_GRID, E4M3_NAN_CODES
from ascendconv.formats.elements import (
    bf16_round,
    decode_e2m1,
    decode_e4m3,
    e8m0_to_float,
    encode_e2m1,
    encode_e4m3,
    pack_fp4,
    unpack_fp4,
)

ALL_BYTES = np.arange(256, dtype=np.uint8)
# 0x7F and 0xFF are E4M3 NaN (S.1111.111): they decode to NaN and have no value to round-trip.
FINITE_E4M3_CODES = np.array([c for c in range(256) if c not in E4M3_NAN_CODES], dtype=np.uint8)


def e4m3_value_from_bits(code: int) -> float:
    """OCP float8_e4m3fn from its bit fields: bias 7, subnormals at exponent field 0."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent_field = (code >> 3) & 0x0F
    mantissa = code & 0x07
    if exponent_field == 0:
        return sign * math.ldexp(mantissa / 8, -6)
    return sign * math.ldexp(1 + mantissa / 8, exponent_field - 7)


# Positive E4M3 magnitudes in code order (codes 0x00..0x7E are increasing).
E4M3_POSITIVE = np.array([e4m3_value_from_bits(c) for c in range(0x7F)], dtype=np.float64)
E2M1_POSITIVE = np.array(E2M1_GRID, dtype=np.float64)


def nearest_even_codes(y: np.ndarray, positive_grid: np.ndarray, sign_bit: int) -> np.ndarray:
    """Independent nearest-even rounding onto a grid whose index is the magnitude code."""
    magnitude = np.minimum(np.abs(y.astype(np.float64)), positive_grid[-1])
    upper = np.clip(np.searchsorted(positive_grid, magnitude), 1, len(positive_grid) - 1)
    lower = upper - 1
    to_lower = magnitude - positive_grid[lower]
    to_upper = positive_grid[upper] - magnitude
    pick_upper = (to_upper < to_lower) | ((to_upper == to_lower) & (upper % 2 == 0))
    index = np.where(pick_upper, upper, lower).astype(np.uint8)
    return np.where(np.signbit(y), index | sign_bit, index).astype(np.uint8)


def random_float32(rng, n, low_exp, high_exp):
    mantissas = rng.uniform(1, 2, n) * rng.choice([-1, 1], n)
    return np.ldexp(mantissas, rng.integers(low_exp, high_exp, n)).astype(np.float32)


# ---------------------------------------------------------------- E4M3

def test_e4m3_decode_matches_bit_fields_for_every_code():
    decoded = decode_e4m3(ALL_BYTES)
    assert decoded.dtype == np.float32
    for code in FINITE_E4M3_CODES:
        assert decoded[code] == e4m3_value_from_bits(int(code))
        assert np.signbit(decoded[code]) == bool(code & 0x80)
    assert np.isnan(decoded[list(E4M3_NAN_CODES)]).all()


def test_e4m3_decode_matches_ml_dtypes_for_finite_codes():
    expected = FINITE_E4M3_CODES.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(decode_e4m3(FINITE_E4M3_CODES), expected)


def test_e4m3_every_finite_code_round_trips():
    np.testing.assert_array_equal(encode_e4m3(decode_e4m3(FINITE_E4M3_CODES)), FINITE_E4M3_CODES)


def test_e4m3_midpoints_round_to_even_code():
    lower_codes = np.arange(0x7E, dtype=np.uint8)
    midpoints = ((E4M3_POSITIVE[:-1] + E4M3_POSITIVE[1:]) / 2).astype(np.float32)
    assert np.array_equal(midpoints.astype(np.float64), (E4M3_POSITIVE[:-1] + E4M3_POSITIVE[1:]) / 2)
    even = np.where(lower_codes % 2 == 0, lower_codes, lower_codes + 1).astype(np.uint8)
    np.testing.assert_array_equal(encode_e4m3(midpoints), even)
    np.testing.assert_array_equal(encode_e4m3(-midpoints), even | 0x80)
    # Just off the midpoint the nearer code wins.
    np.testing.assert_array_equal(encode_e4m3(np.nextafter(midpoints, np.float32(0))), lower_codes)
    np.testing.assert_array_equal(encode_e4m3(np.nextafter(midpoints, np.float32(1000))), lower_codes + 1)


def test_e4m3_encode_matches_grid_search_on_random_values():
    rng = np.random.default_rng(1)
    values = np.concatenate([
        random_float32(rng, 20000, -14, 10),  # subnormal, normal and saturating range
        rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ])
    values = values[np.isfinite(values)]
    np.testing.assert_array_equal(encode_e4m3(values), nearest_even_codes(values, E4M3_POSITIVE, 0x80))


def test_e4m3_saturates_instead_of_nan():
    # ml_dtypes alone maps float32 above 464 (and inf) to NaN; encode_e4m3 clamps first.
    values = np.array([448, 463.99, 464, 464.01, 465, 500, 1e6, 3.4e38, np.inf], dtype=np.float32)
    np.testing.assert_array_equal(encode_e4m3(values), np.full(values.shape, 0x7E, np.uint8))
    np.testing.assert_array_equal(encode_e4m3(-values), np.full(values.shape, 0xFE, np.uint8))
    assert decode_e4m3(encode_e4m3(np.float32([1e6, -1e6]))).tolist() == [448.0, -448.0]


def test_e4m3_signed_zeros_and_smallest_subnormal():
    values = np.array([0.0, -0.0, 1e-10, -1e-10, 2.0**-10, -(2.0**-10), 2.0**-9], dtype=np.float32)
    # 2**-10 is the tie between 0 and the smallest subnormal 2**-9: it goes to the even code 0.
    assert encode_e4m3(values).tolist() == [0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x01]


def test_e4m3_nan_input_gives_nan_code():
    code = int(encode_e4m3(np.float32([np.nan]))[0])
    assert code & 0x7F == 0x7F


def test_encoders_refuse_float64():
    with pytest.raises(TypeError, match="float32"):
        encode_e4m3(np.array([1.0]))
    with pytest.raises(TypeError, match="float32"):
        encode_e2m1(np.array([1.0]))


def test_bfloat16_input_is_accepted_exactly():
    values = np.array([1.5, -3.0, 448.0], dtype=ml_dtypes.bfloat16)
    assert decode_e4m3(encode_e4m3(values)).tolist() == [1.5, -3.0, 448.0]


# ---------------------------------------------------------------- E2M1

def test_e2m1_decode_is_the_signed_grid():
    codes = np.arange(16, dtype=np.uint8)
    decoded = decode_e2m1(codes)
    assert decoded.dtype == np.float32
    assert decoded[:8].tolist() == list(E2M1_GRID)
    assert decoded[8:].tolist() == [-v for v in E2M1_GRID]
    assert np.signbit(decoded[8]) and not np.signbit(decoded[0])


def test_e2m1_every_code_round_trips():
    codes = np.arange(16, dtype=np.uint8)
    np.testing.assert_array_equal(encode_e2m1(decode_e2m1(codes)), codes)


@pytest.mark.parametrize(
    "value, expected",
    [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),
     (0.2500001, 0.5), (4.9999995, 4.0), (5.0000005, 6.0)],
)
def test_e2m1_ties_to_even(value, expected):
    assert decode_e2m1(encode_e2m1(np.float32([value])))[0] == expected
    negative = decode_e2m1(encode_e2m1(np.float32([-value])))[0]
    assert negative == -expected and np.signbit(negative)


def test_e2m1_encode_matches_grid_search_on_random_values():
    rng = np.random.default_rng(2)
    values = np.concatenate([random_float32(rng, 20000, -4, 5), np.float32(rng.uniform(-7, 7, 20000))])
    np.testing.assert_array_equal(encode_e2m1(values), nearest_even_codes(values, E2M1_POSITIVE, 0x8))


def test_e2m1_saturation_and_signed_zero():
    values = np.array([6.0, 7.0, 1e6, np.inf, -1e6, -np.inf, -0.0, 0.0, -0.1], dtype=np.float32)
    assert encode_e2m1(values).tolist() == [7, 7, 7, 7, 15, 15, 8, 0, 8]


def test_e2m1_nan_is_refused():
    with pytest.raises(ValueError, match="NaN"):
        encode_e2m1(np.float32([1.0, np.nan]))


def test_e2m1_decode_refuses_codes_above_15():
    with pytest.raises(ValueError, match="0..15"):
        decode_e2m1(np.uint8([3, 16]))


# ---------------------------------------------------------------- FP4 packing

def test_pack_fp4_golden_bytes():
    assert pack_fp4(np.uint8([1, 2])).tolist() == [0x21]
    assert pack_fp4(np.uint8([[0xF, 0x0, 0x3, 0xA], [8, 7, 0, 0]])).tolist() == [[0x0F, 0xA3], [0x78, 0x00]]


def test_unpack_fp4_golden_bytes():
    assert unpack_fp4(np.uint8([0x21, 0xA3])).tolist() == [1, 2, 3, 0xA]


def test_pack_unpack_round_trip():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, size=(3, 5, 64), dtype=np.uint8)
    packed = pack_fp4(codes)
    assert packed.shape == (3, 5, 32) and packed.dtype == np.uint8
    np.testing.assert_array_equal(unpack_fp4(packed), codes)
    every_byte = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(pack_fp4(unpack_fp4(every_byte)), every_byte)


def test_pack_fp4_refuses_odd_length_and_wide_codes():
    with pytest.raises(ValueError, match="even"):
        pack_fp4(np.uint8([1, 2, 3]))
    with pytest.raises(ValueError, match="0..15"):
        pack_fp4(np.uint8([1, 16]))


# ---------------------------------------------------------------- E8M0 and BF16

def test_e8m0_bytes_are_exact_powers_of_two():
    values = e8m0_to_float(np.arange(255, dtype=np.uint8))
    assert values.dtype == np.float32
    for b in range(255):
        assert float(values[b]) == math.ldexp(1.0, b - 127)
    assert values[127] == 1.0
    assert values[0] == np.float32(2.0**-127) and values[0] > 0  # a float32 subnormal
    assert values[254] == np.float32(2.0**127)


def test_e8m0_nan_byte_is_nan():
    assert np.isnan(e8m0_to_float(np.uint8([255]))).all()


def bf16_round_from_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even on the float32 bit pattern (finite inputs)."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def test_bf16_round_matches_bit_level_nearest_even():
    rng = np.random.default_rng(4)
    values = rng.integers(0, 2**32, 100000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = values[~np.isnan(values)]
    rounded = bf16_round(values)
    assert rounded.dtype == np.float32
    np.testing.assert_array_equal(rounded, bf16_round_from_bits(values))


def test_bf16_round_ties():
    one_ulp = 2.0**-7  # BF16 spacing at 1.0
    values = np.float32([1 + one_ulp / 2, 1 + 3 * one_ulp / 2, -(1 + one_ulp / 2)])
    assert bf16_round(values).tolist() == [1.0, 1 + 2 * one_ulp, -1.0]

