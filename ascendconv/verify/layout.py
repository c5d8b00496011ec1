"""The package as the loader sees it: its shards, tensors and linears, and row reads of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ascendconv.formats import elements, mx
from ascendconv.formats.constants import E2M1, E4M3, FLOAT, GROUP_SIZE, W4A8_MXFP, W8A8_MXFP8
from ascendconv.io.package import Package
from ascendconv.io.safetensors import NUMPY_DTYPES, SafetensorsHeader, TensorEntry, TensorReader
from ascendconv.models import rules_for


MX_TYPES = (W8A8_MXFP8, W4A8_MXFP)
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")

CHUNK_BYTES = 16 * 2**20  # bytes read at a time, per tensor


@dataclass
class _Module:
    """A linear of the package: its weight, its type, and its reduction size K."""

    prefix: str
    label: str
    weight: TensorEntry | None
    scale: TensorEntry | None

    @property
    def n(self) -> int | None:
        return self.weight.shape[0] if self.weight is not None and len(self.weight.shape) == 2 else None

    @property
    def k(self) -> int | None:
        if self.weight is None or len(self.weight.shape) != 2:
            return None
        cols = self.weight.shape[1]
        return 2 * cols if self.label == W4A8_MXFP else cols


class _Layout:
    """Which shards the package is made of, the tensors they hold (stray files excluded) and its
    linears, as the checks need them."""

    def __init__(self, pkg: Package):
        # the shard bookkeeping is Package's, the one reader inspect uses too, so the two agree
        self.pkg = pkg
        self.root = pkg.root
        self.index = pkg.index
        self.expected, self.present, self.missing, self.strays = pkg.expected, pkg.present, pkg.missing, pkg.strays
        self.headers: dict[str, SafetensorsHeader] = pkg.headers
        self.broken: dict[str, str] = pkg.broken_shards
        self.tensors: dict[str, TensorEntry] = pkg.tensors
        self.duplicates: list[tuple[str, str, str]] = pkg.duplicates
        self.rules = rules_for(pkg.config)  # the model family's routed-expert naming and packed groups
        self.description = {k: v for k, v in pkg.description.items()}
        self.modules: dict[str, _Module] = {}
        for name, label in self.description.items():
            if name.endswith(".weight") and isinstance(label, str):
                prefix = name[: -len(".weight")]
                self.modules[prefix] = _Module(
                    prefix, label, self.tensors.get(name), self.tensors.get(prefix + ".weight_scale")
                )

    def label(self, name: str) -> str | None:
        value = self.description.get(name)
        return value if isinstance(value, str) else None

    @property
    def complete(self) -> bool:
        """Every shard the package should have is present and readable."""
        return not self.missing and not self.broken


def _row_chunks(entry: TensorEntry, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, int, int, int]]:
    """(row_start, row_stop, byte_start, byte_count) covering the tensor, whole rows per chunk."""
    rows = entry.shape[0] if entry.shape else 1
    if entry.nbytes == 0 or rows == 0:
        return
    row_bytes = entry.nbytes // rows
    step = max(1, chunk_bytes // max(row_bytes, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        yield r0, r1, r0 * row_bytes, (r1 - r0) * row_bytes


def _mapped_rows(reader: TensorReader, entry: TensorEntry, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of a 2-D tensor, read-only and mapped from the page cache (no copy)."""
    row_bytes = entry.nbytes // entry.shape[0]
    data = reader.map_range(entry, r0 * row_bytes, (r1 - r0) * row_bytes)
    return data.view(NUMPY_DTYPES[entry.dtype]).reshape(r1 - r0, *entry.shape[1:])


def _read_package_rows(
    reader: TensorReader, module: _Module, r0: int, r1: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(stored payload, element codes unpacked [R, K] or float32 values, scale bytes or None)."""
    payload = _mapped_rows(reader, module.weight, r0, r1)
    if module.label == FLOAT:
        return payload, payload.astype(np.float32), None
    scales = _mapped_rows(reader, module.scale, r0, r1)
    codes = elements.unpack_fp4(payload) if module.label == W4A8_MXFP else payload
    return payload, codes, scales


def _dequantize(module: _Module, codes: np.ndarray, scales: np.ndarray | None) -> np.ndarray:
    if module.label == FLOAT:
        return codes
    fmt = E2M1 if module.label == W4A8_MXFP else E4M3
    k = module.k
    groups = scales.shape[1] * GROUP_SIZE
    if groups != k:  # W8A8 with K % 32 (not reached: alignment fails first), pad to whole groups
        codes = np.pad(codes, ((0, 0), (0, groups - k)))
    return mx.dequantize_mx(codes, scales, fmt)[:, :k]
