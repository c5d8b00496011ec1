"""Block-FP8 tile resolve against a per-element float32 loop."""

import ml_dtypes
import numpy as np
import pytest

from ascendconv.formats.constants import E4M3_NAN_CODES
from ascendconv.formats.resolve import resolve_tiles


def finite_codes(rng, shape):
    codes = rng.integers(0, 256, shape, dtype=np.uint8)
    codes[np.isin(codes, E4M3_NAN_CODES)] = 0x3F
    return codes


def tile_scales(rng, n, k, block):
    shape = (-(-n // block[0]), -(-k // block[1]))
    return (rng.lognormal(-8, 2, shape)).astype(np.float32)


def resolve_loop(codes, scales, block):
    """W[i, j] = float32(fp8[i, j]) * float32(s[i // bn, j // bk]), one element at a time."""
    fp8 = codes.view(ml_dtypes.float8_e4m3fn)
    out = np.empty(codes.shape, np.float32)
    for i in range(codes.shape[0]):
        for j in range(codes.shape[1]):
            out[i, j] = np.float32(fp8[i, j]) * np.float32(scales[i // block[0], j // block[1]])
    return out


def bf16_from_bits(x):
    bits = x.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


@pytest.fixture(scope="module")
def ragged():
    """N=200, K=300 with 128x128 tiles: a 2x3 scale grid whose last row and column are cropped."""
    rng = np.random.default_rng(30)
    codes = finite_codes(rng, (200, 300))
    scales = tile_scales(rng, 200, 300, (128, 128))
    assert scales.shape == (2, 3)
    return codes, scales, resolve_loop(codes, scales, (128, 128))


def test_fp32_resolve_equals_element_loop(ragged):
    codes, scales, expected = ragged
    resolved = resolve_tiles(codes, scales, (128, 128), dtype="fp32")
    assert resolved.dtype == np.float32 and resolved.shape == (200, 300)
    np.testing.assert_array_equal(resolved, expected)


def test_bf16_resolve_is_bf16_rounding_of_fp32(ragged):
    codes, scales, expected = ragged
    resolved = resolve_tiles(codes, scales, (128, 128))  # "bf16" is the default
    assert resolved.dtype == np.float32
    np.testing.assert_array_equal(resolved, bf16_from_bits(expected))
    np.testing.assert_array_equal(resolved.astype(ml_dtypes.bfloat16).astype(np.float32), resolved)


@pytest.mark.parametrize("r0, r1", [(0, 200), (0, 1), (100, 170), (127, 129), (128, 200), (199, 200)])
def test_row_slices_match_the_full_resolve(ragged, r0, r1):
    codes, scales, expected = ragged
    part = resolve_tiles(codes[r0:r1], scales, (128, 128), dtype="fp32", row_offset=r0)
    np.testing.assert_array_equal(part, expected[r0:r1])


def test_bf16_scales_are_widened_exactly():
    rng = np.random.default_rng(31)
    codes = finite_codes(rng, (70, 90))
    scales_bf16 = rng.lognormal(-6, 1, (3, 2)).astype(np.float32).astype(ml_dtypes.bfloat16)
    scales_f32 = scales_bf16.astype(np.float32)
    block = (32, 64)
    expected = resolve_loop(codes, scales_f32, block)
    np.testing.assert_array_equal(resolve_tiles(codes, scales_f32, block, "fp32"), expected)
    np.testing.assert_array_equal(resolve_tiles(codes, scales_bf16, block, "fp32"), expected)
    np.testing.assert_array_equal(resolve_tiles(codes, scales_bf16, block, "bf16"), bf16_from_bits(expected))


@pytest.mark.parametrize("block", [(1, 1), (128, 96), (7, 300), (64, 32)])
def test_other_block_shapes(block):
    rng = np.random.default_rng(32)
    codes = finite_codes(rng, (40, 100))
    scales = tile_scales(rng, 40, 100, block)
    np.testing.assert_array_equal(resolve_tiles(codes, scales, block, "fp32"), resolve_loop(codes, scales, block))


def test_signed_zero_and_nan_codes_pass_through():
    codes = np.uint8([[0x00, 0x80, 0x7F, 0x38]])  # +0, -0, NaN, 1.0
    resolved = resolve_tiles(codes, np.float32([[2.0]]), (128, 128), "fp32")
    assert resolved[0, 0] == 0 and not np.signbit(resolved[0, 0])
    assert resolved[0, 1] == 0 and np.signbit(resolved[0, 1])
    assert np.isnan(resolved[0, 2]) and resolved[0, 3] == 2.0


@pytest.mark.parametrize(
    "codes_shape, scale_shape, row_offset",
    [((200, 300), (2, 2), 0),   # too few scale columns
     ((200, 300), (2, 4), 0),   # too many scale columns
     ((200, 300), (1, 3), 0),   # too few scale rows
     ((100, 300), (2, 3), 200),  # slice beyond the scale's rows
     ((200, 300), (6,), 0)],
)
def test_shape_mismatch_raises(codes_shape, scale_shape, row_offset):
    with pytest.raises(ValueError, match="scale_inv shape"):
        resolve_tiles(np.zeros(codes_shape, np.uint8), np.ones(scale_shape, np.float32), (128, 128),
                      row_offset=row_offset)


def test_bad_arguments_raise():
    codes = np.zeros((4, 4), np.uint8)
    scales = np.ones((1, 1), np.float32)
    with pytest.raises(ValueError, match="dtype"):
        resolve_tiles(codes, scales, (128, 128), dtype="fp16")
    with pytest.raises(ValueError, match="uint8"):
        resolve_tiles(codes.astype(np.int8), scales, (128, 128))
    with pytest.raises(ValueError, match="row_offset"):
        resolve_tiles(codes, scales, (128, 128), row_offset=-1)
    with pytest.raises(TypeError, match="float32"):
        resolve_tiles(codes, scales.astype(np.float64), (128, 128))
