"""The MX reference: shared-exponent rules checked against independent formulas and properties."""

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ascendconv.formats.constants import E2M1, E2M1_GRID, E4M3, E4M3_NAN_CODES, SCALE_RULES
from ascendconv.formats.elements import decode_e4m3
from ascendconv.formats.mx import dequantize_mx, quantize_mx, shared_exponents
from ascendconv.formats.resolve import resolve_tiles

FORMATS = [E4M3, E2M1]


def float32_exponent_field(value: float) -> int:
    return (struct.unpack("<I", struct.pack("<f", value))[0] >> 23) & 0xFF


def group_sse(values: np.ndarray, dequantized: np.ndarray) -> np.ndarray:
    """Per-group float64 SSE, summed j = 0..31 in order (the mse contract's order)."""
    v = values.reshape(-1, 32).astype(np.float64)
    d = dequantized.reshape(-1, 32).astype(np.float64)
    sse = np.zeros(v.shape[0])
    for j in range(32):
        sse += (v[:, j] - d[:, j]) ** 2
    return sse


def group_amax(values: np.ndarray) -> np.ndarray:
    return np.abs(values.reshape(-1, 32)).max(axis=1).astype(np.float64)


def mixed_magnitudes(rng, rows, k, low_exp=-30, high_exp=30):
    """Gaussian rows whose groups have widely different magnitudes."""
    base = rng.standard_normal((rows, k))
    group_scale = np.ldexp(1.0, rng.integers(low_exp, high_exp, (rows, k // 32)))
    return (base * np.repeat(group_scale, 32, axis=1)).astype(np.float32)


finite_float32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
wide_arrays = arrays(np.float32, st.tuples(st.integers(1, 3), st.sampled_from([32, 64, 96])), elements=finite_float32)
scaled_gaussians = st.builds(
    lambda seed, exp: mixed_magnitudes(np.random.default_rng(seed), 4, 64, exp - 3, exp + 3),
    st.integers(0, 2**32 - 1),
    st.integers(-140, 120),
)


# ---------------------------------------------------------------- floor

@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_floor_exponent_matches_per_element_formula(fmt):
    rng = np.random.default_rng(10)
    values = mixed_magnitudes(rng, 6, 128, -140, 120)
    values[0, :32] = 0.0
    values[1, 32:64] = np.float32(1e-44)  # subnormal group
    exponents = shared_exponents(values, fmt, "floor")
    assert exponents.shape == (6, 4) and exponents.dtype == np.uint8
    for r in range(6):
        for g in range(4):
            fields = [float32_exponent_field(float(v)) for v in values[r, 32 * g:32 * g + 32]]
            assert exponents[r, g] == max(max(fields) - fmt.emax, 0)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_floor_zero_exponent_gives_signed_zeros(fmt):
    rng = np.random.default_rng(11)
    # exponent field 1..emax: E clamps to 0 although the values are not zero.
    tiny = np.ldexp(rng.uniform(1, 2, (2, 32)), rng.integers(-126, -126 + fmt.emax, (2, 32)))
    values = (tiny * rng.choice([-1, 1], (2, 32))).astype(np.float32)
    values[0, 0] = -0.0
    codes, scales = quantize_mx(values, fmt, "floor")
    assert scales.tolist() == [[0], [0]]
    assert codes.tolist() == np.where(np.signbit(values), fmt.sign_bit, 0).tolist()
    dequantized = dequantize_mx(codes, scales, fmt)
    assert (dequantized == 0).all()
    np.testing.assert_array_equal(np.signbit(dequantized), np.signbit(values))


def test_floor_saturates_large_mantissas():
    # 120 = 1.875 * 2**6: floor picks the scale 2**-2, 120 * 4 = 480 saturates to 448 -> 112.
    values = np.zeros((1, 32), np.float32)
    values[0, 0] = 120.0
    codes, scales = quantize_mx(values, E4M3, "floor")
    assert scales[0, 0] == 127 + 6 - 8
    assert dequantize_mx(codes, scales, E4M3)[0, 0] == 112.0
    codes, scales = quantize_mx(values, E2M1, "floor")  # 120 = 1.875 * 2**6 > 1.5 * 2**6
    assert dequantize_mx(codes, scales, E2M1)[0, 0] == 96.0


# ---------------------------------------------------------------- rceil

def assert_rceil_minimal(values, exponents, fmt):
    for amax, e in zip(group_amax(values), exponents.reshape(-1).tolist()):
        assert amax <= fmt.max_value * math.ldexp(1.0, e - 127)
        assert e == 0 or amax > fmt.max_value * math.ldexp(1.0, e - 128)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_rceil_is_the_smallest_sufficient_exponent(fmt):
    rng = np.random.default_rng(12)
    values = mixed_magnitudes(rng, 8, 256, -150, 125)
    assert_rceil_minimal(values, shared_exponents(values, fmt, "rceil"), fmt)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_rceil_at_exact_boundaries(fmt):
    # Group maxima max_value * 2**k exactly, and the float32 neighbours on either side.
    rng = np.random.default_rng(15)
    exact = np.array([fmt.max_value * 2.0**k for k in range(-140, 128)])
    exact = exact[(exact >= 2.0**-149) & (exact <= np.finfo(np.float32).max)].astype(np.float32)
    maxima = np.concatenate([exact, np.nextafter(exact, np.float32(np.inf)), np.nextafter(exact, np.float32(0))])
    values = (rng.uniform(-1, 1, (maxima.size, 32)) * maxima[:, None]).astype(np.float32)
    values[np.arange(maxima.size), rng.integers(0, 32, maxima.size)] = maxima * rng.choice([-1, 1], maxima.size)
    assert_rceil_minimal(values, shared_exponents(values, fmt, "rceil"), fmt)


@pytest.mark.parametrize(
    "fmt, amax, expected",
    [(E4M3, 448.0, 127), (E4M3, float(np.nextafter(np.float32(448), np.float32(1e9))), 128),
     (E4M3, 1.0, 119), (E4M3, 0.0, 0), (E4M3, 3.4e38, 247),
     (E2M1, 6.0, 127), (E2M1, float(np.nextafter(np.float32(6), np.float32(1e9))), 128),
     (E2M1, 3.0, 126), (E2M1, 1e-45, 0)],
)
def test_rceil_golden_exponents(fmt, amax, expected):
    values = np.zeros((1, 32), np.float32)
    values[0, 5] = -amax
    assert shared_exponents(values, fmt, "rceil")[0, 0] == expected


@given(wide_arrays, st.sampled_from(FORMATS))
@settings(max_examples=150, deadline=None, database=None)
def test_rceil_minimal_and_never_saturates_property(values, fmt):
    codes, scales = quantize_mx(values, fmt, "rceil")
    assert_rceil_minimal(values, scales, fmt)
    # Never saturates: every scaled value already fits in +-max_value before clamping.
    scaled = values.astype(np.float64).reshape(-1, 32) * np.ldexp(1.0, 127 - scales.reshape(-1, 1).astype(np.int64))
    assert (np.abs(scaled) <= fmt.max_value).all()


# ---------------------------------------------------------------- mse

def assert_mse_never_worse(values, fmt):
    sse = {}
    for rule in SCALE_RULES:
        codes, scales = quantize_mx(values, fmt, rule)
        with np.errstate(over="ignore"):  # rceil near float32 max: see RCEIL_FLOAT32_LIMIT
            sse[rule] = group_sse(values, dequantize_mx(codes, scales, fmt))
    assert (sse["mse"] <= sse["floor"]).all()
    assert (sse["mse"] <= sse["rceil"]).all()
    floor_e = shared_exponents(values, fmt, "floor").astype(int)
    mse_e = shared_exponents(values, fmt, "mse").astype(int)
    assert np.isin(mse_e - floor_e, [0, 1]).all()


@given(wide_arrays, st.sampled_from(FORMATS))
@settings(max_examples=150, deadline=None, database=None)
def test_mse_never_worse_than_floor_or_rceil_on_any_group(values, fmt):
    assert_mse_never_worse(values, fmt)


@given(scaled_gaussians, st.sampled_from(FORMATS))
@settings(max_examples=100, deadline=None, database=None)
def test_mse_never_worse_on_gaussian_groups(values, fmt):
    assert_mse_never_worse(values, fmt)


def test_mse_ties_go_to_floor():
    # Every value is exactly representable at both E_floor and E_floor + 1: both SSEs are 0.
    values = np.zeros((1, 32), np.float32)
    values[0, 0] = 2.0
    values[0, 1] = 1.0
    for fmt in FORMATS:
        assert shared_exponents(values, fmt, "mse")[0, 0] == shared_exponents(values, fmt, "floor")[0, 0]


def test_mse_picks_the_higher_exponent_when_floor_saturates():
    values = np.zeros((1, 32), np.float32)
    values[0, 0] = 120.0  # saturates to 112 under floor, exact at E_floor + 1
    codes, scales = quantize_mx(values, E4M3, "mse")
    assert scales[0, 0] == shared_exponents(values, E4M3, "floor")[0, 0] + 1
    assert dequantize_mx(codes, scales, E4M3)[0, 0] == 120.0


# ---------------------------------------------------------------- losslessness on power-of-two sources

def power_of_two_source(seed, dtype="bf16"):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, (256, 512), dtype=np.uint8)
    codes[np.isin(codes, E4M3_NAN_CODES)] = 0
    tile_scales = np.ldexp(np.float32(1.0), rng.integers(-40, 10, (2, 4))).astype(np.float32)
    return resolve_tiles(codes, tile_scales, (128, 128), dtype)


@pytest.mark.parametrize("rule", ["rceil", "mse"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_mxfp8_rceil_and_mse_are_lossless_on_power_of_two_sources(rule, dtype):
    values = power_of_two_source(20, dtype)
    codes, scales = quantize_mx(values, E4M3, rule)
    np.testing.assert_array_equal(dequantize_mx(codes, scales, E4M3), values)


def test_mxfp8_floor_is_not_lossless_on_power_of_two_sources():
    # A group maximum like 1.875 * 2**k lands on 480 under the floor scale and saturates to 448.
    values = power_of_two_source(20)
    codes, scales = quantize_mx(values, E4M3, "floor")
    assert (dequantize_mx(codes, scales, E4M3) != values).any()


# ---------------------------------------------------------------- element encoding and output bytes

def reference_group_codes(values, exponents, fmt):
    """Element codes from float64 arithmetic and grid search, independent of the module."""
    if fmt == E4M3:
        grid = np.array([float(decode_e4m3(np.uint8([c]))[0]) for c in range(0x7F)])
    else:
        grid = np.array(E2M1_GRID)
    v = values.reshape(-1, 32).astype(np.float64)
    y = v * np.ldexp(1.0, 127 - exponents.reshape(-1, 1).astype(np.int64))
    magnitude = np.minimum(np.abs(y), fmt.max_value)
    distance = np.abs(magnitude[..., None] - grid)
    best = distance.min(axis=-1, keepdims=True)
    candidates = distance == best
    # Ties: the even index (the grid index is the magnitude code).
    even_tie = candidates & (np.arange(len(grid)) % 2 == 0)
    index = np.where(candidates.sum(-1) > 1, even_tie.argmax(-1), candidates.argmax(-1))
    return np.where(np.signbit(v), index | fmt.sign_bit, index).astype(np.uint8).reshape(values.shape)


@pytest.mark.parametrize("rule", SCALE_RULES)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_codes_match_float64_reference(fmt, rule):
    values = mixed_magnitudes(np.random.default_rng(13), 4, 128, -20, 20)
    codes, scales = quantize_mx(values, fmt, rule)
    np.testing.assert_array_equal(scales, shared_exponents(values, fmt, rule))
    np.testing.assert_array_equal(codes, reference_group_codes(values, scales, fmt))


@given(wide_arrays, st.sampled_from(FORMATS), st.sampled_from(SCALE_RULES))
@settings(max_examples=150, deadline=None, database=None)
def test_outputs_are_always_valid_bytes(values, fmt, rule):
    codes, scales = quantize_mx(values, fmt, rule)
    assert codes.shape == values.shape and codes.dtype == np.uint8
    assert scales.shape == (values.shape[0], values.shape[1] // 32) and scales.dtype == np.uint8
    assert (scales != 255).all()
    if fmt == E4M3:
        assert not np.isin(codes, E4M3_NAN_CODES).any()
    else:
        assert (codes <= 15).all()
    if rule != "rceil" or group_amax(values).max() < RCEIL_FLOAT32_LIMIT:
        assert np.isfinite(dequantize_mx(codes, scales, fmt)).all()


# Above 1.75 * 2**127 (E2M1; 1.875 * 2**127 for E4M3) rceil's largest element rounds up to a
# value whose dequantization, 2**128, is beyond float32: the bytes are valid, float32 is not.
RCEIL_FLOAT32_LIMIT = 1.75 * 2.0**127


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_rceil_near_float32_max_dequantizes_to_inf(fmt):
    values = np.full((1, 32), np.finfo(np.float32).max, np.float32)
    codes, scales = quantize_mx(values, fmt, "rceil")
    assert (scales != 255).all()
    with np.errstate(over="ignore"):
        assert np.isinf(dequantize_mx(codes, scales, fmt)).all()
    for rule in ("floor", "mse"):  # floor saturates instead; mse sees an infinite error at E_floor + 1
        codes, scales = quantize_mx(values, fmt, rule)
        assert np.isfinite(dequantize_mx(codes, scales, fmt)).all()


@pytest.mark.parametrize("rule", SCALE_RULES)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_extreme_magnitudes(fmt, rule):
    values = np.zeros((1, 64), np.float32)
    values[0, :32] = np.float32(1.5 * 2.0**127)
    values[0, 31] = -np.float32(1.5 * 2.0**127)
    values[0, 32:] = np.float32(1e-45)  # smallest subnormal
    codes, scales = quantize_mx(values, fmt, rule)
    assert (scales != 255).all()
    dequantized = dequantize_mx(codes, scales, fmt)
    assert np.isfinite(dequantized).all()
    assert dequantized[0, 0] > 0 and dequantized[0, 31] < 0


def test_leading_dimensions_are_kept():
    values = mixed_magnitudes(np.random.default_rng(14), 6, 64).reshape(2, 3, 64)
    codes, scales = quantize_mx(values, E4M3, "rceil")
    assert codes.shape == (2, 3, 64) and scales.shape == (2, 3, 2)
    flat_codes, flat_scales = quantize_mx(values.reshape(6, 64), E4M3, "rceil")
    np.testing.assert_array_equal(codes.reshape(6, 64), flat_codes)
    np.testing.assert_array_equal(dequantize_mx(codes, scales, E4M3).reshape(6, 64),
                                  dequantize_mx(flat_codes, flat_scales, E4M3))


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("function", [quantize_mx, shared_exponents])
def test_k_not_multiple_of_32_raises(function):
    with pytest.raises(ValueError, match="32"):
        function(np.zeros((2, 48), np.float32), E4M3, "floor")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("rule", SCALE_RULES)
def test_non_finite_input_raises(bad, rule):
    values = np.ones((2, 64), np.float32)
    values[1, 40] = bad
    with pytest.raises(ValueError, match="non-finite"):
        quantize_mx(values, E2M1, rule)


def test_unknown_rule_and_float64_input_raise():
    with pytest.raises(ValueError, match="rule"):
        quantize_mx(np.zeros((1, 32), np.float32), E4M3, "round")
    with pytest.raises(TypeError, match="float32"):
        quantize_mx(np.zeros((1, 32)), E4M3, "floor")


def test_dequantize_checks_scale_shape_and_maps_nan_byte():
    codes = np.zeros((2, 64), np.uint8)
    with pytest.raises(ValueError, match="scales shape"):
        dequantize_mx(codes, np.zeros((2, 3), np.uint8), E4M3)
    scales = np.full((2, 2), 127, np.uint8)
    scales[1, 1] = 255
    dequantized = dequantize_mx(codes, scales, E4M3)
    assert np.isnan(dequantized[1, 32:]).all() and (dequantized[0] == 0).all()
