"""Exact re-layouts of MX source bytes into AscendV1 payloads, each a named transform.

An MX source (compressed-tensors, Quark, ModelOpt) whose element format, E8M0 bias, group size 32
along K and nibble order (element 2j low, 2j+1 high) already match the package type needs no
re-quantization: its payload and scale bytes are the package's. Each transform maps a block of
source payload rows [R, row bytes] to package payload rows and keeps the scale bytes as they are;
verify proves a re-laid tensor by "package bytes == TRANSFORMS[name](source bytes)".

- `as-stored`: the bytes as they are (MXFP4 -> W4A8_MXFP, MXFP8 -> W8A8_MXFP8).
- `e2m1-as-e4m3`: each E2M1 code re-encoded as the E4M3 code of the same value. Every E2M1 value
  (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) is an E4M3 value, so under the same E8M0 byte
  the group's values are unchanged: the exact way down from MXFP4 to W8A8_MXFP8.

`decode` gives the values of MX source rows (code x 2**(b - 127), float32), the reference a
re-quantized or FLOAT-written MX tensor is measured against.
"""

from __future__ import annotations

import numpy as np

from .constants import AS_STORED, E2M1, E2M1_AS_E4M3, E2M1_GRID, GROUP_SIZE, ElementFormat
from .elements import decode_e2m1, decode_e4m3, e8m0_to_float, encode_e4m3, unpack_fp4

FLOAT32_MAX = float(np.finfo(np.float32).max)
# E4M3 code of each E2M1 code 0..15 (sign << 3 | grid index): the same value, exactly.
_E2M1_TO_E4M3 = encode_e4m3(np.array(E2M1_GRID + tuple(-v for v in E2M1_GRID), dtype=np.float32))


def as_stored(payload: np.ndarray) -> np.ndarray:
    """The source payload rows, unchanged."""
    return payload


def e2m1_as_e4m3(packed: np.ndarray) -> np.ndarray:
    """Packed E2M1 rows uint8 [R, K/2] -> E4M3 codes uint8 [R, K] of the same values."""
    return _E2M1_TO_E4M3[unpack_fp4(packed)]


TRANSFORMS = {AS_STORED: as_stored, E2M1_AS_E4M3: e2m1_as_e4m3}


def may_overflow(scales: np.ndarray, fmt: ElementFormat) -> bool:
    """Whether a value under one of the E8M0 bytes `scales` could decode past float32: the format's
    largest code times the largest 2**(b - 127). No quantizer writes such a byte (its block's
    values would have overflowed first), so a True is rare and `decode` then finds the value."""
    return scales.size > 0 and fmt.max_value * 2.0 ** (int(scales.max()) - 127) > FLOAT32_MAX


def decode(payload: np.ndarray, scales: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """MX source rows -> float32 values [R, K]: payload (packed E2M1 [R, K/2] or E4M3 [R, K]) with
    E8M0 bytes [R, K/32]; each value code x 2**(b - 127). Overflow (E4M3 448 under a byte near 254)
    and the NaN byte 0xFF give inf / NaN: the caller checks."""
    codes = unpack_fp4(payload) if fmt == E2M1 else payload
    values = decode_e2m1(codes) if fmt == E2M1 else decode_e4m3(codes)
    rows, k = codes.shape
    with np.errstate(over="ignore"):
        grouped = values.reshape(rows, k // GROUP_SIZE, GROUP_SIZE) * e8m0_to_float(scales)[..., None]
    return grouped.reshape(rows, k)
