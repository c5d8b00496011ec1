"""convert's options: the one place their defaults are written (the CLI reads them from here).

Kept apart from convert.py so the command line can show the defaults and choices in `--help`
without importing the converter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ascendconv.errors import BadOptionError
from ascendconv.formats.constants import ResolveDtype, ScaleRule
from ascendconv.ascendv1 import DEFAULT_MAX_SHARD_SIZE
from ascendconv.plan import Deployment, Override, Scheme


class KernelName(str, Enum):
    """The implementation that converts the rows: numba (fast) or the numpy reference."""

    NUMBA = "numba"
    REFERENCE = "reference"


KERNELS = tuple(kernel.value for kernel in KernelName)


@dataclass
class ConvertOptions:
    scheme: str = Scheme.W8A8_MXFP8.value
    scale_rule: str = ScaleRule.MSE.value
    resolve_dtype: str = ResolveDtype.BF16.value
    overrides: list[Override] = field(default_factory=list)
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
    kernel: str = KernelName.NUMBA.value
    workers: int = 0  # 0: the machine's cores
    overwrite: bool = False
    resume: bool = False  # keep staging on failure; reuse the finished shards of a kept one
    part: tuple[int, int] | None = None  # (I, N): write only part I of N (see parts.py)
    deployment: Deployment = field(default_factory=Deployment)  # --tp, --ep, --shared-experts-as-routed

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise BadOptionError(f"--workers {self.workers}: must be 0 (every core) or a positive number")
