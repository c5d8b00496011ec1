"""The views every verify report draws, computed from `VerifyReport.to_dict()` alone (the schema
docs/verify.md fixes): the per-layer x module-kind grid of SQNR, the figures per quant type, the
fallbacks and the FLOAT modules. The HTML and Markdown reports and the terminal's per-layer strip
show these; none of them reads the package or regroups the data on its own."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ascendconv.errors import json_text, plural

# 'model.layers.12.mlp.experts.37.down_proj.weight' -> root 'model.', layer 12, the rest
_LAYER = re.compile(r"^(?P<root>(?:.*\.)?)layers\.(?P<layer>\d+)\.(?P<rest>.+)$")
_NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")
PLAIN_ROOTS = ("", "model.", "model.language_model.")  # the decoder's layers: shown by number alone
OUTSIDE = "outside the layers"


def _pattern(name: str) -> str:
    return _NUMBER.sub("*", name)


def _sqnr(tensor: dict) -> float:
    """A tensor's SQNR in dB; null in the report means exact (no error at all)."""
    value = tensor.get("sqnr_db")
    return math.inf if value is None else float(value)


def row_key(name: str) -> tuple[str, int, str]:
    """(row label, sort number, module kind) of a weight's name; kinds have their numbers as '*'."""
    kind_of = lambda rest: _pattern(rest.removesuffix(".weight"))  # noqa: E731
    match = _LAYER.match(name)
    if match is None:
        return OUTSIDE, 10**9, kind_of(name)
    root, layer = match["root"], int(match["layer"])
    label = str(layer) if root in PLAIN_ROOTS else f"{root}layers.{layer}"
    return label, layer + (0 if root in PLAIN_ROOTS else 10**6), kind_of(match["rest"])


@dataclass
class Cell:
    """The weights of one layer and one module kind (all experts of a MoE projection together)."""

    worst_db: float = math.inf
    worst: str = ""
    tensors: int = 0
    failed: int = 0
    types: dict[str, int] = field(default_factory=dict)

    def add(self, tensor: dict) -> None:
        db = _sqnr(tensor)
        if self.tensors == 0 or db < self.worst_db:
            self.worst_db, self.worst = db, tensor["name"]
        self.tensors += 1
        self.failed += not tensor.get("ok", True)
        self.types[tensor["type"]] = self.types.get(tensor["type"], 0) + 1

    @property
    def type_label(self) -> str:
        return "/".join(self.types)


@dataclass
class Grid:
    rows: list[str]  # layer labels, in layer order ('outside the layers' last)
    kinds: list[str]  # module kinds, in name order
    cells: dict[tuple[str, str], Cell]

    @property
    def measured(self) -> list[float]:
        """The finite worst SQNRs of the cells, for the colour scale."""
        return [c.worst_db for c in self.cells.values() if math.isfinite(c.worst_db)]


def layer_grid(report: dict) -> Grid:
    order: dict[str, int] = {}
    cells: dict[tuple[str, str], Cell] = {}
    for tensor in report.get("tensors", []):
        label, number, kind = row_key(tensor["name"])
        order[label] = number
        cells.setdefault((label, kind), Cell()).add(tensor)
    rows = sorted(order, key=lambda label: (order[label], label))
    kinds = sorted({kind for _, kind in cells})
    return Grid(rows, kinds, cells)


@dataclass
class TypeFigures:
    quant_type: str
    sqnr_db: list[float]  # finite values, sorted
    exact: int  # tensors with no error at all
    failed: int
    threshold: float | None

    @property
    def count(self) -> int:
        return len(self.sqnr_db) + self.exact

    def quantile(self, q: float) -> float | None:
        if not self.sqnr_db:
            return None
        return self.sqnr_db[min(len(self.sqnr_db) - 1, int(q * len(self.sqnr_db)))]


def type_figures(report: dict) -> list[TypeFigures]:
    by_type: dict[str, TypeFigures] = {}
    for tensor in report.get("tensors", []):
        figures = by_type.setdefault(tensor["type"], TypeFigures(tensor["type"], [], 0, 0, tensor.get("min_sqnr_db")))
        db = _sqnr(tensor)
        if math.isfinite(db):
            figures.sqnr_db.append(db)
        else:
            figures.exact += 1
        figures.failed += not tensor.get("ok", True)
    for figures in by_type.values():
        figures.sqnr_db.sort()
    return sorted(by_type.values(), key=lambda f: f.quant_type)


def histogram(values: list[float], bins: int = 24) -> list[tuple[float, float, int]]:
    """(low, high, count) of equal-width bins over the values' range (one bin when all are equal)."""
    if not values:
        return []
    low, high = values[0], values[-1]
    if high - low < 1e-9:
        return [(low, high, len(values))]
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - low) / width))] += 1
    return [(low + i * width, low + (i + 1) * width, n) for i, n in enumerate(counts)]


def fallback_groups(report: dict) -> list[tuple[str, int, str, str, str]]:
    """(module pattern, modules, requested, written, reason) of the recorded fallbacks, merged over
    layers and experts; a user's --override is shown as it was given."""
    from ascendconv.package_files import reason_pattern

    merged: dict[tuple[str, str, str, str], int] = {}
    for fb in (report.get("provenance") or {}).get("fallbacks") or []:
        key = (_pattern(fb["module"]), fb["requested"], fb["written"], reason_pattern(fb["reason"]))
        merged[key] = merged.get(key, 0) + 1
    return [(pattern, n, requested, written, reason) for (pattern, requested, written, reason), n in merged.items()]


def float_modules(report: dict) -> list[tuple[str, int, int]]:
    """(module pattern, FLOAT weights, of which exact) among the measured weights."""
    merged: dict[str, list[int]] = {}
    for tensor in report.get("tensors", []):
        if tensor["type"] == "FLOAT":
            counts = merged.setdefault(_pattern(tensor["name"].removesuffix(".weight")), [0, 0])
            counts[0] += 1
            counts[1] += tensor.get("ok", True) and not math.isfinite(_sqnr(tensor))
    return [(pattern, n, exact) for pattern, (n, exact) in sorted(merged.items())]


def provenance_rows(report: dict) -> list[tuple[str, str]]:
    """How the package was made, as label-value pairs (values as recorded, any type shown as text:
    a string as it is, anything else as JSON spells it, so a missing version is null, not None)."""
    prov = report.get("provenance")
    if not prov:
        return [("provenance", "none: not written by ascendconv, or its provenance file is missing")]
    hub = prov.get("hub")
    deployment = prov.get("deployment")
    said = {key: json_text(prov.get(key)) for key in ("version", "kernel", "scheme", "scale_rule", "resolve_dtype", "source")}
    rows = [
        ("written by", f"ascendconv {said['version']}, kernel {said['kernel']}"),
        ("scheme", f"{said['scheme']}, rule {said['scale_rule']}, resolve {said['resolve_dtype']}"),
        ("source", f"{hub['repo_id']} at revision {hub['revision']}" if hub else said["source"]),
    ]
    if deployment:
        rows.append(("planned for", f"--tp {deployment['tp']}" + (" --ep" if deployment["ep"] else "")
                     + (" --shared-experts-as-routed" if deployment["shared_experts_as_routed"] else "")))
    if prov.get("overrides"):
        rows.append(("overrides", ", ".join(prov["overrides"])))
    for key in ("command", "date"):
        if prov.get(key):
            rows.append((key, prov[key]))
    return rows


def verdict(report: dict) -> str:
    checks = report.get("checks", [])
    passed = sum(1 for c in checks if c["ok"] and not c.get("skipped"))
    if report.get("ok"):
        return f"OK: {plural(passed, 'check')} passed"
    return f"FAILED: {plural(len(report.get('failed', [])), 'check')} failed: {', '.join(report.get('failed', []))}"


def check_result(check: dict) -> str:
    return "FAIL" if not check["ok"] else ("skip" if check.get("skipped") else "pass")
