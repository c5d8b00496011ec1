"""One step of the conversion, in numpy: source rows -> MX payload rows (the reference).

`requantize_rows` (FP8 tiles) and `quantize_rows` (float values) are the functions every faster
kernel must match bit for bit: they compose the tile resolve (resolve.py) and the MX quantizer
(mx.py) exactly as the contract (docs/contract.md) defines them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ascendconv.formats import elements, mx, resolve
from ascendconv.formats.constants import E2M1, ElementFormat


def first_nan_code(codes: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first E4M3 NaN code (0x7F / 0xFF), or None."""
    hits = np.flatnonzero((codes & 0x7F) == 0x7F)
    return tuple(int(i) for i in np.unravel_index(hits[0], codes.shape)) if hits.size else None


def requantize_rows(
    codes: np.ndarray,
    scale_inv: np.ndarray,
    block: tuple[int, int],
    row_offset: int,
    resolve_dtype: str,
    fmt: ElementFormat,
    rule: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows [row_offset, row_offset + len(codes)) of a block-FP8 weight -> (payload, scale bytes).

    The payload is E4M3 codes [R, K] or packed E2M1 [R, K/2]; the scales are E8M0 [R, K/32].
    The caller has checked the codes for NaN and the scales for finiteness.
    """
    values = resolve.resolve_tiles(codes, scale_inv, block, resolve_dtype, row_offset=row_offset)
    out_codes, scales = mx.quantize_mx(values, fmt, rule)
    if fmt is E2M1:
        out_codes = elements.pack_fp4(out_codes)
    return out_codes, scales


def quantize_rows(values: np.ndarray, fmt: ElementFormat, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a float source weight (BF16 / F16 / F32, widened exactly to float32) -> (payload,
    scale bytes): MX quantization of the values themselves, no tile resolve. Raises ValueError on
    NaN / Inf and when K % 32 != 0 (mx.quantize_mx)."""
    out_codes, scales = mx.quantize_mx(np.asarray(values, dtype=np.float32), fmt, rule)
    if fmt is E2M1:
        out_codes = elements.pack_fp4(out_codes)
    return out_codes, scales


def resolve_rows_bf16(codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int], row_offset: int) -> np.ndarray:
    """Rows of a block-FP8 weight resolved to BF16, for a layer written as FLOAT. Raises ValueError
    on a non-finite result (a NaN code, or code x tile scale past BF16's range), as
    `requantize_rows` does: the layer must not be written FLOAT with values its MX twin refuses."""
    values = resolve.resolve_tiles(codes, scale_inv, block, "bf16", row_offset=row_offset)
    if not np.isfinite(values).all():
        bad = int(values.size - np.count_nonzero(np.isfinite(values)))
        raise ValueError(f"non-finite resolved BF16 values: NaN/Inf count {bad}")
    return values.astype(ml_dtypes.bfloat16)
