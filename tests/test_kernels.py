"""The numba kernels against the numpy reference (requantize.py), bit for bit.

Every comparison is byte equality of the payload and the scale bytes (or of the BF16 bits), on
random and adversarial inputs: rounding ties, saturating groups, all-zero groups, signed zeros,
subnormal E4M3 codes, ragged edge tiles, F32 and BF16 scales, K-side block sizes that are not a
multiple of 32, row offsets, every rule, both element formats and both resolve dtypes; both the
table path (with AVX2 and with scalar lookups) and the direct per-element path of the kernel
are checked.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from numba import njit

from ascendconv import kernels
from ascendconv.formats import elements, mx, requantize, resolve
from ascendconv.formats.metrics import ErrorAccumulator
from conftest import FIXTURES, file_digest
from ascendconv.formats.constants import E2M1, E4M3, SCALE_RULES

FORMATS = [E4M3, E2M1]
RESOLVE = ["bf16", "fp32"]
NAN_CODES = (0x7F, 0xFF)
FINITE_CODES = np.array([c for c in range(256) if c not in NAN_CODES], dtype=np.uint8)
PATHS = ("auto", "scalar", "direct")  # tables with vector lookups, tables with scalar lookups, per element
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same(codes, scale, block, row_offset, resolve_dtype, fmt, rule, paths=PATHS):
    """Kernel (on every path) and reference agree byte for byte, or raise the same error."""
    try:
        expected = requantize.requantize_rows(codes, scale, block, row_offset, resolve_dtype, fmt, rule)
    except ValueError as exc:
        for path in paths:
            with pytest.raises(ValueError) as raised:
                kernels.requantize_rows(codes, scale, block, row_offset, resolve_dtype, fmt, rule, _path=path)
            assert str(raised.value) == str(exc)
        return
    for path in paths:
        payload, scales = kernels.requantize_rows(codes, scale, block, row_offset, resolve_dtype, fmt, rule, _path=path)
        assert payload.dtype == np.uint8 and scales.dtype == np.uint8
        assert payload.shape == expected[0].shape and scales.shape == expected[1].shape
        where = f"fmt={fmt.name} rule={rule} resolve={resolve_dtype} block={block} offset={row_offset} path={path}"
        bad_scales = np.argwhere(scales != expected[1])
        assert bad_scales.size == 0, f"{where}: scale bytes differ first at {bad_scales[0].tolist()}"
        bad = np.argwhere(payload != expected[0])
        assert bad.size == 0, f"{where}: payload differs first at {bad[0].tolist()}"


def scale_shape(rows, k, block, row_offset):
    return -(-(row_offset + rows) // block[0]), -(-k // block[1])


# --- scalar encoders against ml_dtypes ------------------------------------------------------


@njit
def _encode_all(values, fmt):
    out = np.empty(values.shape[0], dtype=np.uint8)
    for i in range(values.shape[0]):
        out[i] = kernels._encode_e4m3(values[i]) if fmt == 0 else kernels._encode_e2m1(values[i])
    return out


@njit
def _bf16_all(values):
    out = np.empty(values.shape[0], dtype=np.float32)
    for i in range(values.shape[0]):
        out[i] = kernels._bf16_round(values[i])
    return out


def rounding_probes() -> np.ndarray:
    """float32 values around every rounding boundary of E4M3, E2M1 and BF16: for each exponent
    in range and each of the top 10 mantissa bits, the low bits at 0, 1, half - 1, half, half + 1
    and all ones (half = the tie of each format's rounding), both signs, plus zeros and extremes."""
    exponents = np.arange(90, 140, dtype=np.uint32)  # 2**-37 .. 2**12: subnormal outputs to saturation
    tops = np.arange(1024, dtype=np.uint32) << np.uint32(13)
    lows = np.array(
        [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1FFF, 0x0FFF, 0x1000, 0x1001, 0x7FFFF, 0x80000, 0x80001]
        + [0x3FFFFF, 0x400000, 0x400001, 0x1FFFFF, 0x200000, 0x200001],
        dtype=np.uint32,
    )
    lows = lows & np.uint32(0x7FFFFF)
    bits = (exponents[:, None, None] << np.uint32(23)) | tops[None, :, None] | lows[None, None, :]
    bits = np.concatenate([bits.ravel(), np.arange(0, 1 << 16, dtype=np.uint32)])  # float32 subnormals
    values = bits.view(np.float32)
    extremes = np.array([0.0, 448.0, 464.0, 464.00003, 480.0, 6.0, 7.0, 1e30, 3.4028235e38], dtype=np.float32)
    values = np.concatenate([values, extremes])
    return np.concatenate([values, -values])


def test_encoders_match_ml_dtypes():
    values = rounding_probes()
    e4m3 = np.clip(values, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(_encode_all(values, 0), e4m3)
    e2m1 = np.clip(values, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    np.testing.assert_array_equal(_encode_all(values, 1), e2m1)


def test_bf16_rounding_matches_ml_dtypes():
    values = rounding_probes()
    values = np.concatenate([values, np.array([np.inf, -np.inf, np.nan, -np.nan], dtype=np.float32)])
    expected = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(_bf16_all(values).view(np.uint32), expected.view(np.uint32))


# --- exhaustive over the 256 source codes -------------------------------------------------------

SPECIAL_SCALES = [
    1.0,
    2.0**-20,
    2.0**-9,
    3.0,
    0.375,
    1.0625,  # E4M3 ties: 1 * 17/16 lies halfway between 1 and 1.125
    1.0 + 2.0**-8,  # BF16 ties
    1.5 * 2.0**-7,
    0.123456789,
    -0.0071,  # negative scales flip every sign
    0.0,
    -0.0,
    2.0**-126,  # resolved values in float32 subnormals
    1.1e-40,
    2.0**-149,
    7.5e35,  # near the float32 range: 448 * s stays finite
    1e-3,
]


def exhaustive_codes(rng) -> np.ndarray:
    """[R, 128*32] codes: for every group maximum m in 0..126 a group holding m (with a random sign)
    and smaller magnitudes; rows also hold every finite code, all-zero and signed-zero groups."""
    groups = []
    for m in range(127):
        mags = rng.integers(0, m + 1, 32)
        mags[rng.integers(0, 32)] = m
        groups.append((mags | (rng.integers(0, 2, 32) << 7)).astype(np.uint8))
    groups.append(np.zeros(32, np.uint8))
    rows = [np.concatenate(groups)]
    every = np.resize(FINITE_CODES, rows[0].size)
    rows.append(every)
    rows.append(np.where(rng.integers(0, 2, rows[0].size) == 1, 0x80, 0x00).astype(np.uint8))
    rows.append(rng.choice(FINITE_CODES, rows[0].size))
    return np.stack(rows)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("rule", SCALE_RULES)
def test_every_code_at_special_scales(fmt, rule):
    rng = np.random.default_rng(1)
    codes = exhaustive_codes(rng)
    k = codes.shape[1]
    for s in SPECIAL_SCALES:
        scale = np.full((1, k // 128), s, dtype=np.float32)
        for resolve_dtype in RESOLVE:
            assert_same(codes, scale, (128, 128), 0, resolve_dtype, fmt, rule)
    # one tile per group maximum and per scale: every (scale, maximum) pair in one call
    scale = np.array(SPECIAL_SCALES * 2, dtype=np.float32)[: k // 128][None, :]
    for resolve_dtype in RESOLVE:
        assert_same(codes, scale, (128, 128), 0, resolve_dtype, fmt, rule)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("rule", SCALE_RULES)
def test_every_code_over_a_range_of_scales(fmt, rule):
    """Each tile (32 wide) holds one group per row; scales sweep 2**-140 .. 2**118 with mantissas
    of all kinds, so that every E, saturation and subnormal corner is reached."""
    rng = np.random.default_rng(2)
    mantissas = np.array([1.0, 1.0625, 1.5, 1.75, 1.875, 1.99, 1 + 2**-8, 1.3333], dtype=np.float64)
    exps = np.arange(-140, 119, 6)
    scales = (mantissas[:, None] * np.ldexp(1.0, exps)[None, :]).astype(np.float32).ravel()
    codes = np.stack([rng.permutation(np.resize(FINITE_CODES, scales.size * 32)) for _ in range(8)])
    codes[0, ::32] = 0x7E  # saturating maxima
    codes[1, : 32 * 3] = 0x80
    scale = scales[None, :]
    for resolve_dtype in RESOLVE:
        assert_same(codes, scale, (8, 32), 0, resolve_dtype, fmt, rule)


# --- properties on random and adversarial inputs -----------------------------------------------

BLOCKS = [(128, 128), (16, 32), (8, 64), (4, 96), (128, 48), (64, 80), (3, 16), (5, 40), (1, 1024), (7, 200)]


def scale_values(rng, shape, kind: str) -> np.ndarray:
    if kind == "lognormal":
        s = rng.lognormal(-7, 3, shape)
    elif kind == "pow2":
        s = np.ldexp(1.0, rng.integers(-30, 10, shape))
    elif kind == "ties":
        s = rng.choice([1.0625, 1.5, 1.0 + 2**-8, 1.0 + 3 * 2**-9, 1.25, 1.125], shape) * np.ldexp(
            1.0, rng.integers(-20, 4, shape)
        )
    elif kind == "mixed":
        s = rng.choice(SPECIAL_SCALES, shape) * rng.choice([1.0, 2.0**-5, 2.0**7], shape)
    else:  # "wide"
        s = np.ldexp(rng.uniform(1, 2, shape), rng.integers(-150, 110, shape))
    s = s * rng.choice([1.0, 1.0, 1.0, -1.0], shape)
    return s.astype(np.float32)


def code_rows(rng, rows, k, kind: str) -> np.ndarray:
    if kind == "uniform":
        codes = rng.choice(FINITE_CODES, (rows, k))
    elif kind == "gaussian":  # quantized N(0, 1) tiles: magnitudes cluster below the tile max
        w = rng.standard_normal((rows, k)) * rng.uniform(20, 160)
        codes = np.clip(w, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    elif kind == "small":  # subnormal E4M3 codes and zeros
        codes = rng.integers(0, 9, (rows, k)) | (rng.integers(0, 2, (rows, k)) << 7)
    elif kind == "zeros":
        codes = np.where(rng.random((rows, k)) < 0.5, 0x80, 0x00)
    else:  # "groups": every group its own character
        codes = rng.choice(FINITE_CODES, (rows, k))
        per_group = codes.reshape(rows, -1, 32)
        choice = rng.integers(0, 5, per_group.shape[:2])
        per_group[choice == 0] = 0
        per_group[choice == 1] &= 0x87
        per_group[choice == 2, :] = (per_group[choice == 2, :] & 0x80) | 0x7E  # saturating maxima
        per_group[choice == 3, :] = (per_group[choice == 3, :] & 0x80) | rng.integers(0x70, 0x7F)
    return np.asarray(codes, dtype=np.uint8)


inputs = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "rows": st.integers(1, 40),
        "groups": st.integers(1, 9),
        "block": st.sampled_from(BLOCKS),
        "row_offset": st.sampled_from([0, 0, 1, 5, 127, 130]),
        "codes": st.sampled_from(["uniform", "gaussian", "small", "zeros", "groups"]),
        "scales": st.sampled_from(["lognormal", "pow2", "ties", "mixed", "wide"]),
        "scale_dtype": st.sampled_from(["f32", "bf16-valued", "bf16"]),
        "fmt": st.sampled_from(FORMATS),
        "rule": st.sampled_from(SCALE_RULES),
        "resolve": st.sampled_from(RESOLVE),
    }
)


def build(case):
    rng = np.random.default_rng(case["seed"])
    k = 32 * case["groups"]
    codes = code_rows(rng, case["rows"], k, case["codes"])
    scale = scale_values(rng, scale_shape(case["rows"], k, case["block"], case["row_offset"]), case["scales"])
    if case["scale_dtype"] != "f32":
        scale = scale.astype(ml_dtypes.bfloat16)
        if case["scale_dtype"] == "bf16-valued":
            scale = scale.astype(np.float32)
    return codes, scale


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@PROPERTY
@given(inputs)
def test_kernel_equals_reference(case):
    codes, scale = build(case)
    args = (codes, scale, case["block"], case["row_offset"], case["resolve"], case["fmt"], case["rule"])
    assert_same(*args)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@PROPERTY
@given(inputs)
def test_resolve_bf16_equals_reference(case):
    codes, scale = build(case)
    if case["seed"] % 3 == 0:  # a NaN code: both refuse the rows, with the reference's error
        codes.flat[case["seed"] % codes.size] = NAN_CODES[case["seed"] % 2]
    args = (codes, scale, case["block"], case["row_offset"])
    try:
        expected = requantize.resolve_rows_bf16(*args)
    except ValueError as exc:
        with pytest.raises(ValueError) as raised:
            kernels.resolve_rows_bf16(*args)
        assert str(raised.value) == str(exc)
        return
    got = kernels.resolve_rows_bf16(*args)
    assert got.dtype == expected.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_resolve_bf16_refuses_values_past_bf16_as_the_mx_path_does():
    """448 x 7.595e35 = 3.4014e38 is a float32 but past BF16's largest value (3.3895e38, rounding
    to inf from 3.3961e38): the FLOAT resolve refuses the rows as requantize_rows does, instead of
    writing +/-inf BF16; the rows below the overflow, and 3.3895e38 itself, resolve as before."""
    codes = np.full((3, 64), 0x38, np.uint8)  # 1.0
    codes[1, 5], codes[2, 7] = 0x7E, 0xFE  # +-448
    scale = np.full((1, 1), 7.595e35, np.float32)
    assert np.isinf(elements.bf16_round(np.float32(448) * scale)).all()
    for impl in (requantize, kernels):
        with pytest.raises(ValueError, match=r"^non-finite resolved BF16 values: NaN/Inf count 2$"):
            impl.resolve_rows_bf16(codes, scale, (128, 128), 0)
        with pytest.raises(ValueError, match=r"^non-finite"):
            impl.requantize_rows(codes, scale, (128, 128), 0, "bf16", E4M3, "mse")
        finite = impl.resolve_rows_bf16(codes[:1], scale, (128, 128), 0)
        assert finite.view(np.uint16).tolist() == [[0x7B12] * 64]  # BF16 of 7.595e35
        largest = impl.resolve_rows_bf16(codes[1:2, :8], np.full((1, 1), 3.3895e38 / 448, np.float32), (128, 128), 0)
        assert largest.view(np.uint16)[0, 5] == 0x7F7F  # BF16's largest finite value


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@PROPERTY
@given(inputs)
@example(  # rceil dequantizes a huge group maximum to inf: SQNR -inf, max |err| inf
    dict(seed=3, rows=3, groups=5, block=(128, 128), row_offset=0, codes="uniform", scales="mixed",
         scale_dtype="f32", fmt=E4M3, rule="rceil", resolve="bf16")
)
def test_error_sums_equal_the_error_accumulator(case):
    """kernels.error_sums (verify --exact-full) sums what metrics.ErrorAccumulator sums over the
    reference's resolve and dequantize: sums to float64 rounding, maximum and saturation exactly."""
    codes, scale = build(case)
    args = (codes, scale, case["block"], case["row_offset"], case["resolve"], case["fmt"], case["rule"])
    try:
        payload, scales = requantize.requantize_rows(*args)
    except ValueError:
        return  # NaN / overflow: no package to measure
    fp4 = case["fmt"] is E2M1
    element_codes = elements.unpack_fp4(payload) if fp4 else payload
    reference = resolve.resolve_tiles(codes, scale, case["block"], case["resolve"], row_offset=case["row_offset"])
    expected = ErrorAccumulator()
    with np.errstate(over="ignore", invalid="ignore"):
        expected.update(reference, mx.dequantize_mx(element_codes, scales, case["fmt"]), element_codes, case["fmt"])
    want = expected.result()
    sums = kernels.error_sums(codes, scale, case["block"], case["row_offset"], case["resolve"], case["fmt"], payload, scales)
    got = ErrorAccumulator()
    got.add_sums(*sums[:3], codes.size, sums[3])
    got = got.result()
    assert got.max_abs == want.max_abs or (math.isnan(got.max_abs) and math.isnan(want.max_abs))
    assert got.saturated_fraction == want.saturated_fraction and got.count == want.count
    for a, b in ((got.rel_l2, want.rel_l2), (got.sqnr_db, want.sqnr_db)):
        assert a == pytest.approx(b, rel=1e-9, nan_ok=True)


def test_error_sums_of_a_nan_scale_byte_are_nan():
    codes = np.full((4, 64), 0x38, np.uint8)
    scale = np.ones((1, 1), np.float32)
    payload, scales = kernels.requantize_rows(codes, scale, (128, 128), 0, "bf16", E4M3, "floor")
    scales[2, 1] = 255
    ref_sq, err_sq, max_abs, saturated = kernels.error_sums(codes, scale, (128, 128), 0, "bf16", E4M3, payload, scales)
    assert ref_sq == 256.0 and math.isnan(err_sq) and math.isnan(max_abs) and saturated == 0


def test_mse_ties_in_saturating_groups_stay_at_floor():
    """Saturating E2M1 groups whose two sums of squared error are exactly equal (found by a
    subset-sum search over per-code error differences at scale 1.09375): mse keeps E_floor. Five
    such groups in a row exercise both the four-group interleaved sums and the single-group ones."""
    cases = [(125, 107), (117, 99), (109, 91), (101, 83)]
    codes = np.zeros((2, 32 * 5), np.uint8)
    for g in range(5):
        top, other = cases[g % 4]
        codes[0, 32 * g : 32 * g + 3] = (top, other, other)
        codes[1, 32 * g : 32 * g + 3] = (top | 0x80, other, other | 0x80)
    scale = np.full((1, 5), 1.09375, np.float32)
    values = requantize.resolve.resolve_tiles(codes, scale, (2, 32), "bf16").reshape(2, 5, 32)
    low = requantize.mx._floor_exponents(values, E2M1)
    high = low + 1
    sse = [
        requantize.mx._sequential_sse(
            values, requantize.mx._decode_groups(requantize.mx._encode_groups(values, e, E2M1), e, E2M1)
        )
        for e in (low, high)
    ]
    assert (sse[0] == sse[1]).all() and (sse[0] > 0).all()  # genuine ties
    for resolve_dtype in RESOLVE:
        assert_same(codes, scale, (2, 32), 0, resolve_dtype, E2M1, "mse")
        assert_same(codes, np.tile(scale, (2, 1)), (1, 32), 0, resolve_dtype, E2M1, "mse")
        _, scales = requantize.requantize_rows(codes, scale, (2, 32), 0, resolve_dtype, E2M1, "mse")
        assert (scales == low.astype(np.uint8)).all()


def test_real_sized_tiles_with_ragged_edges():
    """576 x 1408 (5 x 11 tiles of 128, the last row of tiles cropped to 64) in row chunks."""
    rng = np.random.default_rng(3)
    n, k = 576, 1408
    codes = code_rows(rng, n, k, "gaussian")
    scale = scale_values(rng, (5, 11), "lognormal")
    for fmt in FORMATS:
        for rule in SCALE_RULES:
            for start, stop in [(0, 576), (0, 200), (200, 576), (512, 576)]:
                assert_same(codes[start:stop], scale, (128, 128), start, "bf16", fmt, rule)


def test_table_slots_grow_when_a_tile_row_needs_many():
    """A kernel call that runs out of table slots starts over with more (here from 2 slots)."""
    rng = np.random.default_rng(8)
    codes = code_rows(rng, 64, 1024, "groups")
    scale = scale_values(rng, (1, 32), "wide")
    expected = requantize.requantize_rows(codes, scale, (64, 32), 0, "bf16", E4M3, "mse")
    tiny = (64, 2, np.empty(2 * 256, np.uint8), np.empty(2 * 512, np.float64), np.zeros(512 * 64 + 3, np.int64))
    kernels._THREAD.scratch = tiny + (np.empty(128 * 64, np.int64), np.empty(256 * 64, np.float32))
    payload, scales = kernels.requantize_rows(codes, scale, (64, 32), 0, "bf16", E4M3, "mse")
    assert kernels._THREAD.scratch[1] > 2
    np.testing.assert_array_equal(payload, expected[0])
    np.testing.assert_array_equal(scales, expected[1])


def test_threads_share_nothing():
    """Worker threads each keep their own scratch: concurrent calls give the reference's bytes."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(9)
    cases = []
    for i in range(12):
        codes = code_rows(rng, 130, 32 * (4 + i), ["gaussian", "groups", "uniform"][i % 3])
        scale = scale_values(rng, scale_shape(130, codes.shape[1], (128, 128), 0), "lognormal")
        fmt, rule = FORMATS[i % 2], SCALE_RULES[i % 3]
        expected = requantize.requantize_rows(codes, scale, (128, 128), 0, "bf16", fmt, rule)
        cases.append((codes, scale, fmt, rule, expected))

    def run(case):
        return kernels.requantize_rows(case[0], case[1], (128, 128), 0, "bf16", case[2], case[3])

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, cases * 3))
    for (codes, scale, fmt, rule, expected), got in zip(cases * 3, results):
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])


def test_out_arrays_receive_the_result():
    rng = np.random.default_rng(7)
    codes = code_rows(rng, 40, 256, "gaussian")
    scale = scale_values(rng, (1, 2), "lognormal")
    for fmt in FORMATS:
        expected = requantize.requantize_rows(codes, scale, (128, 128), 0, "bf16", fmt, "mse")
        out = np.full(expected[0].shape, 0xAA, np.uint8)
        payload, scales = kernels.requantize_rows(codes, scale, (128, 128), 0, "bf16", fmt, "mse", out=out)
        assert np.shares_memory(payload, out)
        np.testing.assert_array_equal(out, expected[0])
        np.testing.assert_array_equal(scales, expected[1])
        with pytest.raises(ValueError):
            kernels.requantize_rows(codes, scale, (128, 128), 0, "bf16", fmt, "mse", out=out[:, :-1])
        # an odd address: the kernel's word and vector stores are unaligned
        odd = np.full(out.size + 1, 0xAA, np.uint8)[1:].reshape(out.shape)
        payload, _ = kernels.requantize_rows(codes, scale, (128, 128), 0, "bf16", fmt, "mse", out=odd)
        assert np.shares_memory(payload, odd)
        np.testing.assert_array_equal(odd, expected[0])
        payload, _ = kernels.requantize_rows(codes, scale, (128, 128), 0, "bf16", fmt, "mse", out=odd, _path="scalar")
        np.testing.assert_array_equal(payload, expected[0])
    with pytest.raises(ValueError, match="aligned"):  # BF16 elements at an odd address
        kernels.resolve_rows_bf16(codes, scale, (128, 128), 0, out=np.zeros(codes.size * 2 + 1, np.uint8)[1:].view(np.uint16).reshape(codes.shape))
    out = np.zeros(codes.shape, ml_dtypes.bfloat16)
    got = kernels.resolve_rows_bf16(codes, scale, (128, 128), 0, out=out)
    assert np.shares_memory(got, out)
    expected = requantize.resolve_rows_bf16(codes, scale, (128, 128), 0)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_unaligned_and_strided_inputs():
    rng = np.random.default_rng(4)
    base = rng.choice(FINITE_CODES, 65 * 128 + 3)
    codes = base[3:].reshape(65, 128)  # not 8-byte aligned
    strided = rng.choice(FINITE_CODES, (20, 256))[:, ::2]  # not contiguous
    for c in (codes, strided):
        scale = scale_values(rng, scale_shape(c.shape[0], c.shape[1], (128, 128), 0), "lognormal")
        for rule in SCALE_RULES:
            assert_same(c, scale, (128, 128), 0, "bf16", E4M3, rule)
            assert_same(c, scale, (128, 128), 0, "fp32", E2M1, rule)


def test_many_exponents_in_one_tile():
    """Groups of one tile spanning every possible E: the tables of a tile column keep apart."""
    rng = np.random.default_rng(5)
    codes = np.zeros((128, 128), np.uint8)
    for r in range(128):
        for g in range(4):
            m = (r * 4 + g) % 127
            codes[r, g * 32 : g * 32 + 32] = rng.integers(0, m + 1, 32)
            codes[r, g * 32] = m
    for s in (1.0, 2.0**100, 2.0**-120, 0.3):
        scale = np.array([[s]], np.float32)
        for fmt in FORMATS:
            for rule in SCALE_RULES:
                assert_same(codes, scale, (128, 128), 0, "bf16", fmt, rule)


# --- errors: the reference's own ------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("rule", SCALE_RULES)
def test_nan_codes_and_overflow_raise_like_the_reference(rule):
    rng = np.random.default_rng(6)
    codes = rng.choice(FINITE_CODES, (4, 128))
    scale = np.ones((1, 1), np.float32)
    for nan in NAN_CODES:
        bad = codes.copy()
        bad[2, 77] = nan
        assert_same(bad, scale, (128, 128), 0, "bf16", E4M3, rule)
    huge = np.full((1, 1), 3e36, np.float32)  # 448 * 3e36 overflows float32
    bad = codes.copy()
    bad[1, 3] = 0x7E
    assert_same(bad, huge, (128, 128), 0, "fp32", E2M1, rule)
    assert_same(bad, np.full((1, 1), 7.595e35, np.float32), (128, 128), 0, "bf16", E4M3, rule)  # BF16 rounds to inf


def test_invalid_arguments_raise_like_the_reference():
    codes = np.zeros((4, 48), np.uint8)  # K % 32 != 0
    scale = np.ones((1, 1), np.float32)
    for call in (
        lambda m: m.requantize_rows(codes, scale, (128, 128), 0, "bf16", E4M3, "mse"),
        lambda m: m.requantize_rows(codes[:, :32], scale, (128, 128), 0, "bf16", E4M3, "nearest"),
        lambda m: m.requantize_rows(codes[:, :32], scale, (128, 128), 0, "f16", E4M3, "mse"),
        lambda m: m.requantize_rows(codes[:, :32], np.ones((1, 2), np.float32), (128, 128), 0, "bf16", E4M3, "mse"),
    ):
        with pytest.raises(ValueError) as expected:
            call(requantize)
        with pytest.raises(ValueError) as got:
            call(kernels)
        assert str(got.value) == str(expected.value)
    with pytest.raises(TypeError) as expected:  # a float64 scale would round twice: refused
        requantize.requantize_rows(codes[:, :32], scale.astype(np.float64), (128, 128), 0, "bf16", E4M3, "mse")
    with pytest.raises(TypeError) as got:
        kernels.requantize_rows(codes[:, :32], scale.astype(np.float64), (128, 128), 0, "bf16", E4M3, "mse")
    assert str(got.value) == str(expected.value)


# --- first_nan_code ---------------------------------------------------------------------------


@PROPERTY
@given(st.integers(0, 2**32 - 1), st.integers(0, 3))
def test_first_nan_code_agrees(seed, nans):
    rng = np.random.default_rng(seed)
    shape = [(1, 1), (37, 129), (8, 4096), (3, 5, 7), (10000,)][seed % 5]
    codes = rng.choice(FINITE_CODES, shape)
    for _ in range(nans):
        codes.flat[rng.integers(0, codes.size)] = NAN_CODES[rng.integers(0, 2)]
    assert kernels.first_nan_code(codes) == requantize.first_nan_code(codes)


def test_first_nan_code_edges():
    codes = np.zeros((3, 5000), np.uint8)
    assert kernels.first_nan_code(codes) is None
    codes[2, 4999] = 0xFF
    assert kernels.first_nan_code(codes) == (2, 4999)
    codes[0, 4096] = 0x7F
    assert kernels.first_nan_code(codes) == (0, 4096)
    assert kernels.first_nan_code(codes[:, ::2]) == requantize.first_nan_code(codes[:, ::2])


# --- compilation --------------------------------------------------------------------------------


def test_kernels_are_cached_and_release_the_gil():
    entry_points = [kernels.ENTRY_POINTS[name].dispatcher for name in kernels.ENTRY_POINTS]
    for dispatcher in entry_points:
        assert dispatcher.targetoptions.get("nogil") is True
        assert dispatcher._cache.__class__.__name__ != "NullCache"
        assert dispatcher.targetoptions.get("fastmath") in (None, False, set())
    # a fresh interpreter loads the compiled code from the cache instead of compiling it again
    probe = (
        "import ascendconv.kernels as k;"
        "ds = [k.ENTRY_POINTS[n].dispatcher for n in k.ENTRY_POINTS];"
        "print(sum(len(d.stats.cache_hits) for d in ds), sum(len(d.stats.cache_misses) for d in ds))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    hits, misses = map(int, result.stdout.split())
    assert hits == len(kernels.ENTRY_POINTS) and misses == 0


def test_portable_build_runs_the_scalar_lookups(tmp_path):
    """Compiled for a generic CPU (as on an aarch64 host: no AVX2), requantize is the scalar-lookup
    variant, and its bytes are the reference's for both formats and every rule."""
    probe = """
import numpy as np
from ascendconv import kernels
from ascendconv.formats import requantize
from ascendconv.formats.constants import E2M1, E4M3, SCALE_RULES
assert not kernels._AVX2 and kernels._requantize_scalar_kernel is kernels._requantize_kernel
rng = np.random.default_rng(11)
codes = rng.integers(0, 256, (130, 512), dtype=np.uint8)
codes[(codes & 0x7F) == 0x7F] = 0
scale = rng.lognormal(0, 2, (2, 4)).astype(np.float32)
for fmt in (E4M3, E2M1):
    for rule in SCALE_RULES:
        got = kernels.requantize_rows(codes, scale, (128, 128), 0, "bf16", fmt, rule)
        want = requantize.requantize_rows(codes, scale, (128, 128), 0, "bf16", fmt, rule)
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), (fmt.name, rule)
print("same bytes")
"""
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["same", "bytes"]


def test_importing_the_kernels_compiles_nothing(tmp_path):
    """Entry points compile on first use: an import with an empty cache leaves it empty."""
    probe = "import ascendconv.kernels as k; print(sum(e._dispatcher is not None for e in k.ENTRY_POINTS.values()))"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.split() == ["0"]
    assert not any(tmp_path.rglob("*.nbi"))


@pytest.mark.parametrize(
    ("scheme", "fixture", "compiled"),
    [
        ("w4a8-mxfp-moe", "qwen3-moe-fp8", ["requantize"]),
        ("w8a8-mxfp8", "deepseek-v3-fp8", ["requantize", "resolve_bf16"]),
    ],
)
def test_first_run_says_it_compiles_once_and_only_what_it_needs(tmp_path, scheme, fixture, compiled):
    """A fresh numba cache: convert says on stderr that it compiles the kernels and how long it
    took, and compiles only the entry points the plan needs; the next run, and verify --source of
    the package, say nothing."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    argv = [sys.executable, "-m", "ascendconv.cli", "convert", str(FIXTURES / fixture), "--scheme", scheme, "--quiet"]
    first = subprocess.run(argv + [str(tmp_path / "a")], capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    assert lines[0].startswith("compiling the conversion kernels for this machine (once")
    assert re.fullmatch(rf"kernels compiled in \d+\.\d s \({re.escape(', '.join(compiled))}\); later runs .*", lines[1])
    # one compiled kernel, one data file named after it (numba drops the "<>" of "<locals>"); the
    # AVX2 and scalar variants of requantize share a name, so the files are counted, not just named
    cached = [p.name.split("-")[0].removeprefix("kernels.") for p in (tmp_path / "cache").rglob("*.nbc")]
    expected = [kernels.ENTRY_POINTS[n].function.__qualname__.replace("<", "").replace(">", "") for n in compiled]
    assert sorted(n for n in cached if n.endswith("_kernel")) == sorted(expected)
    again = subprocess.run(argv + [str(tmp_path / "b")], capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and again.stderr == ""
    # the README's first command goes on with verify --source: it needs no kernel convert did not
    # (a module unquantized in the source is labeled FLOAT like a resolved one, but needs no kernel)
    verify = [sys.executable, "-m", "ascendconv.cli", "verify", str(tmp_path / "a"), "--source", str(FIXTURES / fixture)]
    checked = subprocess.run(verify + ["--quiet"], capture_output=True, text=True, env=env, timeout=600)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr


# --- the convert pipeline around the kernels ------------------------------------------------------


@pytest.mark.parametrize("scheme", ["w8a8-mxfp8", "w4a8-mxfp-moe"])
def test_pipeline_bytes_do_not_depend_on_io_path_chunking_or_workers(tmp_path, monkeypatch, scheme):
    """Direct I/O with tiny staging buffers, tiny work items, and 1 or 3 workers write the same
    package as the defaults (page-cache writes for these small shards, 16M-element items), and
    every recorded shard digest is the BLAKE3 of the file."""
    import json
    from pathlib import Path

    import ascendconv.pipeline as pipeline
    import ascendconv.io.writer as writer_io
    from ascendconv.convert import ConvertOptions, convert

    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "deepseek-v3-fp8"

    def digests(directory):
        return {p.name: file_digest(p) for p in sorted(directory.iterdir())}

    options = dict(scheme=scheme, scale_rule="mse", max_shard_size=300_000)
    baseline = tmp_path / "baseline"
    convert(fixture, baseline, ConvertOptions(**options))
    expected = digests(baseline)
    monkeypatch.setattr(writer_io, "DIRECT_IO_MIN_BYTES", 0)
    monkeypatch.setattr(writer_io, "_DIRECT_BUFFER_BYTES", 8192)
    monkeypatch.setattr(writer_io, "_DIRECT_BUFFERS", 2)
    monkeypatch.setattr(pipeline, "CHUNK_ELEMENTS", {"numba": 5000, "reference": 5000})
    monkeypatch.setattr(pipeline, "COPY_CHUNK_BYTES", 3000)
    monkeypatch.setattr(pipeline, "PREFETCH_ITEMS", 1)
    for kernel, workers in [("numba", 1), ("numba", 3), ("reference", 2)]:
        out = tmp_path / f"{kernel}-{workers}"
        convert(fixture, out, ConvertOptions(**options, kernel=kernel, workers=workers))
        got = digests(out)
        provenance = json.loads((out / "ascendconv_provenance.json").read_text())
        for name, entry in provenance["shards"].items():
            assert entry["blake3"] == got[name]
        got.pop("ascendconv_provenance.json")
        assert got == {k: v for k, v in expected.items() if k != "ascendconv_provenance.json"}


def test_pipeline_failure_with_direct_io_leaves_nothing(tmp_path, monkeypatch):
    """A NaN code in the last shard's last weight, found while earlier shards are being written
    with direct I/O: the error names it, no package and no partial directory remain, and the
    background threads are gone."""
    import shutil
    import threading
    import time
    from pathlib import Path

    import ascendconv.pipeline as pipeline
    import ascendconv.io.writer as writer_io
    from ascendconv.convert import ConvertOptions, convert
    from ascendconv.errors import NaNCodeError
    from ascendconv.io.safetensors import read_header

    src = tmp_path / "src"
    shutil.copytree(Path(__file__).resolve().parent.parent / "fixtures" / "deepseek-v3-fp8", src)
    shard = sorted(src.glob("model-*.safetensors"))[-1]
    header = read_header(shard)
    weight = max((e for e in header.tensors.values() if e.dtype == "F8_E4M3"), key=lambda e: e.offset)
    raw = bytearray(shard.read_bytes())
    raw[weight.offset + weight.nbytes - 1] = 0xFF
    shard.write_bytes(bytes(raw))
    monkeypatch.setattr(writer_io, "DIRECT_IO_MIN_BYTES", 0)
    monkeypatch.setattr(writer_io, "_DIRECT_BUFFER_BYTES", 8192)
    monkeypatch.setattr(pipeline, "CHUNK_ELEMENTS", {"numba": 5000, "reference": 5000})
    before = threading.active_count()
    out = tmp_path / "out"
    with pytest.raises(NaNCodeError, match=weight.name):
        convert(src, out, ConvertOptions(scheme="w8a8-mxfp8", max_shard_size=200_000, workers=2))
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
    for _ in range(100):  # worker, reader, writer, hash and write threads all finish
        if threading.active_count() <= before:
            break
        time.sleep(0.01)
    assert threading.active_count() <= before


def test_workers_are_capped_at_the_core_count(tmp_path, monkeypatch):
    """--workers 1000 converts with one thread per core: buffers in flight, hence memory, do not
    grow with the option."""
    import ascendconv.pipeline as pipeline
    from ascendconv.convert import ConvertOptions, convert

    seen = []
    real = pipeline.ThreadPoolExecutor

    def recording(max_workers):
        seen.append(max_workers)
        return real(max_workers=max_workers)

    monkeypatch.setattr(pipeline, "ThreadPoolExecutor", recording)
    convert(FIXTURES / "qwen3-dense-fp8", tmp_path / "out", ConvertOptions(workers=1000))
    assert seen == [os.cpu_count()]


# --- float rows (plain BF16 / F16 / F32 sources) -------------------------------------------------


def adversarial_float_rows(seed: int, rows: int = 48, k: int = 512) -> np.ndarray:
    """Random rows of every magnitude, with group maxima placed on and around the bounds where the
    rules' decisions turn: 448 / 464 (E4M3 saturation, mse's shortcut), 6 / 7 (E2M1), ties, float32
    extremes, zeros and subnormals."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((rows, k)) * rng.lognormal(0, 4, (rows, 1))).astype(np.float32)
    edges = np.array([448, 464, np.nextafter(np.float32(464), np.float32(1e9)), 6, 7, 7.0000005, 240, 232, 3.5, 0.25])
    for g in range(0, k, 32):
        row = rng.integers(0, rows)
        values[row, g + rng.integers(0, 32)] = np.float32(rng.choice(edges) * 2.0 ** int(rng.integers(-140, 120)))
    values[0, :32] = 0.0
    values[1, :32] = -0.0
    values[2, :32] = 1e-40
    values[3, :32] = np.float32(3.4e38)
    return values


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fmt", [E4M3, E2M1], ids=["e4m3", "e2m1"])
@pytest.mark.parametrize("rule", ["floor", "rceil", "mse"])
def test_float_rows_kernel_equals_the_reference(seed, fmt, rule):
    values = adversarial_float_rows(seed)
    payload, scales = kernels.quantize_rows(values, fmt, rule)
    want_payload, want_scales = requantize.quantize_rows(values, fmt, rule)
    assert payload.tobytes() == want_payload.tobytes() and scales.tobytes() == want_scales.tobytes()
    out = np.empty_like(want_payload)
    assert kernels.quantize_rows(values, fmt, rule, out=out)[0] is not None and out.tobytes() == want_payload.tobytes()


def test_float_rows_kernel_refuses_non_finite_values_as_the_reference_does():
    values = adversarial_float_rows(0, rows=4)
    values[2, 77] = np.inf
    with pytest.raises(ValueError) as want:
        requantize.quantize_rows(values, E4M3, "mse")
    with pytest.raises(ValueError) as got:
        kernels.quantize_rows(values, E4M3, "mse")
    assert str(got.value) == str(want.value)
