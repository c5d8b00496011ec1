"""Block-FP8 tile resolve (contract section 4): ``W[i, j] = float32(fp8[i, j]) * float32(s[i // bn, j // bk])``,
an IEEE float32 multiply, then optionally nearest-even BF16 rounding (vllm-ascend's
``resolve_block_scales`` on load)."""

from __future__ import annotations

import numpy as np

from .constants import RESOLVE_DTYPES
from .elements import bf16_round, decode_e4m3, exact_float32


def resolve_tiles(
    codes,
    scale_inv,
    block: tuple[int, int],
    dtype: str = "bf16",
    row_offset: int = 0,
) -> np.ndarray:
    """Resolve E4M3 codes ``[n, K]`` with tile scales ``[S_rows, ceil(K/bk)]`` to float32 ``[n, K]``.

    ``codes`` may be rows ``[row_offset, row_offset + n)`` of a larger matrix: row ``i`` of
    ``codes`` uses tile row ``(row_offset + i) // bn``; edge tiles are cropped. With
    ``dtype="bf16"`` the float32 result holds BF16-exact values; ``"fp32"`` skips that rounding.
    A bf16 ``scale_inv`` is widened to float32 exactly. Shape checks here are a guard: the io
    layer validates tensors (and that the scale has exactly ``ceil(N/bn)`` rows) earlier.
    """
    if dtype not in RESOLVE_DTYPES:
        raise ValueError(f"resolve dtype must be one of {RESOLVE_DTYPES}, got {dtype!r}")
    codes = np.asarray(codes)
    if codes.dtype != np.uint8 or codes.ndim != 2:
        raise ValueError(f"codes must be a 2-D uint8 array, got {codes.dtype} {codes.shape}")
    scale = exact_float32(scale_inv, "scale_inv")
    bn, bk = (int(b) for b in block)
    if bn <= 0 or bk <= 0:
        raise ValueError(f"block sizes must be positive, got {block}")
    if row_offset < 0:
        raise ValueError(f"row_offset must be >= 0, got {row_offset}")
    n, k = codes.shape
    tile_rows_needed = -(-(row_offset + n) // bn)
    tile_cols = -(-k // bk)
    if scale.ndim != 2 or scale.shape[1] != tile_cols or scale.shape[0] < tile_rows_needed:
        raise ValueError(
            f"scale_inv shape {scale.shape} does not fit codes {codes.shape} at row_offset "
            f"{row_offset} with block {(bn, bk)}: need [>= {tile_rows_needed}, {tile_cols}]"
        )

    row_scales = scale[(row_offset + np.arange(n)) // bn]  # [n, tile_cols]
    element_scales = np.repeat(row_scales, bk, axis=1)[:, :k]  # the last tile column is cropped
    # float32 * float32: one IEEE rounding. A product beyond float32 becomes inf, which the MX
    # quantizer refuses as non-finite input and convert reports as NonFiniteValueError.
    with np.errstate(over="ignore"):
        resolved = decode_e4m3(codes) * element_scales
    return bf16_round(resolved) if dtype == "bf16" else resolved
