"""Headers-only report of what a directory holds: an HF block-FP8 checkpoint, an AscendV1 package,
or a plain (BF16/F16/F32) HF checkpoint.

`inspect_path` reads config.json, the index and every shard's header, and nothing else: no tensor
byte is read, so a 1,000-shard checkpoint is inspected in seconds. For a block-FP8 source it
also runs the pure planner once per scheme to say what `convert` would produce. For a package it
collects (never fixes) the disagreements between description, index and shards; `verify` is the
full check. Nothing here prints: the result is an `InspectReport` whose `to_dict()` is the stable
`--json` document described in docs/inspect.md.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ascendconv.convert import planner_for
from ascendconv.errors import PackageError, UnrecognizedCheckpointError, shown
from ascendconv.formats.constants import FLOAT, GROUP_SIZE, W8A8_MXFP8
from ascendconv.gcpause import gc_paused
from ascendconv.io.files import file_size
from ascendconv.io.hfcache import resolve_source
from ascendconv.io.package import Package, is_package
from ascendconv.io.safetensors import TensorEntry, read_header
from ascendconv.io.source import (
    INDEX_NAME as SOURCE_INDEX_NAME,
    WEIGHT_SUFFIX,
    SourceCheckpoint,
    discover_shards,
    find_quantization_config,
    load_config,
    merge_headers,
)
from ascendconv.models import ModelRules, expert_count, model_type_of, rules_for
from ascendconv.ascendv1 import DESCRIPTION_NAME, RANK
from ascendconv.plan import SCHEMES, Deployment, Plan, module_pattern
from ascendconv.ascendv1 import INDEX_NAME as PACKAGE_INDEX_NAME

SCHEMA_VERSION = 1

KIND_SOURCE = "hf-block-fp8"
KIND_PACKAGE = "ascendv1-package"
KIND_PLAIN = "hf-plain"
KIND_LABELS = {
    KIND_SOURCE: "Hugging Face block-FP8 checkpoint",
    KIND_PACKAGE: "AscendV1 package",
    KIND_PLAIN: "Hugging Face checkpoint, not quantized",
}

# Quant type of a source tensor: an F8_E4M3 weight and its weight_scale_inv are "FP8_BLOCK" (the
# package labels an MX weight and its scale alike), everything else is FLOAT.
FP8_BLOCK = "FP8_BLOCK"
UNDESCRIBED = "(undescribed)"  # a package tensor without an entry in the description
PLAIN_DTYPES = ("BF16", "F16", "F32", "F64")  # a float checkpoint holds these (and maybe integers)
FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def natural_key(text: str) -> tuple:
    """Sort key that puts layers.2 before layers.10."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text) if p)


# --- the report -----------------------------------------------------------------------------------


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
    kind: str  # KIND_SOURCE, KIND_PACKAGE or KIND_PLAIN
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

    @property
    def label(self) -> str:
        return KIND_LABELS[self.kind]

    def to_dict(self) -> dict:
        return {
            "ok": True,
            "schema": SCHEMA_VERSION,
            "kind": self.kind,
            "path": str(self.path),
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


# --- shared pieces ------------------------------------------------------------------------------


def _model_summary(config: dict | None) -> dict:
    config = config or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    architectures = config.get("architectures")

    def pick(*keys):
        for source in (config, text):
            for key in keys:
                if isinstance(source.get(key), int):
                    return source[key]
        return None

    return {
        "model_type": model_type_of(config),
        "architectures": [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else [],
        "num_hidden_layers": pick("num_hidden_layers"),
        "num_experts": expert_count(config),
    }


def _tally(tensors: dict[str, TensorEntry], quant_type_of) -> tuple[dict[str, CountBytes], dict[str, CountBytes]]:
    by_dtype: dict[str, list[int]] = {}
    by_type: dict[str, list[int]] = {}
    for name, entry in tensors.items():
        for table, key in ((by_dtype, entry.dtype), (by_type, quant_type_of(name) or UNDESCRIBED)):
            slot = table.setdefault(key, [0, 0])
            slot[0] += 1
            slot[1] += entry.nbytes

    def ordered(table: dict[str, list[int]]) -> dict[str, CountBytes]:
        return {k: CountBytes(*table[k]) for k in sorted(table, key=lambda k: (-table[k][1], k))}

    return ordered(by_dtype), ordered(by_type)


@dataclass
class _Structure:
    layers: int = 0
    moe_layers: int = 0
    routed_experts: int = 0
    shared_expert_layers: int = 0
    mtp_layers: list[str] = field(default_factory=list)
    indexer_layers: int = 0

    def fields(self) -> dict:
        return dict(self.__dict__)


def _structure(names, rules: ModelRules) -> _Structure:
    """Layers, MoE layers, experts, MTP layers and indexers from tensor names, by the model's rules."""
    layers: set[str] = set()
    mtp: dict[str, None] = {}
    experts: dict[str, set[str]] = {}
    shared: set[str] = set()
    indexers: set[str] = set()
    for prefix in {name.rpartition(".")[0] for name in names}:  # a module's tensors share a prefix
        mtp_label = rules.mtp_label(prefix)
        if mtp_label is not None:
            mtp[mtp_label] = None
        else:
            layer = _LAYER.search(prefix)
            if layer:
                layers.add(layer[1])
        routed = rules.routed_expert(prefix)
        if routed:
            experts.setdefault(routed["layer"], set()).add(routed["expert"])
            continue
        shared_in = rules.shared_expert_layer(prefix)
        if shared_in is not None:
            shared.add(shared_in)
        elif ".indexer." in prefix:
            indexers.add(prefix.partition(".indexer.")[0])
    return _Structure(
        layers=len(layers),
        moe_layers=len(experts),
        routed_experts=max((len(e) for e in experts.values()), default=0),
        shared_expert_layers=len(shared),
        mtp_layers=sorted(mtp, key=natural_key),
        indexer_layers=len(indexers),
    )


def _module_weights(tensors: dict[str, TensorEntry]) -> dict[str, TensorEntry]:
    """Module prefix -> its weight, for every `.weight` of two or more dimensions."""
    return {
        name[: -len(WEIGHT_SUFFIX)]: entry
        for name, entry in tensors.items()
        if name.endswith(WEIGHT_SUFFIX) and len(entry.shape) >= 2
    }


def _groups(
    modules: dict[str, TensorEntry], type_of, scheme_types: dict[str, dict[str, str]] | None = None
) -> list[ModuleGroup]:
    grouped: dict[str, list[str]] = {}
    for prefix in modules:
        grouped.setdefault(module_pattern(prefix), []).append(prefix)
    groups = []
    for pattern in sorted(grouped, key=natural_key):
        members = grouped[pattern]
        schemes = None
        if scheme_types is not None:
            schemes = {
                scheme: _count(written.get(m, FLOAT) for m in members) for scheme, written in scheme_types.items()
            }
        groups.append(
            ModuleGroup(
                pattern,
                len(members),
                _count(type_of(m) or UNDESCRIBED for m in members),
                _count(modules[m].dtype for m in members),
                schemes,
            )
        )
    return groups


def _count(values) -> dict[str, int]:
    counts = Counter(values)
    return {k: counts[k] for k in sorted(counts, key=lambda k: (RANK.get(k, -1), k))}


def _rows(tensors: dict[str, TensorEntry], glob: str | None, quant_type_of) -> list[TensorRow] | None:
    if glob is None:
        return None
    names = sorted((n for n in tensors if fnmatch.fnmatchcase(n, glob)), key=natural_key)
    return [
        TensorRow(n, tensors[n].dtype, tensors[n].shape, quant_type_of(n), tensors[n].path.name, tensors[n].nbytes)
        for n in names
    ]


def runtime_notes(plan: Plan) -> list[str]:
    """What vllm-ascend will run with the package this plan writes, in short sentences."""
    notes = []
    by_group: dict[str, str] = {d.group: d.written for d in plan.decisions.values()}
    moe = Counter(t for g, t in by_group.items() if g.endswith(".experts"))
    if moe:
        types = ", ".join(f"{n} {t}" for t, n in sorted(moe.items(), key=lambda kv: -RANK[kv[0]]))
        notes.append(f"MoE layers: {types} (FLOAT experts run the unquantized fused MoE)")
    if plan.rules.family.mla:
        # vllm-ascend enables the fused MLA prolog (VLLM_ASCEND_ENABLE_MLAPO) only where the layer's
        # fused_qkv_a_proj (q_a_proj + kv_a_proj_with_mqa) is W8A8 (MXFP8 on Ascend 950); elsewhere it
        # turns it off for that layer with a warning
        qkv_a = Counter(t for g, t in by_group.items() if g.endswith(".fused_qkv_a_proj"))
        off = sum(n for t, n in qkv_a.items() if t != W8A8_MXFP8)
        if qkv_a and off:
            kinds = "/".join(sorted({t for t in qkv_a if t != W8A8_MXFP8}))
            notes.append(
                f"fused MLA prolog (VLLM_ASCEND_ENABLE_MLAPO) off in {off} of {sum(qkv_a.values())} layers: "
                f"q_a_proj/kv_a_proj_with_mqa are {kinds}, it needs W8A8_MXFP8"
            )
        elif qkv_a:
            notes.append("fused MLA prolog (VLLM_ASCEND_ENABLE_MLAPO) available: q_a_proj/kv_a_proj_with_mqa are W8A8_MXFP8")
    for reason, count in plan.kept_float().items():
        notes.append(f"{count} modules FLOAT: {reason}")
    mtp_quantized = plan.quantized_mtp_modules()
    if mtp_quantized:
        notes.append(f"{mtp_quantized} MTP modules quantized by --override: vllm-ascend expects the MTP layer FLOAT")
    if plan.fallbacks:
        notes.append(f"{len(plan.fallbacks)} fallbacks (see fallbacks), planned for --tp {plan.deployment.tp}"
                     + (" --ep" if plan.deployment.ep else ""))
    mixed = _shared_vs_routed(plan)
    if mixed:
        notes.append(
            f"{mixed} MoE layers hold shared experts of another type than their routed experts: do not enable "
            "mix_placement, or convert with --shared-experts-as-routed"
        )
    return notes


def _shared_vs_routed(plan: Plan) -> int:
    """MoE layers whose shared expert is written in another type than their routed experts."""
    routed: dict[str, str] = {}
    shared: dict[str, str] = {}
    for decision in plan.decisions.values():
        if decision.group.endswith(".experts"):  # a MoE layer's group: 'model.layers.3.mlp.experts'
            routed[decision.group[: -len(".experts")]] = decision.written
            continue
        layer = plan.rules.shared_expert_layer(decision.module)
        if layer is not None:
            shared[layer] = decision.written
    return sum(1 for layer, t in shared.items() if layer in routed and routed[layer] != t)


# --- the three kinds ------------------------------------------------------------------------------


@gc_paused()  # a full-scale report builds several hundred thousand objects and no cycles
def inspect_path(
    path: str | os.PathLike, tensors: str | None = None, deployment: Deployment | None = None
) -> InspectReport:
    """Recognise what `path` holds and report on it from headers alone.

    `path` is a directory or a Hugging Face repo id present in the local cache (never downloaded).
    `tensors` is a glob on tensor names: when given, the report lists the matching tensors ("*" for
    all). `deployment` (--tp, --ep, --shared-experts-as-routed) is what a source's per-scheme plans
    are made for. Raises a project error (exit code 3) for anything that is not a block-FP8 checkpoint, a
    plain float checkpoint or an AscendV1 package, and for a source whose headers are invalid.
    """
    root = resolve_source(str(path))
    if root.is_file():
        raise UnrecognizedCheckpointError(f"{root}: is a file; inspect takes a directory")
    if is_package(root):
        return _inspect_package(root, tensors)
    if any(root.glob("quant_model_weights*.safetensors")):
        raise PackageError(
            f"{root}: holds quant_model_weights*.safetensors but no {DESCRIPTION_NAME}",
            "the package is incomplete; convert the checkpoint again",
        )
    config, config_path = load_config(root)
    quant, _ = find_quantization_config(config)
    if quant is not None:
        return _inspect_source(root, tensors, deployment or Deployment())
    return _inspect_plain(root, config, config_path, tensors)


def _inspect_source(root: Path, glob: str | None, deployment: Deployment) -> InspectReport:
    source = SourceCheckpoint.open(root)  # named errors for every header-level problem
    try:
        quant = source.quant
        scale_names = source.scale_names
        fp8_names = {linear.weight.name for linear in source.linears.values()} | scale_names

        def quant_type_of(name: str) -> str:
            return FP8_BLOCK if name in fp8_names else FLOAT

        estimates: dict[str, SchemeEstimate] = {}
        written: dict[str, dict[str, str]] = {}
        planner = planner_for(source, deployment)
        for scheme in SCHEMES:
            plan = planner.plan(scheme)
            written[scheme] = {m: d.written for m, d in plan.decisions.items()}
            estimates[scheme] = SchemeEstimate(
                scheme=scheme,
                model_quant_type=plan.model_quant_type,
                modules=plan.type_counts(),
                tensors=plan.tensor_counts(),
                bytes_out=plan.bytes_out,
                shards=len(plan.shards),
                fallbacks=[
                    Fallback(d.module, module_pattern(d.module), d.requested, d.written, d.reason)
                    for d in sorted(plan.fallbacks, key=lambda d: natural_key(d.module))
                ],
                kept_float=plan.kept_float(),
                runtime=runtime_notes(plan),
            )
        modules = _module_weights({n: e for n, e in source.tensors.items() if n not in scale_names})
        by_dtype, by_type = _tally(source.tensors, quant_type_of)
        rules = rules_for(source.config)
        structure = _structure(source.tensors, rules)
        index = SOURCE_INDEX_NAME if (root / SOURCE_INDEX_NAME).is_file() else None
        quant_config, _ = find_quantization_config(source.config)
        return InspectReport(
            kind=KIND_SOURCE,
            path=root,
            model=_model_summary(source.config),
            quantization={
                "location": quant.location,
                "quant_method": quant_config.get("quant_method"),
                "weight_block_size": list(quant.block),
                "activation_scheme": quant.activation_scheme,
                "fmt": quant.fmt,
                "scale_fmt": quant.scale_fmt,
                "scale_dtypes": _count(linear.scale.dtype for linear in source.linears.values()),
                "modules_to_not_convert": list(quant.modules_to_not_convert),
            },
            package=None,
            shards=[ShardInfo(h.path.name, len(h.tensors), h.file_size) for h in source.headers],
            index=index,
            total_bytes=source.total_bytes,
            tensor_bytes=sum(e.nbytes for e in source.tensors.values()),
            tensor_count=len(source.tensors),
            by_dtype=by_dtype,
            by_quant_type=by_type,
            **structure.fields(),
            family=rules.family.label,
            deployment=deployment.to_dict(),
            warnings=[rules.warning] if rules.warning else [],
            fp8_linears=len(source.linears),
            groups=_groups(modules, lambda m: FP8_BLOCK if m in source.linears else FLOAT, written),
            schemes=estimates,
            tensor_filter=glob,
            tensors=_rows(source.tensors, glob, quant_type_of),
        )
    finally:
        source.close()


def _inspect_plain(root: Path, config: dict, config_path: Path, glob: str | None) -> InspectReport:
    shard_paths, weight_map = discover_shards(root)
    if not shard_paths:
        raise UnrecognizedCheckpointError(f"{root}: no *.safetensors files")
    headers = [read_header(p) for p in shard_paths]
    tensors = merge_headers(headers, weight_map, root / SOURCE_INDEX_NAME)
    dtypes = {e.dtype for e in tensors.values()}
    fp8 = sorted(dtypes & set(FP8_DTYPES))
    if fp8:
        name = next(n for n, e in tensors.items() if e.dtype in fp8)
        raise UnrecognizedCheckpointError(
            f"{root}: holds {fp8[0]} tensors (e.g. {shown(name)}) but {config_path.name} has no quantization_config",
            "an FP8 checkpoint must describe its quantization in config.json (quant_method 'fp8', "
            "weight_block_size); fix config.json or download the checkpoint again",
        )
    if not dtypes & set(PLAIN_DTYPES):
        raise UnrecognizedCheckpointError(
            f"{root}: no floating-point tensors (dtypes: {', '.join(sorted(dtypes)) or 'none'})",
            "inspect recognises block-FP8 and BF16/F16/F32 Hugging Face checkpoints and AscendV1 packages",
        )
    by_dtype, by_type = _tally(tensors, lambda n: FLOAT)
    rules = rules_for(config)
    structure = _structure(tensors, rules)
    return InspectReport(
        kind=KIND_PLAIN,
        path=root,
        model=_model_summary(config),
        quantization=None,
        package=None,
        shards=[ShardInfo(h.path.name, len(h.tensors), h.file_size) for h in headers],
        index=SOURCE_INDEX_NAME if weight_map is not None else None,
        total_bytes=sum(h.file_size for h in headers),
        tensor_bytes=sum(e.nbytes for e in tensors.values()),
        tensor_count=len(tensors),
        by_dtype=by_dtype,
        by_quant_type=by_type,
        **structure.fields(),
        family=rules.family.label,
        fp8_linears=0,
        groups=_groups(_module_weights(tensors), lambda m: FLOAT),
        schemes=None,
        problems=[],
        tensor_filter=glob,
        tensors=_rows(tensors, glob, lambda n: FLOAT),
    )


def _inspect_package(root: Path, glob: str | None) -> InspectReport:
    package = Package.open(root)
    described = package.description

    def quant_type_of(name: str) -> str | None:
        value = described.get(name)
        return value if isinstance(value, str) else None

    problems = package.disagreements()
    present = {v for v in described.values() if isinstance(v, str)}
    highest = max((t for t in present if t in RANK), key=RANK.__getitem__, default=None)
    declared = package.fields.get("model_quant_type")
    if highest is not None and declared != highest:
        problems.append(f"model_quant_type is {shown(declared)} but the highest type described is {shown(highest)}")
    unknown = sorted(present - set(RANK))
    if unknown:
        problems.append(f"description uses unknown type(s) {', '.join(map(shown, unknown))}")
    if package.fields.get("group_size", GROUP_SIZE) != GROUP_SIZE:
        problems.append(f"group_size is {shown(package.fields.get('group_size'))}, expected {GROUP_SIZE}")
    tensor_bytes = sum(e.nbytes for e in package.tensors.values())
    if package.index is not None:
        metadata = package.index.get("metadata")
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        if total != tensor_bytes and not package.broken_shards:
            problems.append(f"index total_size is {shown(total)} but the shards hold {tensor_bytes} tensor bytes")
    if package.config is not None and find_quantization_config(package.config)[0] is not None:
        problems.append("config.json still has a quantization_config; vLLM would not use the AscendV1 path")

    provenance = package.record
    by_dtype, by_type = _tally(package.tensors, quant_type_of)
    rules = rules_for(package.config)
    structure = _structure(package.tensors, rules)
    shards = [
        ShardInfo(f, len(package.headers[f].tensors) if f in package.headers else None, file_size(root / f))
        for f in package.shard_files
    ]
    return InspectReport(
        kind=KIND_PACKAGE,
        path=root,
        model=_model_summary(package.config),
        quantization=None,
        package={
            "version": package.fields.get("version"),
            "model_quant_type": declared,
            "group_size": package.fields.get("group_size"),
            "described_tensors": len(described),
            "provenance": None
            if package.provenance is None
            else {
                "tool": provenance.tool,
                "version": provenance.version,
                "source": provenance.source_name,
                "scheme": provenance.scheme,
                "scale_rule": provenance.scale_rule,
                "resolve_dtype": provenance.resolve_dtype,
                "fallbacks": None if provenance.fallbacks is None else len(provenance.fallbacks),
            },
        },
        shards=shards,
        index=PACKAGE_INDEX_NAME if package.index is not None else None,
        total_bytes=sum(s.bytes for s in shards),
        tensor_bytes=tensor_bytes,
        tensor_count=len(package.tensors),
        by_dtype=by_dtype,
        by_quant_type=by_type,
        **structure.fields(),
        family=rules.family.label,
        fp8_linears=0,
        groups=_groups(_module_weights(package.tensors), lambda m: quant_type_of(m + WEIGHT_SUFFIX)),
        schemes=None,
        problems=problems,
        tensor_filter=glob,
        tensors=_rows(package.tensors, glob, quant_type_of),
    )


__all__ = [
    "CountBytes",
    "Fallback",
    "InspectReport",
    "KIND_PACKAGE",
    "KIND_PLAIN",
    "KIND_SOURCE",
    "ModuleGroup",
    "SchemeEstimate",
    "ShardInfo",
    "TensorRow",
    "inspect_path",
]
