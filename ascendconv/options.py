"""convert's (with --ray's) and verify's options: the one place their defaults are written (the CLI
reads them from here).

Kept apart from convert.py and verify/ so the command line can show the defaults and choices in
`--help` without importing the converter, the checks or numpy.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

from ascendconv.errors import BadOptionError
from ascendconv.formats.constants import E2M1, E4M3, W4A8_MXFP, W8A8_MXFP8, ResolveDtype, ScaleRule
from ascendconv.ascendv1 import DEFAULT_MAX_SHARD_SIZE, QUANT_TYPES
from ascendconv.decide import Deployment, Override, Scheme


class KernelName(str, Enum):
    """The implementation that converts the rows: numba (fast) or the numpy reference."""

    NUMBA = "numba"
    REFERENCE = "reference"


KERNELS = tuple(kernel.value for kernel in KernelName)

# --max-shard-size: decimal and binary units
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """'4GiB', '500MB', '0' -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match[2].upper() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise BadOptionError(f"cannot read size {text!r}", "use a number with an optional unit: 500MB, 2GiB, 0")
    size = float(match[1]) * _SIZE_UNITS[unit]
    if 0 < size < 1:  # int() would make it 0, which means "one file": never what was asked
        raise BadOptionError(f"size {text!r} is less than one byte", "give a size of a byte or more (500MB, 2GiB), or 0 for one file")
    if _SIZE_UNITS[unit] == 1 and not size.is_integer():  # int() made '1.5' one byte: a shard per tensor
        raise BadOptionError(
            f"size {text!r} is a fraction of a byte count",
            f"give the unit meant ({match[1]}GB, {match[1]}GiB) or a whole number of bytes",
        )
    return int(size)


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
    allow_unmatched_overrides: bool = False  # an --override glob matching no linear warns instead of failing

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise BadOptionError(f"--workers {self.workers}: must be 0 (every core) or a positive number")


# --- convert --ray ---------------------------------------------------------------------------------

DEFAULT_RAY_PARTS = 0  # one per task slot of the cluster, at most one per shard
DEFAULT_RAY_CPUS_PER_TASK = 2
DEFAULT_RAY_MAX_RETRIES = 2  # attempts after the first, per part


MAX_RAY_RETRIES = 100  # Ray reads -1 as "for ever"; a bound keeps a broken part from retrying without end
# What --ray-address may be: auto / local (Ray's own words), HOST:PORT of a cluster's head, or
# ray://HOST:PORT of its client server.
RAY_ADDRESS = re.compile(r"^(?:auto|local|(?:ray://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>\d{1,5}))$")


@dataclass
class RayOptions:
    address: str | None = None  # None: the Ray instance this process already runs, else a new local one
    parts: int = DEFAULT_RAY_PARTS
    cpus_per_task: int = DEFAULT_RAY_CPUS_PER_TASK
    max_retries: int = DEFAULT_RAY_MAX_RETRIES

    def __post_init__(self) -> None:
        """Checked before Ray is imported or started: a wrong value is a usage error, never a hang."""
        for flag, value, low, high in (
            ("--ray-parts", self.parts, 0, None),
            ("--ray-cpus", self.cpus_per_task, 1, None),
            ("--ray-retries", self.max_retries, 0, MAX_RAY_RETRIES),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
                bound = f"from {low} to {high}" if high is not None else f"{low} or more"
                raise BadOptionError(f"{flag} {value}: must be a whole number {bound}")
        if self.address is not None:
            match = RAY_ADDRESS.match(self.address)
            if not match or (match["port"] is not None and not 1 <= int(match["port"]) <= 65535):
                raise BadOptionError(
                    f"--ray-address {self.address!r}: not a Ray address",
                    "write auto, HOST:PORT of the head node (e.g. 10.0.0.1:6379) or ray://HOST:PORT of its client server",
                )

    @property
    def endpoint(self) -> tuple[str, int] | None:
        """(host, port) that --ray-address names, or None for auto, local or none."""
        match = RAY_ADDRESS.match(self.address or "")
        if not match or match["port"] is None:
            return None
        return match["host"].strip("[]"), int(match["port"])


# --- verify --------------------------------------------------------------------------------------

Notice = Callable[[str], None]  # a one-line message for the user (the CLI prints it on stderr)
# (phase, done, total); phases: scan, source (compared and hashed), source-data (hashed only), moe, npu
VerifyProgress = Callable[[str, int, int], None]

# Defaults of the numerical thresholds: the quant-type table's (see docs/verify.md for how they were
# chosen). The SQNR options are per weight element format: --min-sqnr-mxfp4 covers every E2M1 type.
DEFAULT_MIN_SQNR_MXFP8 = QUANT_TYPES[W8A8_MXFP8].min_sqnr_db
DEFAULT_MIN_SQNR_MXFP4 = QUANT_TYPES[W4A8_MXFP].min_sqnr_db
DEFAULT_MAX_MOE_REL_ERR = {name: t.moe_rel_err for name, t in QUANT_TYPES.items()}
DEFAULT_NPU_TOL = 0.05
MAX_MOE_TOKENS = 8192  # activations of (tokens, hidden) floats per sampled layer stay under a GB
DEFAULT_TOP = 10  # worst tensors verify's table shows


def check_top(top: int) -> None:
    """--top: how many of the worst tensors the report's table shows (0: none)."""
    if top < 0:
        raise BadOptionError(f"--top {top}: must be 0 or more", "it is how many of the worst tensors the table shows")


@dataclass
class VerifyOptions:
    # the deployment checked; None: as recorded at conversion, else Deployment's default (verify
    # returns the options it used, with the values it chose)
    tp: int | None = None
    ep: bool | None = None  # expert parallelism: routed experts are not split over the tp ranks
    checksums: bool = True
    source: str | os.PathLike | None = None
    min_sqnr_mxfp8: float = DEFAULT_MIN_SQNR_MXFP8
    min_sqnr_mxfp4: float = DEFAULT_MIN_SQNR_MXFP4
    exact: str = "off"  # off | sample | full
    exact_rows: int = 8  # rows per tensor when exact == "sample"
    sample: float = 1.0  # share of each weight's tile rows --source re-derives (1: every row)
    moe_check: bool = False
    moe_layers: int = 2  # 0: every MoE layer
    moe_tokens: int = 64
    beta: float = 4.0
    linear_beta: float = 25.0
    max_moe_rel_err: float | None = None  # None: DEFAULT_MAX_MOE_REL_ERR by expert type
    on_npu: bool = False
    npu_tol: float = DEFAULT_NPU_TOL
    seed: int = 0

    def validate(self) -> None:
        if self.tp is not None and self.tp < 1:
            raise BadOptionError(f"--tp {self.tp}: the tensor-parallel size must be at least 1")
        if self.exact not in ("off", "sample", "full"):
            raise BadOptionError(f"exact={self.exact!r}: choose off, sample or full")
        if self.exact_rows < 1:
            raise BadOptionError("--exact-rows must be at least 1")
        if not (isinstance(self.sample, (int, float)) and 0.0 < self.sample <= 1.0):
            raise BadOptionError(f"--sample {self.sample}: choose a fraction in (0, 1]", "1 re-derives every row")
        if self.sample < 1.0 and self.exact == "full":
            raise BadOptionError("--sample and --exact-full contradict each other", "--exact-full checks every row")
        if self.source is None and (self.exact != "off" or self.moe_check or self.sample < 1.0):
            exact_flag = {"sample": "--exact", "full": "--exact-full"}.get(self.exact)
            flag = "--moe-check" if self.moe_check else (exact_flag or f"--sample {self.sample:g}")
            raise BadOptionError(f"{flag} needs --source SRC", "pass the checkpoint the package came from")
        if self.moe_layers < 0 or not 1 <= self.moe_tokens <= MAX_MOE_TOKENS:
            raise BadOptionError(f"--moe-layers must be >= 0 and --moe-tokens from 1 to {MAX_MOE_TOKENS}")
        if self.seed < 0:
            raise BadOptionError(f"--seed {self.seed}: must be 0 or more (it seeds numpy's generator)")
        for name in ("beta", "linear_beta", "npu_tol"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise BadOptionError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
        for name in ("min_sqnr_mxfp8", "min_sqnr_mxfp4"):
            if not math.isfinite(getattr(self, name)):
                raise BadOptionError(f"--{name.replace('_', '-')} must be a finite number of dB, got {getattr(self, name)}")
        if self.max_moe_rel_err is not None and not self.max_moe_rel_err > 0:
            raise BadOptionError("--max-moe-rel-err must be > 0")

    def min_sqnr(self, quant_type: str) -> float | None:
        """The least SQNR of a weight of `quant_type` (None: FLOAT, which must be exact)."""
        known = QUANT_TYPES.get(quant_type)
        element = known.element if known else None
        return {E4M3: self.min_sqnr_mxfp8, E2M1: self.min_sqnr_mxfp4}.get(element)

    def moe_limit(self, quant_type: str) -> float:
        return self.max_moe_rel_err if self.max_moe_rel_err is not None else DEFAULT_MAX_MOE_REL_ERR[quant_type]

