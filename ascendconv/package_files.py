"""The package's files around the shards: description, index, copied source files, provenance
(its record built from the source and the plan: `ascendv1.ProvenanceRecord`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ascendconv import __version__
from ascendconv.ascendv1 import (
    DESCRIPTION_NAME,
    INDEX_NAME,
    PROVENANCE_NAME,
    ProvenanceRecord,
    SourceFileRecord,
    SourceRecord,
)
from ascendconv.io.checksum import CHECKSUM
from ascendconv.io.safetensors import nonfinite_count
from ascendconv.pipeline import COPY_CHUNK_BYTES
from ascendconv.plan import OutputKind, Plan
from ascendconv.resume import sha256_hex
from ascendconv.sources import Source
from ascendconv.sources.checkpoint import find_quantization_config


def strip_quantization_config(config: dict) -> dict:
    """config.json for the package: vLLM must not see the FP8 quantization_config (contract section 3)."""
    config = {k: v for k, v in config.items() if k != "quantization_config"}
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = {k: v for k, v in config["text_config"].items() if k != "quantization_config"}
    return config


def dump_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def source_fingerprint(header_bytes: bytes, size: int) -> str:
    """Cheap identity of a source shard: its header and its size (the data is not re-read)."""
    return hashlib.sha256(header_bytes + size.to_bytes(8, "little")).hexdigest()


def nonfinite_copies(source: Source, plan: Plan) -> dict[str, int]:
    """FLOAT tensors carried from the source that hold NaN or Inf -> how many, for the provenance.

    Convert copies such values as they are (it does not judge values it does not transform, and a
    real checkpoint may hold them, e.g. in rows of an embedding no token uses); recorded here, they
    let `verify` tell them from damage done to the package afterwards.
    """
    import numpy as np

    from ascendconv.io.safetensors import NUMPY_DTYPES

    counts = {}
    for tensor in plan.tensors:
        entry = source.tensors[tensor.source]
        if tensor.kind not in (OutputKind.COPY, OutputKind.BIAS_F32) or entry.nbytes == 0:
            continue
        count = 0
        for start in range(0, entry.nbytes, COPY_CHUNK_BYTES):
            data = source.reader.map_range(entry, start, min(COPY_CHUNK_BYTES, entry.nbytes - start))
            if tensor.kind is OutputKind.BIAS_F32:  # counted as written: a cast to F32 can overflow to Inf
                data = np.frombuffer(data, NUMPY_DTYPES[entry.dtype]).astype(np.float32)
            count += nonfinite_count(data, tensor.dtype)
        if count:
            counts[tensor.name] = count
    return counts


def copied_file_digests(source: Source, plan: Plan) -> dict[str, str]:
    """sha256 of each source file the package copies (configs, tokenizer: small files)."""
    return {name: sha256_hex(Path(os.path.realpath(source.root / name)).read_bytes()) for name in plan.copied_files}


def write_plan_files(source: Source, plan: Plan, staging: Path) -> list[str]:
    """The package's files other than shards and provenance; returns their names."""
    written = [DESCRIPTION_NAME]
    dump_json(staging / DESCRIPTION_NAME, plan.description())
    index = plan.index()
    if index is not None:
        dump_json(staging / INDEX_NAME, index)
        written.append(INDEX_NAME)
    for name in plan.copied_files:
        if name == "config.json":
            dump_json(staging / name, strip_quantization_config(source.config))
        else:
            # the real path was checked to stay inside the source; copy that, not the link
            shutil.copyfile(os.path.realpath(source.root / name), staging / name)
        written.append(name)
    return written


def write_package_files(
    source: Source, plan: Plan, staging: Path, provenance: ProvenanceRecord, digests: dict[str, str]
) -> None:
    write_plan_files(source, plan, staging)
    dump_json(staging / PROVENANCE_NAME, provenance.document(digests))


def provenance_record(source: Source, plan: Plan, kernel: str) -> ProvenanceRecord:
    """What the package's provenance says besides the shard checksums."""
    _, location = find_quantization_config(source.config)
    files = tuple(
        SourceFileRecord(h.path.name, h.file_size, source_fingerprint(h.header_bytes, h.file_size)) for h in source.headers
    )
    return ProvenanceRecord(
        tool="ascendconv",
        version=__version__,
        source=SourceRecord(source.root.name, source.format, location, source.params, files),
        scheme=plan.scheme,
        scale_rule=plan.scale_rule,
        resolve_dtype=plan.resolve_dtype,
        kernel=kernel,
        fallbacks=tuple(d.to_dict() for d in plan.fallbacks),
        source_nonfinite=nonfinite_copies(source, plan),
        checksum=CHECKSUM,
        added_tensors={added.name: added.to_dict() for added in plan.added},
    )
