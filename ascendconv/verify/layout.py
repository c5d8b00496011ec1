"""The package as the loader sees it: its shards, tensors and linears (headers and JSON only: no numpy,
so `verify OUT` starts fast; the row reads that need numpy are in `rows`)."""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Iterator

from ascendconv.ascendv1 import quant_type_named
from ascendconv.io.package import Package
from ascendconv.io.safetensors import SafetensorsHeader, TensorEntry
from ascendconv.models import rules_for


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
        quant_type = quant_type_named(self.label)
        return self.weight.shape[1] * (quant_type.k_per_byte if quant_type else 1)


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

    @functools.cached_property
    def _deployment(self):
        from ascendconv.decide import Deployment

        recorded = self.pkg.record.deployment or {}
        return Deployment(shared_experts_as_routed=recorded.get("shared_experts_as_routed") is True)

    def as_expert(self, prefix: str) -> bool:
        """Whether the module takes the routed experts' rules, as the planner decided it
        (decide.module_group): a routed expert, or a shared one under --shared-experts-as-routed."""
        from ascendconv.decide import module_group

        return module_group(prefix, self.rules.routed_expert(prefix), self.rules, self._deployment)[1]

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
