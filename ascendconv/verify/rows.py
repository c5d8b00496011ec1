"""Row reads of a package's linears as arrays: stored payload, element codes, scale bytes, values.

Used by the checks that look at values (the scan of unvouched shards, --source, --moe-check,
--on-npu); kept apart from `layout` so that a plain `verify OUT` never imports numpy.
"""

from __future__ import annotations

import numpy as np

from ascendconv.formats import elements, mx
from ascendconv.ascendv1 import QUANT_TYPES
from ascendconv.formats.constants import FLOAT, GROUP_SIZE
from ascendconv.io.safetensors import NUMPY_DTYPES, TensorEntry, TensorReader
from ascendconv.verify.layout import _Module


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
    codes = elements.unpack_fp4(payload) if QUANT_TYPES[module.label].k_per_byte == 2 else payload
    return payload, codes, scales


def _dequantize(module: _Module, codes: np.ndarray, scales: np.ndarray | None) -> np.ndarray:
    if module.label == FLOAT:
        return codes
    fmt = QUANT_TYPES[module.label].element
    k = module.k
    groups = scales.shape[1] * GROUP_SIZE
    if groups != k:  # W8A8 with K % 32 (not reached: alignment fails first), pad to whole groups
        codes = np.pad(codes, ((0, 0), (0, groups - k)))
    return mx.dequantize_mx(codes, scales, fmt)[:, :k]
