"""inspect of a plain (BF16 / F16 / F32) Hugging Face checkpoint: nothing to convert, a summary."""

from __future__ import annotations

from pathlib import Path

from ascendconv.errors import UnrecognizedCheckpointError, shown
from ascendconv.formats.constants import FLOAT
from ascendconv.inspect.report import KIND_PLAIN, InspectReport, ShardInfo
from ascendconv.inspect.summary import _groups, _model_summary, _module_weights, _rows, _structure, _tally
from ascendconv.io.safetensors import read_header
from ascendconv.sources.checkpoint import INDEX_NAME as SOURCE_INDEX_NAME
from ascendconv.sources.checkpoint import discover_shards, merge_headers
from ascendconv.models import rules_for

PLAIN_DTYPES = ("BF16", "F16", "F32", "F64")  # a float checkpoint holds these (and maybe integers)
FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")


def inspect_plain(root: Path, config: dict, config_path: Path, glob: str | None) -> InspectReport:
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
    rules = rules_for(config, tensors)
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
