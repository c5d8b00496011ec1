"""Format facts shared by every numerics module (the contract: docs/contract.md)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# MX groups are 32 consecutive values of one row along K (contract section 4; OCP MX block size).
GROUP_SIZE = 32

# E8M0 scale byte b means 2**(b - 127); byte 255 is NaN and is never written (contract section 3).
E8M0_BIAS = 127
E8M0_NAN = 255
E8M0_MAX_FINITE = 254


@dataclass(frozen=True)
class ElementFormat:
    """An MX element format: ``max_value`` = largest finite magnitude, ``emax`` = its unbiased
    exponent (the ``emax`` of the contract section 4 floor rule), ``bits`` = storage width of one code."""

    name: str
    max_value: float
    emax: int
    mantissa_bits: int
    bits: int

    @property
    def sign_bit(self) -> int:
        """The code bit that holds the sign (the top bit of a code)."""
        return 1 << (self.bits - 1)


# OCP float8_e4m3fn: max 448 = 1.75 * 2**8 (contract section 4: emax 8, max 448).
E4M3 = ElementFormat(name="e4m3", max_value=448.0, emax=8, mantissa_bits=3, bits=8)
# OCP float4_e2m1fn: max 6 = 1.5 * 2**2 (contract section 4: emax 2, max 6).
E2M1 = ElementFormat(name="e2m1", max_value=6.0, emax=2, mantissa_bits=1, bits=4)

# Exact re-layouts of MX source payloads (formats/relayout.py holds the transforms themselves).
AS_STORED = "as-stored"  # the bytes as they are
E2M1_AS_E4M3 = "e2m1-as-e4m3"  # each E2M1 code as the E4M3 code of the same value, scale bytes kept


def transform_for(source: ElementFormat, target: ElementFormat) -> str | None:
    """The exact transform from a payload of element format `source` to one of `target`, or None
    (values that do not fit the target exactly: MXFP8 -> MXFP4 must be re-quantized)."""
    if source == target:
        return AS_STORED
    if source == E2M1 and target == E4M3:
        return E2M1_AS_E4M3
    return None


class ScaleRule(str, Enum):
    """Shared-exponent rules of contract section 4 (str-valued: a member equals its name string)."""

    FLOOR = "floor"
    RCEIL = "rceil"
    MSE = "mse"


SCALE_RULES = tuple(rule.value for rule in ScaleRule)


class ResolveDtype(str, Enum):
    """What a source tile is resolved to before requantization: bf16 (as vllm-ascend does) or fp32."""

    BF16 = "bf16"
    FP32 = "fp32"


RESOLVE_DTYPES = tuple(d.value for d in ResolveDtype)


# Quant type strings of quant_model_description.json (contract section 3 table; "W4A8_MXFP", not "...MXFP4").
W8A8_MXFP8 = "W8A8_MXFP8"
W4A8_MXFP = "W4A8_MXFP"
W4A16_MXFP4 = "W4A16_MXFP4"  # routed experts only: vllm-ascend registers no linear scheme for it
W4A4_MXFP4 = "W4A4_MXFP4"
FLOAT = "FLOAT"

# Element rounding of an MX quantization (the `round_mode` of Ascend's dynamic MX quantization):
# "rint" rounds a tie to the even code, "round" away from zero (contract section 4).
ROUND_MODES = ("rint", "round")

# E2M1 magnitudes; a code is sign << 3 | index into this grid (contract section 3).
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# float8_e4m3fn has no infinities; S.1111.111 is NaN (contract section 1 lists 0x7F / 0xFF as invalid payload).
E4M3_NAN_CODES = (0x7F, 0xFF)

# Code of the largest magnitude, sign bit clear: 0x7E = 448 for E4M3, index 7 = 6 for E2M1.
MAX_MAGNITUDE_CODE = {E4M3.name: 0x7E, E2M1.name: 0x07}
