"""Error measures of a quantized tensor against its reference, in float64, accumulable over chunks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .constants import MAX_MAGNITUDE_CODE, ElementFormat


@dataclass
class ErrorStats:
    """``rel_l2 = ||approx - ref|| / ||ref||``; ``sqnr_db = 10 log10(sum ref^2 / sum (approx-ref)^2)``
    (inf when exact); ``max_abs`` = largest ``|approx - ref|``; ``saturated_fraction`` = share of
    codes at the format's largest magnitude (0 without codes); ``count`` = number of values."""

    rel_l2: float
    sqnr_db: float
    max_abs: float
    saturated_fraction: float
    count: int


class ErrorAccumulator:
    """Sums of squares over chunks (e.g. row blocks of one matrix), combined into one ErrorStats."""

    def __init__(self) -> None:
        self._ref_sq = 0.0
        self._err_sq = 0.0
        self._max_abs = 0.0
        self._count = 0
        self._codes_seen = 0
        self._codes_saturated = 0

    def update(self, ref, approx, codes=None, fmt: ElementFormat | None = None) -> None:
        """Add one chunk; ``codes`` (unpacked, same format as ``fmt``) count towards saturation."""
        ref64 = np.asarray(ref, dtype=np.float64)
        approx64 = np.asarray(approx, dtype=np.float64)
        if ref64.shape != approx64.shape:
            raise ValueError(f"ref shape {ref64.shape} != approx shape {approx64.shape}")
        if (codes is None) != (fmt is None):
            raise ValueError("codes and fmt go together: give both or neither")
        error = approx64 - ref64
        self._ref_sq += float(np.sum(ref64 * ref64))
        self._err_sq += float(np.sum(error * error))
        if error.size:
            self._max_abs = max(self._max_abs, float(np.max(np.abs(error))))
        self._count += ref64.size
        if codes is not None:
            codes = np.asarray(codes)
            magnitude_mask = fmt.sign_bit - 1
            self._codes_saturated += int(np.count_nonzero((codes & magnitude_mask) == MAX_MAGNITUDE_CODE[fmt.name]))
            self._codes_seen += codes.size

    def add_sums(self, ref_sq: float, err_sq: float, max_abs: float, count: int, saturated: int | None) -> None:
        """Add a chunk summed elsewhere (kernels.error_sums): `count` values; `saturated` of their
        codes at the largest magnitude (None: no codes)."""
        self._ref_sq += ref_sq
        self._err_sq += err_sq
        if not math.isnan(self._max_abs) and not max_abs <= self._max_abs:  # a NaN stays, as in np.max
            self._max_abs = max_abs
        self._count += count
        if saturated is not None:
            self._codes_saturated += saturated
            self._codes_seen += count

    def result(self) -> ErrorStats:
        if self._ref_sq == 0.0:
            rel_l2 = 0.0 if self._err_sq == 0.0 else math.inf
        else:
            rel_l2 = math.sqrt(self._err_sq / self._ref_sq)
        if self._err_sq == 0.0:
            sqnr_db = math.inf
        elif self._ref_sq == 0.0:
            sqnr_db = -math.inf
        else:
            ratio = self._ref_sq / self._err_sq  # 0 when the error is infinite (an rceil overflow)
            sqnr_db = 10.0 * math.log10(ratio) if ratio > 0 else -math.inf if ratio == 0 else math.nan
        saturated = self._codes_saturated / self._codes_seen if self._codes_seen else 0.0
        return ErrorStats(rel_l2, sqnr_db, self._max_abs, saturated, self._count)


def error_stats(ref, approx, codes=None, fmt: ElementFormat | None = None) -> ErrorStats:
    """ErrorStats of ``approx`` against ``ref`` (see ErrorStats for the definitions)."""
    accumulator = ErrorAccumulator()
    accumulator.update(ref, approx, codes, fmt)
    return accumulator.result()
