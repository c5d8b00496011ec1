"""What verify returns: named checks, per-tensor error figures, MoE and NPU results."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ascendconv.ascendv1 import Provenance
from ascendconv.options import VerifyOptions

# Where a checked --tp / --ep came from, besides ascendv1.RECORDED and UNREADABLE (recorded in a
# form verify cannot read): the caller's options, or Deployment's default (none recorded).
GIVEN, DEFAULT = "given", "default"


def _finite(x: float | None) -> float | None:
    """JSON has no inf / nan: those become null (an SQNR of null means exact)."""
    return x if x is not None and math.isfinite(x) else None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    problems: list[str] = field(default_factory=list)
    hint: str = ""
    skipped: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TensorReport:
    """One converted linear weight against the resolved source."""

    name: str
    type: str
    rel_err: float
    sqnr_db: float
    max_abs: float
    saturated: float  # share of element codes at the format's largest magnitude
    min_sqnr_db: float | None  # threshold; None for FLOAT, which must be exact
    ok: bool

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "type": self.type,
            "rel_err": _finite(self.rel_err),
            "sqnr_db": _finite(self.sqnr_db),
            "max_abs": _finite(self.max_abs),
            "saturated": self.saturated,
            "min_sqnr_db": self.min_sqnr_db,
            "ok": self.ok,
        }


@dataclass
class MoeReport:
    """One sampled MoE layer: the GroupedMatmulSituQuant chain with package vs source experts."""

    layer: str
    type: str
    path: str  # how the package side was computed
    experts: int
    experts_used: int
    tokens: int
    rel_err_situ: float  # SiTU output (before the op's MX quantization): the weights' share
    rel_err: float  # expert output after down_proj, the SiTU output quantized as its type does: what the model sees
    max_rel_err: float
    ok: bool
    # the same expert output against the source chain on the BF16 activations, nothing quantized but
    # the weights: what the type's activation quantization costs too (W4A4 against W4A8, W4A16)
    rel_err_bf16: float = float("nan")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rel_err_situ"], d["rel_err"] = _finite(self.rel_err_situ), _finite(self.rel_err)
        d["rel_err_bf16"] = _finite(self.rel_err_bf16)
        return d


@dataclass
class NpuReport:
    """The fused op on the NPU against the CPU reference, for one MoE layer."""

    layer: str
    experts_used: int
    tokens: int
    rel_err: float
    codes_equal: float  # share of output E4M3 codes equal to the reference
    scales_equal: float  # share of output E8M0 scale bytes equal to the reference
    tol: float
    ok: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rel_err"] = _finite(self.rel_err)
        return d


@dataclass
class VerifyReport:
    package: Path
    checks: list[Check]
    tensors: list[TensorReport]
    moe: list[MoeReport]
    npu: list[NpuReport]
    provenance: dict | None
    options: VerifyOptions
    seconds: float
    # the --tp / --ep checked: {"tp", "ep", "from": {"tp", "ep"} (GIVEN, "recorded", DEFAULT or
    # "unreadable"), "recorded": Provenance.deployment}
    deployment: dict | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def skipped(self) -> list[Check]:
        """Checks that compared nothing (no provenance, no index, the wrong source): not passes."""
        return [c for c in self.checks if c.ok and c.skipped]

    @property
    def passed(self) -> list[Check]:
        return [c for c in self.checks if c.ok and not c.skipped]

    def tally(self) -> str:
        """'17 passed, 1 skipped' (and the failed ones, if any)."""
        counts = [(len(self.passed), "passed"), (len(self.skipped), "skipped"), (len(self.failed), "failed")]
        return ", ".join(f"{n} {what}" for n, what in counts if n or what == "passed")

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict:
        options = asdict(self.options)
        options["source"] = None if self.options.source is None else str(self.options.source)
        return {
            "ok": self.ok,
            "package": str(self.package),
            "failed": [c.name for c in self.failed],
            "skipped": [c.name for c in self.skipped],
            "checks": [c.to_dict() for c in self.checks],
            "tensors": [t.to_dict() for t in self.tensors],
            "moe": [m.to_dict() for m in self.moe],
            "npu": [n.to_dict() for n in self.npu],
            "provenance": Provenance(self.provenance).details() if self.provenance else None,
            "options": options,
            "deployment": None if self.deployment is None else {**self.deployment, "from": dict(self.deployment["from"])},
            "seconds": round(self.seconds, 3),
        }
