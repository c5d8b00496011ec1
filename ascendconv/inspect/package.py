"""inspect of an AscendV1 package: what it holds and the disagreements between its description,
index and shards (collected, never fixed; `verify` is the full check)."""

from __future__ import annotations

from pathlib import Path

from ascendconv.ascendv1 import INDEX_NAME as PACKAGE_INDEX_NAME
from ascendconv.ascendv1 import PROVENANCE_NAME, RANK
from ascendconv.errors import shown
from ascendconv.inspect.report import KIND_PACKAGE, InspectReport, ShardInfo
from ascendconv.inspect.summary import _groups, _model_summary, _module_weights, _rows, _structure, _tally
from ascendconv.io.files import file_size
from ascendconv.io.package import Package, field_shown
from ascendconv.sources.base import WEIGHT_SUFFIX
from ascendconv.sources.checkpoint import find_quantization_config
from ascendconv.models import rules_for


def inspect_package(root: Path, glob: str | None) -> InspectReport:
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
        problems.append(
            f"model_quant_type is {field_shown(package.fields, 'model_quant_type')} but the highest type described is {shown(highest)}"
        )
    problems += package.unknown_types()
    if package.provenance is not None:  # a field of the wrong type is shown as unknown: say what the file holds
        problems += [f"{PROVENANCE_NAME}: {problem}" for problem in package.record.field_problems()]
    problems += package.scheme_problems()
    problems += package.field_problems()
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
    rules = rules_for(package.config, package.tensors)
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
                "hub": provenance.hub,
                "deployment": provenance.deployment,
                "overrides": provenance.overrides,
                "command": provenance.command,
                "date": provenance.date,
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
