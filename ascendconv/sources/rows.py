"""The row operations of each source encoding: a linear's source rows -> MX payload and scale rows,
or -> BF16 rows for a module written FLOAT. The pipeline and verify call these, never a kernel by
its FP8 name, so a new encoding is one class here.

`impl` is one implementation of the kernel functions: `ascendconv.kernels` (numba) or
`ascendconv.formats.requantize` (the numpy reference), which give the same bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ascendconv.errors import NaNCodeError, NonFiniteScaleError, NonFiniteValueError
from ascendconv.formats.constants import GROUP_SIZE
from ascendconv.sources.base import NATIVE_TYPES, Encoding, Source, SourceLinear

if TYPE_CHECKING:
    import numpy as np


def check_nan_codes(impl, linear: SourceLinear, codes: "np.ndarray", row_start: int) -> None:
    """Refuse E4M3 codes rows [row_start, ...) of `linear` that hold a NaN code (0x7F / 0xFF), naming the first."""
    nan_at = impl.first_nan_code(codes)
    if nan_at is not None:
        weight = linear.weight
        raise NaNCodeError(
            f"{weight.path.name}: {weight.name!r} holds a NaN code "
            f"(0x{codes[nan_at]:02X}) at row {row_start + nan_at[0]}, column {nan_at[1]}"
        )


class Fp8TileRows:
    """Rows of an FP8-tile linear (any FP8 spelling: the tile multipliers are float32 once read).

    Each chunk of rows reads the rows of tile scales it needs, and no more: memory follows the
    pipeline's chunks, whatever the tile size (a [1, 1] tile has as many scales as weights).

    verify compares such a weight in bands of tile rows, sampled or all, with the weight's tile
    scales read once (`tile_scales`): `rederive`, `error_sums` and `resolved` take them."""

    compared_as = "tile bands"  # how verify compares it (verify/accuracy.py)

    def __init__(self, impl, source: Source, linear: SourceLinear):
        self.impl, self.source, self.linear = impl, source, linear
        self.row_bytes = linear.shape[1]

    @property
    def band_rows(self) -> int:
        """Rows of one band verify samples: a row of tiles."""
        return self.linear.block[0]

    def tile_scales(self) -> "np.ndarray":
        """The weight's tile multipliers, float32 [tile rows, tile columns], checked finite."""
        return self.source.read_scale(self.linear)

    def rederive(self, codes, scale, row_start: int, fmt, rule: str | None, resolve_dtype: str, impl=None, **out):
        """What convert writes for E4M3 codes rows [row_start, ...) given the weight's tile scales:
        (payload, E8M0 scale bytes), or (BF16 rows, None) where `fmt` is None (written FLOAT); with
        `impl` (the numpy reference) instead of this one's. ValueError on NaN / overflow, as both raise."""
        impl = impl or self.impl
        if fmt is None:
            return impl.resolve_rows_bf16(codes, scale, self.linear.block, row_start, **out), None
        return impl.requantize_rows(codes, scale, self.linear.block, row_start, resolve_dtype, fmt, rule, **out)

    def error_sums(self, codes, scale, row_start: int, resolve_dtype: str, fmt, payload, scales):
        """(reference sum of squares, error sum of squares, max |error|, saturated count) of package
        rows (payload, scales) against the resolved codes rows [row_start, ...)."""
        return self.impl.error_sums(codes, scale, self.linear.block, row_start, resolve_dtype, fmt, payload, scales)

    def resolved(self, codes, scale, rows: "np.ndarray", resolve_dtype: str) -> "np.ndarray":
        """float32 values of the source rows `rows` (their codes `codes`), each resolved with its own
        row of tile scales."""
        from ascendconv.formats.resolve import resolve_tiles

        bn, bk = self.linear.block
        return resolve_tiles(codes, scale[rows // bn], (1, bk), resolve_dtype)

    def first_nan(self, codes) -> tuple[int, ...] | None:
        return self.impl.first_nan_code(codes)

    def _scales_for(self, row_start: int, rows: int) -> tuple["np.ndarray", int]:
        """The tile scales of rows [row_start, row_start + rows), and the first row's offset into
        them (the row offset the kernels take)."""
        bn = self.linear.block[0]
        t0 = row_start // bn
        return self.source.read_scale(self.linear, (t0, -(-(row_start + rows) // bn))), row_start - t0 * bn

    def quantize(self, data, row_start: int, rows: int, fmt, rule: str, resolve_dtype: str, **out):
        """(payload, E8M0 scale bytes) of rows [row_start, row_start + rows), from their bytes."""
        import numpy as np

        codes = np.frombuffer(data, np.uint8).reshape(rows, self.row_bytes)
        scale, offset = self._scales_for(row_start, rows)
        try:
            return self.impl.requantize_rows(codes, scale, self.linear.block, offset, resolve_dtype, fmt, rule, **out)
        except ValueError as exc:
            raise self._non_finite(codes, row_start, exc) from exc

    def to_bf16(self, data, row_start: int, rows: int, **out):
        """BF16 values of rows [row_start, row_start + rows), for a module written FLOAT."""
        import numpy as np

        codes = np.frombuffer(data, np.uint8).reshape(rows, self.row_bytes)
        scale, offset = self._scales_for(row_start, rows)
        try:
            return self.impl.resolve_rows_bf16(codes, scale, self.linear.block, offset, **out)
        except ValueError as exc:
            raise self._non_finite(codes, row_start, exc) from exc

    def _non_finite(self, codes: "np.ndarray", row_start: int, exc: ValueError) -> NonFiniteValueError:
        """The error of rows whose values are not finite. Both kernels refuse them, NaN codes
        included, so the codes need no scan of their own on the way in: the first NaN code is
        named (raised) if that was the cause, else the overflow of code x tile scale."""
        check_nan_codes(self.impl, self.linear, codes, row_start)
        weight = self.linear.weight
        return NonFiniteValueError(
            f"{weight.path.name}: {weight.name!r} rows {row_start}..{row_start + len(codes) - 1} "
            f"resolve to NaN/Inf with their tile scales from {self.linear.scale.name!r} ({exc})",
            "code x tile scale is past the range of float32 (or of BF16, where the weights are resolved to BF16): "
            "the scale tensor is damaged; download the checkpoint again",
        )


def first_non_finite(values: "np.ndarray") -> tuple[int, int]:
    """(row, column) of the first NaN or Inf of 2-D `values`, which holds one."""
    import numpy as np

    r, c = np.argwhere(~np.isfinite(values))[0]
    return int(r), int(c)


class FloatRows:
    """Rows of a float linear (BF16 / F16 / F32 values, widened exactly to float32), quantized as
    they are. Written FLOAT, a float linear is copied (plan.py), so there is no `to_bf16`."""

    compared_as = "value rows"  # verify: every row re-derived from the values

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
            raise self._non_finite(values, row_start) from exc

    def _non_finite(self, values: "np.ndarray", row_start: int) -> NonFiniteValueError:
        """The error of rows the quantizer refused (the planner quantizes only K % 32 == 0, so a
        value that is not finite): the first one is named. A float master holds its values as
        they are, so no scale can be the cause."""
        r, c = first_non_finite(values)
        weight = self.linear.weight
        return NonFiniteValueError(
            f"{weight.path.name}: {weight.name!r} holds {values[r, c]} at row {row_start + r}, column {c}",
            f"a trained weight is finite: the {weight.dtype} tensor is damaged; download the checkpoint again",
        )


class MxRows:
    """Rows of an MX source linear (payload + E8M0 bytes per 32 along K): re-laid out through a
    named exact transform (formats/relayout.py) where the written type allows, else decoded to
    float32 (code x 2**(b - 127)) and quantized, or rounded to BF16 for a module written FLOAT.
    Each chunk reads the scale rows it needs, checked for the NaN byte 0xFF."""

    compared_as = "payload rows"  # verify: every row, relaid ones against the source bytes

    def __init__(self, impl, source: Source, linear: SourceLinear):
        from ascendconv.formats.constants import E2M1, E4M3

        self.impl, self.source, self.linear = impl, source, linear
        self.fmt = E2M1 if linear.encoding is Encoding.MX_E2M1 else E4M3
        self.row_bytes = linear.weight.shape[1]

    def _payload(self, data, row_start: int, rows: int) -> "np.ndarray":
        import numpy as np

        payload = np.frombuffer(data, np.uint8).reshape(rows, self.row_bytes)
        if self.linear.encoding is Encoding.MX_E4M3:  # E2M1 has no NaN code
            check_nan_codes(self.impl, self.linear, payload, row_start)
        return payload

    def values(self, data, rows: int, row_start: int = 0) -> "np.ndarray":
        """float32 values of rows [row_start, row_start + rows), checked finite."""
        import numpy as np

        from ascendconv.formats.relayout import decode

        scales = mx_scale_bytes(self.source, self.linear, row_start, row_start + rows)
        values = decode(self._payload(data, row_start, rows), scales, self.fmt)
        if not np.isfinite(values).all():
            r, c = first_non_finite(values)
            weight = self.linear.weight
            raise NonFiniteValueError(
                f"{weight.path.name}: {weight.name!r} row {row_start + r}, column {c} decodes to {values[r, c]} "
                f"(E8M0 byte {scales[r, c // GROUP_SIZE]} of {self.linear.scale.name!r})",
                "code x 2**(b - 127) past float32 is no quantizer's output: the checkpoint is damaged; download it again",
            )
        return values

    def relaid(self, data, row_start: int, rows: int, transform: str):
        """(payload, scale bytes) of rows [row_start, row_start + rows): the source bytes through
        `transform`, the scale bytes as they are. Values that decode past float32 are refused as
        where they are re-quantized: the package would hold them as they are."""
        from ascendconv.formats.relayout import TRANSFORMS, may_overflow

        payload = TRANSFORMS[transform](self._payload(data, row_start, rows))
        scales = mx_scale_bytes(self.source, self.linear, row_start, row_start + rows)
        if may_overflow(scales, self.fmt):
            self.values(data, rows, row_start)  # raises, naming the first value past float32
        return payload, scales

    def quantize(self, data, row_start: int, rows: int, fmt, rule: str, resolve_dtype: str, **out):
        """Re-quantized from the decoded values (a target the source's element format does not fit)."""
        return self.impl.quantize_rows(self.values(data, rows, row_start), fmt, rule, **out)

    def to_bf16(self, data, row_start: int, rows: int, out=None):
        """The decoded values rounded to BF16 (as uint16 bits), for a module written FLOAT."""
        import ml_dtypes
        import numpy as np

        bf16 = self.values(data, rows, row_start).astype(ml_dtypes.bfloat16).view(np.uint16)
        if out is None:
            return bf16
        out[...] = bf16
        return out


def mx_scale_bytes(source: Source, linear: SourceLinear, row_start: int, row_stop: int) -> "np.ndarray":
    """Rows [row_start, row_stop) of an MX linear's E8M0 bytes as uint8, refused if one is the NaN
    byte 0xFF (the package never holds it)."""
    import numpy as np

    from ascendconv.formats.constants import E8M0_NAN

    entry = linear.scale
    raw = np.asarray(source.reader.read_rows(entry, row_start, row_stop)).view(np.uint8)
    if (raw == E8M0_NAN).any():
        bad = np.argwhere(raw == E8M0_NAN)[0] + (row_start, 0)
        raise NonFiniteScaleError(f"{entry.path.name}: {entry.name!r} holds the E8M0 NaN byte 0xFF at {bad.tolist()}")
    return raw


ROWS = {Encoding.FP8_TILES: Fp8TileRows, Encoding.FLOAT: FloatRows, Encoding.MX_E2M1: MxRows, Encoding.MX_E4M3: MxRows}


def decoded(source: Source, linear: SourceLinear) -> "np.ndarray":
    """A whole source linear as float32 values, the reference every package weight is measured
    against: FP8 tiles resolved as vllm-ascend does on load (code x tile multiplier, to BF16), float
    values widened exactly, MX codes times their E8M0 scale."""
    import numpy as np

    from ascendconv.formats.resolve import resolve_tiles

    data = source.reader.read(linear.weight)
    if linear.encoding is Encoding.FLOAT:
        return data.astype(np.float32)
    if linear.encoding in NATIVE_TYPES:
        from ascendconv.formats import requantize

        return MxRows(requantize, source, linear).values(data.view(np.uint8), linear.shape[0])
    return resolve_tiles(data, source.read_scale(linear), linear.block, "bf16")


def linear_rows(impl, source: Source, linear: SourceLinear):
    """The row operations of `linear` with the implementation `impl`."""
    return ROWS[linear.encoding](impl, source, linear)


def entry_points(linears, mx: bool, resolve: bool) -> list[str]:
    """The numba entry points a run over `linears` needs: requantize for MX weights from FP8 tiles
    (and its direct path where a tile splits MX groups), quantize_float for MX weights from float
    or decoded MX values, resolve_bf16 for FP8 weights kept in BF16, first_nan for MXFP8 sources."""
    from ascendconv.kernels import entry_points_for

    linears = list(linears)
    tiled = [linear for linear in linears if linear.encoding is Encoding.FP8_TILES]
    names = entry_points_for(mx and bool(tiled), resolve and bool(tiled), tiles_split_groups(tiled))
    if mx and any(linear.encoding is Encoding.FLOAT or linear.encoding in NATIVE_TYPES for linear in linears):
        names.append("quantize_float")
    if any(linear.encoding is Encoding.MX_E4M3 for linear in linears) and "first_nan" not in names:
        names.append("first_nan")  # MXFP8 payloads are checked for NaN codes as they are read
    return names


def tiles_split_groups(linears) -> bool:
    """Whether some FP8-tile linear's tiles split its MX groups of 32 along K."""
    return any(linear.block is not None and linear.block[1] % GROUP_SIZE for linear in linears)
