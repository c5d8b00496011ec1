"""The row operations of each source encoding: a linear's source rows -> MX payload and scale rows,
or -> BF16 rows for a module written FLOAT. The pipeline and verify call these, never a kernel by
its FP8 name, so a new encoding is one class here.

`impl` is one implementation of the kernel functions: `ascendconv.kernels` (numba) or
`ascendconv.formats.requantize` (the numpy reference), which give the same bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ascendconv.errors import NaNCodeError, NonFiniteValueError
from ascendconv.formats.constants import GROUP_SIZE
from ascendconv.sources.base import Encoding, Source, SourceLinear

if TYPE_CHECKING:
    import numpy as np


class Fp8TileRows:
    """Rows of an FP8-tile linear (any FP8 spelling: the tile multipliers are float32 once read).

    Each chunk of rows reads the rows of tile scales it needs, and no more: memory follows the
    pipeline's chunks, whatever the tile size (a [1, 1] tile has as many scales as weights)."""

    def __init__(self, impl, source: Source, linear: SourceLinear):
        self.impl, self.source, self.linear = impl, source, linear
        self.row_bytes = linear.shape[1]

    def _scales_for(self, row_start: int, rows: int) -> tuple["np.ndarray", int]:
        """The tile scales of rows [row_start, row_start + rows), and the first row's offset into
        them (the row offset the kernels take)."""
        bn = self.linear.block[0]
        t0 = row_start // bn
        return self.source.read_scale(self.linear, (t0, -(-(row_start + rows) // bn))), row_start - t0 * bn

    def _check_nan(self, codes: "np.ndarray", row_start: int) -> None:
        nan_at = self.impl.first_nan_code(codes)
        if nan_at is not None:
            weight = self.linear.weight
            raise NaNCodeError(
                f"{weight.path.name}: {weight.name!r} holds a NaN code "
                f"(0x{codes[nan_at]:02X}) at row {row_start + nan_at[0]}, column {nan_at[1]}"
            )

    def quantize(self, data, row_start: int, rows: int, fmt, rule: str, resolve_dtype: str, **out):
        """(payload, E8M0 scale bytes) of rows [row_start, row_start + rows), from their bytes."""
        import numpy as np

        codes = np.frombuffer(data, np.uint8).reshape(rows, self.row_bytes)
        scale, offset = self._scales_for(row_start, rows)
        try:
            return self.impl.requantize_rows(codes, scale, self.linear.block, offset, resolve_dtype, fmt, rule, **out)
        except ValueError as exc:
            # Both kernels refuse non-finite input, NaN codes included, so the codes need no scan
            # of their own on the way in: name the first NaN code if that was the cause, else the
            # overflow of code x tile scale.
            self._check_nan(codes, row_start)
            raise NonFiniteValueError(
                f"{self.linear.weight.path.name}: {self.linear.weight.name!r} rows {row_start}..{row_start + rows - 1} "
                f"resolve to NaN/Inf with their tile scales from {self.linear.scale.name!r} ({exc})"
            ) from exc

    def to_bf16(self, data, row_start: int, rows: int, **out):
        """BF16 values of rows [row_start, row_start + rows), for a module written FLOAT."""
        import numpy as np

        codes = np.frombuffer(data, np.uint8).reshape(rows, self.row_bytes)
        self._check_nan(codes, row_start)
        scale, offset = self._scales_for(row_start, rows)
        return self.impl.resolve_rows_bf16(codes, scale, self.linear.block, offset, **out)


class FloatRows:
    """Rows of a float linear (BF16 / F16 / F32 values, widened exactly to float32), quantized as
    they are. Written FLOAT, a float linear is copied (plan.py), so there is no `to_bf16`."""

    def __init__(self, impl, source: Source, linear: SourceLinear):
        from ascendconv.io.safetensors import itemsize

        self.impl, self.linear = impl, linear
        self.row_bytes = linear.shape[1] * itemsize(linear.weight.dtype)

    def values(self, data, rows: int) -> "np.ndarray":
        import numpy as np

        from ascendconv.io.safetensors import NUMPY_DTYPES

        return np.frombuffer(data, NUMPY_DTYPES[self.linear.weight.dtype]).reshape(rows, -1).astype(np.float32)

    def quantize(self, data, row_start: int, rows: int, fmt, rule: str, resolve_dtype: str, **out):
        values = self.values(data, rows)
        try:
            return self.impl.quantize_rows(values, fmt, rule, **out)
        except ValueError as exc:
            weight = self.linear.weight
            raise NonFiniteValueError(
                f"{weight.path.name}: {weight.name!r} holds NaN/Inf in rows {row_start}..{row_start + rows - 1} ({exc})"
            ) from exc


ROWS = {Encoding.FP8_TILES: Fp8TileRows, Encoding.FLOAT: FloatRows}


def decoded(source: Source, linear: SourceLinear) -> "np.ndarray":
    """A whole source linear as float32 values, the reference every package weight is measured
    against: FP8 tiles resolved as vllm-ascend does on load (code x tile multiplier, to BF16), float
    values widened exactly."""
    import numpy as np

    from ascendconv.formats.resolve import resolve_tiles

    data = source.reader.read(linear.weight)
    if linear.encoding is Encoding.FLOAT:
        return data.astype(np.float32)
    return resolve_tiles(data, source.read_scale(linear), linear.block, "bf16")


def linear_rows(impl, source: Source, linear: SourceLinear):
    """The row operations of `linear` with the implementation `impl`."""
    return ROWS[linear.encoding](impl, source, linear)


def entry_points(linears, mx: bool, resolve: bool) -> list[str]:
    """The numba entry points a run over `linears` needs: requantize for MX weights from FP8 tiles
    (and its direct path where a tile splits MX groups), quantize_float for MX weights from float
    values, resolve_bf16 and first_nan for FP8 weights kept in BF16."""
    from ascendconv.kernels import entry_points_for

    linears = list(linears)
    tiled = [linear for linear in linears if linear.encoding is Encoding.FP8_TILES]
    names = entry_points_for(mx and bool(tiled), resolve and bool(tiled), tiles_split_groups(tiled))
    if mx and any(linear.encoding is Encoding.FLOAT for linear in linears):
        names.append("quantize_float")
    return names


def tiles_split_groups(linears) -> bool:
    """Whether some FP8-tile linear's tiles split its MX groups of 32 along K."""
    return any(linear.block is not None and linear.block[1] % GROUP_SIZE for linear in linears)
