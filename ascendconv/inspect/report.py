"""What `inspect_path` returns: the report and its parts, each with the `to_dict()` of the stable
`--json` document described in docs/inspect.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1

# A convertible checkpoint is `hf-block-fp8` (the one kind before there were other source formats,
# kept so that its consumers keep working) or `source`, whose format `quantization.format` names
KIND_SOURCE = "hf-block-fp8"
KIND_OTHER_SOURCE = "source"
KIND_PACKAGE = "ascendv1-package"
KIND_PLAIN = "hf-plain"
KIND_LABELS = {
    KIND_PACKAGE: "AscendV1 package",
    KIND_PLAIN: "Hugging Face checkpoint, not quantized",
}
HF_BLOCK_FP8_FORMAT = "hf-fp8-block"  # sources/hf_fp8_block.py's name


def source_kind(format_name: str) -> str:
    return KIND_SOURCE if format_name == HF_BLOCK_FP8_FORMAT else KIND_OTHER_SOURCE


@dataclass(frozen=True)
class CountBytes:
    tensors: int
    bytes: int

    def to_dict(self) -> dict:
        return {"tensors": self.tensors, "bytes": self.bytes}


@dataclass(frozen=True)
class ShardInfo:
    file: str
    tensors: int | None  # None: the header could not be read (packages only)
    bytes: int  # file size

    def to_dict(self) -> dict:
        return {"file": self.file, "tensors": self.tensors, "bytes": self.bytes}


@dataclass(frozen=True)
class TensorRow:
    name: str
    dtype: str
    shape: tuple[int, ...]
    quant_type: str | None  # None: a package tensor missing from the description
    shard: str
    bytes: int

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "quant_type": self.quant_type,
            "shard": self.shard,
            "bytes": self.bytes,
        }


@dataclass
class ModuleGroup:
    """Modules (2-D `.weight` tensors) whose names differ only in layer / expert numbers."""

    pattern: str
    modules: int
    types: dict[str, int]  # quant type as stored -> modules
    dtypes: dict[str, int]  # weight dtype as stored -> modules
    schemes: dict[str, dict[str, int]] | None = None  # source: scheme -> written type -> modules

    def to_dict(self) -> dict:
        return {
            "pattern": self.pattern,
            "modules": self.modules,
            "types": dict(self.types),
            "dtypes": dict(self.dtypes),
            "schemes": None if self.schemes is None else {s: dict(t) for s, t in self.schemes.items()},
        }


@dataclass(frozen=True)
class Fallback:
    module: str
    pattern: str
    requested: str
    written: str
    reason: str

    def to_dict(self) -> dict:
        return {"module": self.module, "requested": self.requested, "written": self.written, "reason": self.reason}


@dataclass
class SchemeEstimate:
    """What `convert --scheme S` would write (default options), from the planner alone."""

    scheme: str
    model_quant_type: str
    modules: dict[str, int]  # source linears per written type
    tensors: dict[str, int]  # package tensors per description label
    bytes_out: int  # tensor data bytes of the package
    shards: int  # at the default 4 GiB shard limit
    fallbacks: list[Fallback]
    kept_float: dict[str, int]  # modules the model's rules keep FLOAT, per reason
    runtime: list[str]  # what vllm-ascend will run with this package

    def to_dict(self) -> dict:
        return {
            "model_quant_type": self.model_quant_type,
            "kept_float": dict(self.kept_float),
            "runtime": list(self.runtime),
            "modules": dict(self.modules),
            "tensors": dict(self.tensors),
            "bytes_out": self.bytes_out,
            "shards": self.shards,
            "fallbacks": [f.to_dict() for f in self.fallbacks],
        }


@dataclass
class InspectReport:
    kind: str  # KIND_SOURCE, KIND_OTHER_SOURCE, KIND_PACKAGE or KIND_PLAIN
    path: Path
    model: dict  # model_type, architectures, num_hidden_layers, num_experts (from config.json)
    quantization: dict | None  # a source's quantization_config, summarised
    package: dict | None  # a package's description fields and provenance summary
    shards: list[ShardInfo]
    index: str | None  # the index file's name, if there is one
    total_bytes: int  # sum of shard file sizes
    tensor_bytes: int  # sum of tensor data sizes
    tensor_count: int
    by_dtype: dict[str, CountBytes]
    by_quant_type: dict[str, CountBytes]
    layers: int
    moe_layers: int
    routed_experts: int  # distinct expert numbers (the most any layer has)
    fp8_linears: int
    groups: list[ModuleGroup]
    schemes: dict[str, SchemeEstimate] | None  # source only
    family: str = "generic"  # the model knowledge applied (models.py)
    mtp_layers: list[str] = field(default_factory=list)  # 'model.layers.61', 'mtp'
    shared_expert_layers: int = 0  # MoE layers with a shared expert
    indexer_layers: int = 0  # layers with a DeepSeek-V3.2 indexer
    deployment: dict | None = None  # source only: the --tp / --ep / --shared-experts-as-routed planned for
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tensor_filter: str | None = None
    tensors: list[TensorRow] | None = None  # only when asked for
    hub: dict | None = None  # {"repo_id", "revision"} when `path` is a snapshot of the Hugging Face cache

    @property
    def title(self) -> str:
        """What the report is of: the repo id of a cached snapshot (its directory is a commit hash), else the directory."""
        return self.hub["repo_id"] if self.hub else (self.path.name or str(self.path))

    @property
    def label(self) -> str:
        if self.kind in (KIND_SOURCE, KIND_OTHER_SOURCE):
            return f"{self.quantization['label']} checkpoint"
        return KIND_LABELS[self.kind]

    def to_dict(self) -> dict:
        return {
            "ok": True,
            "schema": SCHEMA_VERSION,
            "kind": self.kind,
            "path": str(self.path),
            "hub": None if self.hub is None else dict(self.hub),
            "model": dict(self.model),
            "quantization": None if self.quantization is None else dict(self.quantization),
            "package": None if self.package is None else dict(self.package),
            "files": {
                "shards": [s.to_dict() for s in self.shards],
                "index": self.index,
                "total_bytes": self.total_bytes,
                "tensor_bytes": self.tensor_bytes,
            },
            "tensors": {
                "count": self.tensor_count,
                "by_dtype": {k: v.to_dict() for k, v in self.by_dtype.items()},
                "by_quant_type": {k: v.to_dict() for k, v in self.by_quant_type.items()},
            },
            "structure": {
                "family": self.family,
                "layers": self.layers,
                "moe_layers": self.moe_layers,
                "routed_experts": self.routed_experts,
                "shared_expert_layers": self.shared_expert_layers,
                "mtp_layers": list(self.mtp_layers),
                "indexer_layers": self.indexer_layers,
                "fp8_linears": self.fp8_linears,
            },
            "deployment": None if self.deployment is None else dict(self.deployment),
            "warnings": list(self.warnings),
            "groups": [g.to_dict() for g in self.groups],
            "schemes": None if self.schemes is None else {s: e.to_dict() for s, e in self.schemes.items()},
            "problems": list(self.problems),
            "tensor_filter": self.tensor_filter,
            "tensor_list": None if self.tensors is None else [t.to_dict() for t in self.tensors],
        }
