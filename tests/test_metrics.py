"""Error statistics and their accumulation over chunks."""

import math

import numpy as np
import pytest

from ascendconv.formats.constants import E2M1, E4M3
from ascendconv.formats.metrics import ErrorAccumulator, error_stats
from ascendconv.formats.mx import dequantize_mx, quantize_mx


def test_known_small_example():
    stats = error_stats(np.float32([3, 4]), np.float32([3, 5]))
    assert stats.rel_l2 == pytest.approx(1 / 5)
    assert stats.sqnr_db == pytest.approx(10 * math.log10(25))
    assert stats.max_abs == 1.0
    assert stats.saturated_fraction == 0.0
    assert stats.count == 2


def test_exact_match():
    values = np.float32([1.5, -2, 0])
    stats = error_stats(values, values.copy())
    assert stats.rel_l2 == 0.0 and stats.sqnr_db == math.inf and stats.max_abs == 0.0


def test_zero_reference():
    zeros = np.zeros(4, np.float32)
    assert error_stats(zeros, zeros).rel_l2 == 0.0
    stats = error_stats(zeros, np.float32([0, 0, 1, 0]))
    assert stats.rel_l2 == math.inf and stats.sqnr_db == -math.inf


def test_saturated_fraction_counts_largest_magnitude_codes():
    e4m3 = error_stats(np.zeros(4, np.float32), np.zeros(4, np.float32), np.uint8([0x7E, 0xFE, 0x7D, 0x00]), E4M3)
    assert e4m3.saturated_fraction == 0.5
    e2m1 = error_stats(np.zeros(4, np.float32), np.zeros(4, np.float32), np.uint8([7, 15, 6, 8]), E2M1)
    assert e2m1.saturated_fraction == 0.5


def test_accumulated_chunks_equal_one_shot():
    rng = np.random.default_rng(40)
    ref = rng.standard_normal((96, 64)).astype(np.float32)
    codes, scales = quantize_mx(ref, E4M3, "floor")
    approx = dequantize_mx(codes, scales, E4M3)
    whole = error_stats(ref, approx, codes, E4M3)
    accumulator = ErrorAccumulator()
    for start in range(0, 96, 20):
        rows = slice(start, start + 20)
        accumulator.update(ref[rows], approx[rows], codes[rows], E4M3)
    chunked = accumulator.result()
    assert chunked.count == whole.count == ref.size
    assert chunked.rel_l2 == pytest.approx(whole.rel_l2, rel=1e-12)
    assert chunked.sqnr_db == pytest.approx(whole.sqnr_db, rel=1e-12)
    assert chunked.max_abs == whole.max_abs
    assert chunked.saturated_fraction == whole.saturated_fraction
    assert 0 < whole.saturated_fraction < 0.1


def test_float64_accumulation_and_expected_mx_error_levels():
    rng = np.random.default_rng(41)
    ref = (rng.standard_normal((64, 256)) * 0.02).astype(np.float32)
    for fmt, low, high in [(E4M3, 0.02, 0.04), (E2M1, 0.08, 0.15)]:
        codes, scales = quantize_mx(ref, fmt, "mse")
        stats = error_stats(ref, dequantize_mx(codes, scales, fmt), codes, fmt)
        direct = np.linalg.norm(dequantize_mx(codes, scales, fmt).astype(np.float64) - ref) / np.linalg.norm(
            ref.astype(np.float64))
        assert stats.rel_l2 == pytest.approx(direct, rel=1e-12)
        assert low < stats.rel_l2 < high


def test_argument_errors():
    with pytest.raises(ValueError, match="shape"):
        error_stats(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="codes and fmt"):
        error_stats(np.zeros(3, np.float32), np.zeros(3, np.float32), codes=np.zeros(3, np.uint8))


def test_empty_accumulator():
    stats = ErrorAccumulator().result()
    assert stats.count == 0 and stats.rel_l2 == 0.0 and stats.saturated_fraction == 0.0


def test_an_infinite_error_gives_minus_infinite_sqnr():
    """rceil can dequantize a huge group maximum to inf: the statistics say so, never raise."""
    stats = error_stats(np.array([1.0, 2.0], np.float32), np.array([1.0, np.inf], np.float32))
    assert stats.sqnr_db == -math.inf and stats.rel_l2 == math.inf and stats.max_abs == math.inf
