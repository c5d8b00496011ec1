"""The package's files around the shards: description, index, copied source files, provenance
(its record built from the source and the plan: `ascendv1.ProvenanceRecord`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from pathlib import Path

from ascendconv import __version__
from ascendconv import markdown as md
from ascendconv.ascendv1 import (
    DESCRIPTION_NAME,
    FLOAT,
    INDEX_NAME,
    PROVENANCE_NAME,
    HubRecord,
    ProvenanceRecord,
    SourceFileRecord,
    SourceRecord,
    package_date,
)
from ascendconv.errors import CopiedFileError, plural
from ascendconv.io.checksum import CHECKSUM, sampled_digest, tensor_sampled_digest
from ascendconv.io.files import MAX_COPIED_BYTES, copy_regular, read_regular_bytes, write_new
from ascendconv.io.hfcache import cached_repo
from ascendconv.io.safetensors import nonfinite_count
from ascendconv.options import DEFAULT_MAX_SHARD_SIZE, ConvertOptions
from ascendconv.pipeline import COPY_CHUNK_BYTES
from ascendconv.plan import OutputKind, Plan
from ascendconv.resume import sha256_hex
from ascendconv.sources import Source
from ascendconv.sources.checkpoint import find_quantization_config


# vLLM reads a checkpoint's quantization from either key (compression_config is the older name it
# falls back to), so the package keeps neither (contract section 3).
QUANTIZATION_KEYS = ("quantization_config", "compression_config")


def strip_quantization_config(config: dict) -> dict:
    """config.json for the package: vLLM must not see the FP8 quantization config (contract section 3)."""
    config = {k: v for k, v in config.items() if k not in QUANTIZATION_KEYS}
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = {k: v for k, v in config["text_config"].items() if k not in QUANTIZATION_KEYS}
    return config


def dump_json(path: Path, data: dict) -> str:
    """Write `data` as the new file `path`; return the sha256 of the bytes written."""
    text = (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    write_new(path, text)
    return sha256_hex(text)


def source_fingerprint(header_bytes: bytes, size: int) -> str:
    """Cheap identity of a source shard: its header and its size (the data is not re-read)."""
    return hashlib.sha256(header_bytes + size.to_bytes(8, "little")).hexdigest()


def data_sample(header) -> str:
    """The sampled digest of a source shard's data as packages of before recorded it (see
    io.checksum.sampled_digest)."""
    return sampled_digest(header.path, header.data_start, header.file_size)


def tensor_sample(header) -> str:
    """The sampled digest of a source shard's data, every tensor's windows in it (see
    io.checksum.tensor_sampled_digest)."""
    spans = [(entry.offset, entry.offset + entry.nbytes) for entry in header.tensors.values()]
    return tensor_sampled_digest(header.path, spans, header.data_start, header.file_size)


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
    return {name: copy_regular(Path(os.path.realpath(source.root / name)), None, CopiedFileError) for name in plan.copied_files}


def write_plan_files(source: Source, plan: Plan, staging: Path, provenance: ProvenanceRecord) -> dict[str, str]:
    """The package's files other than shards and provenance; returns name -> sha256 of each as
    written. README.md is the package's own model card, with the source's card (if any) below it."""
    original = None
    if CARD_NAME in plan.copied_files:
        card = read_regular_bytes(Path(os.path.realpath(source.root / CARD_NAME)), MAX_COPIED_BYTES, CopiedFileError)
        original = card.decode("utf-8", errors="replace")
    card = model_card(plan, provenance, original).encode("utf-8")
    write_new(staging / CARD_NAME, card)
    written = {CARD_NAME: sha256_hex(card), DESCRIPTION_NAME: dump_json(staging / DESCRIPTION_NAME, plan.description())}
    index = plan.index()
    if index is not None:
        written[INDEX_NAME] = dump_json(staging / INDEX_NAME, index)
    for name in plan.copied_files:
        if name == CARD_NAME:
            continue
        if name == "config.json":
            written[name] = dump_json(staging / name, strip_quantization_config(source.config))
        else:
            # the real path was checked to stay inside the source; copy that, not the link
            written[name] = copy_regular(Path(os.path.realpath(source.root / name)), staging / name, CopiedFileError)
    return written


def shard_sizes(staging: Path, digests: dict[str, str]) -> dict[str, int]:
    return {name: os.lstat(staging / name).st_size for name in digests}


def write_package_files(
    source: Source, plan: Plan, staging: Path, provenance: ProvenanceRecord, digests: dict[str, str],
    reads: dict[str, str],
) -> None:
    files = write_plan_files(source, plan, staging, provenance)
    sizes = shard_sizes(staging, digests)
    dump_json(staging / PROVENANCE_NAME, provenance.document(digests, sizes, files, package_date(), reads))


def recorded_name(name: str) -> str:
    """A file name as the provenance (JSON, UTF-8) records it: bytes of another encoding, which Python
    holds as lone surrogates that no UTF-8 file can hold, become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def format_record(source: Source) -> dict:
    """What the provenance records of the source's format: its name, where config.json holds its
    quantization_config ("" for none) and what the format read from it (`verify --source` derives
    them again from the source it is given)."""
    _, location = find_quantization_config(source.config)
    return {"format": source.format, "quantization_config": location, "params": source.params}


def provenance_record(source: Source, plan: Plan, kernel: str, options: ConvertOptions) -> ProvenanceRecord:
    """What the package's provenance says besides the date and the shard checksums."""
    # the directory's own name, whichever way SRC reached it (`.`, `..`, a symbolic link to it): one
    # source, one provenance, so parts and --resume runs started from other spellings still agree
    name = recorded_name(Path(os.path.realpath(source.root)).name)
    files = tuple(
        SourceFileRecord(h.path.name, h.file_size, source_fingerprint(h.header_bytes, h.file_size), tensor_sample(h))
        for h in source.headers
    )
    return ProvenanceRecord(
        tool="ascendconv",
        version=__version__,
        source=SourceRecord(name=name, files=files, **format_record(source)),
        scheme=plan.scheme,
        scale_rule=plan.scale_rule,
        resolve_dtype=plan.resolve_dtype,
        kernel=kernel,
        fallbacks=tuple(d.to_dict() for d in plan.fallbacks),
        source_nonfinite=nonfinite_copies(source, plan),
        checksum=CHECKSUM,
        hub=HubRecord(*repo) if (repo := cached_repo(source.root)) else None,
        deployment={
            "tp": plan.deployment.tp,
            "ep": plan.deployment.ep,
            "shared_experts_as_routed": plan.deployment.shared_experts_as_routed,
            "mtp_heads": plan.deployment.mtp_heads,
        },
        overrides=tuple(f"{o.glob}={o.quant_type}" for o in options.overrides),
        command=convert_command(f"{repo[0]}@{repo[1]}" if repo else name, options),
        added_tensors={added.name: added.to_dict() for added in plan.added},
    )


def source_spec(provenance: ProvenanceRecord) -> str:
    """The source as a command names it: the cached repo at its commit, else the directory's name."""
    return f"{provenance.hub.repo_id}@{provenance.hub.revision}" if provenance.hub else provenance.source.name


def convert_command(source: str, options: ConvertOptions) -> str:
    """The command that writes this package again: every option that shapes its bytes, never the
    run's own (--workers, --resume, --part, --overwrite, OUT's name) nor --kernel (either writes the
    same bytes; the provenance's `kernel` says which ran), so that a package assembled from parts or
    finished by --resume records the same command, and the model card quoting it is the same file."""
    import shlex

    words = ["ascendconv", "convert", source, "OUT", "--scheme", options.scheme, "--scale-rule", options.scale_rule,
             "--resolve-dtype", options.resolve_dtype]
    for override in options.overrides:
        words += ["--override", f"{override.glob}={override.quant_type}"]
    if options.max_shard_size != DEFAULT_MAX_SHARD_SIZE:
        words += ["--max-shard-size", str(options.max_shard_size)]
    deployment = options.deployment
    if deployment.tp != 1:
        words += ["--tp", str(deployment.tp)]
    words += ["--ep"] * deployment.ep + ["--shared-experts-as-routed"] * deployment.shared_experts_as_routed
    words += ["--no-mtp-heads"] * (not deployment.mtp_heads)
    return shlex.join(words)


# --- the model card -----------------------------------------------------------------------------

CARD_NAME = "README.md"
CARD_TAGS = ("ascend", "vllm-ascend", "ascendconv", "mx", "quantized")
CARD_FALLBACKS_LISTED = 20  # a DeepSeek-sized fallback list would drown the card: the rest are in the provenance
# Front-matter keys of the source's card that still hold for the package (the rest describe the source).
CARRIED_FRONT_MATTER = ("license", "license_name", "license_link", "language", "pipeline_tag")


def _front_matter(text: str) -> tuple[list[str], str]:
    """(the lines of the carried top-level front-matter keys, the card's text after its front matter).

    A carried key is written again, not copied: a one-line scalar or a list of them ('- item' lines
    or '[a, b]'), read by `markdown.read_scalar` and written by `markdown.yaml_scalar`; a key in any
    other form is left out. Copied lines would be YAML of the source's making inside ours: a quote
    left open, a line under a scalar or a tab would end our front matter's parse at the Hub (which
    then reads none of our keys), and a key given twice is an error to some readers."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return [], text
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        return [], text
    blocks: dict[str, list[str]] = {}  # a carried key -> its line and the lines under it; the last wins
    key = None
    for line in lines[1:end]:
        if line[:1] not in (" ", "\t", "-") or not line.strip():
            key = line.split(":", 1)[0].strip() if ":" in line else None
            key = key if key in CARRIED_FRONT_MATTER else None
            if key:
                blocks.pop(key, None)
                blocks[key] = [line]
        elif key:
            blocks[key].append(line)
    carried = []
    for key, (first, *rest) in blocks.items():
        value = first.split(":", 1)[1].strip()
        if not rest and value.startswith("[") and value.endswith("]"):  # a flow list of plain items
            rest, value = [f"- {item}" for item in value[1:-1].split(",") if item.strip()], ""
        if value and not rest:
            scalar = md.read_scalar(value)
            if scalar is not None:
                carried.append(f"{key}: {md.yaml_scalar(*scalar)}")
        elif not value and rest and all(line.lstrip().startswith("- ") for line in rest):
            items = [md.read_scalar(line.lstrip()[2:]) for line in rest]
            if None not in items:
                carried += [f"{key}:", *(f"- {md.yaml_scalar(*item)}" for item in items)]
    return carried, "\n".join(lines[end + 1 :]).lstrip("\n")


def _size(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{n} B"


def reason_pattern(reason: str) -> str:
    """A fallback reason with its numbers as '*' (to merge the rows of many layers), except the
    user's own --override text, shown as it was given."""
    from ascendconv.decide import module_pattern

    return "".join(p if p.startswith("--override ") else module_pattern(p) for p in re.split(r"(--override \S+)", reason))


def serve_command(tp: int, ep: bool) -> str:
    return f"vllm serve PACKAGE_DIR --quantization ascend --tensor-parallel-size {tp}" + (" --enable-expert-parallel" if ep else "")


def carries_card(card: str, original: str) -> bool:
    """Whether a package's card holds the source's card `original` (its text after the front
    matter) as `model_card` writes it."""
    _, text = _front_matter(original)
    return not text.strip() or text.rstrip("\n") in card


def model_card(plan: Plan, provenance: ProvenanceRecord, original: str | None) -> str:
    """The package's README.md: Hugging Face front matter, what the package is and how to serve and
    verify it, then the source's card. A function of the plan and the record only (no date): every
    part of a --part run writes the same card."""
    from ascendconv.decide import module_pattern

    carried, original_text = _front_matter(original) if original else ([], "")
    hub = provenance.hub
    front = ["---"]
    if hub:
        front.append(f"base_model: {hub.repo_id}")
        front.append("base_model_relation: quantized")
    front += carried
    front.append("library_name: vllm")
    front.append("tags:")
    front += [f"- {tag}" for tag in (*CARD_TAGS, *(t.lower().replace("_", "-") for t in plan.tensor_counts() if plan.tensor_counts()[t] and t != FLOAT))]
    front.append("---")
    name = hub.repo_id if hub else provenance.source.name
    deployment = plan.deployment
    lines = [
        *front,
        "",
        f"# {md.text(name)}, AscendV1 {plan.model_quant_type}",
        "",
        f"An AscendV1 MX package of {md.code(name)}" + (f" (revision {md.code(hub.revision)})" if hub else "")
        + f", written by ascendconv {provenance.version} for vllm-ascend on Ascend 950 NPUs. "
        f"The weights are quantized to MX from the source (read as {md.code(provenance.source.format)}); "
        "the model's own card follows below.",
        "",
        "| | |",
        "|---|---|",
        f"| scheme | `{plan.scheme}` |",
        f"| scale rule, resolve dtype | `{plan.scale_rule}`, `{plan.resolve_dtype}` |",
        f"| model_quant_type | `{plan.model_quant_type}` |",
        f"| tensors | {', '.join(f'{n} {t}' for t, n in plan.tensor_counts().items() if n)} |",
        f"| size | {_size(plan.bytes_out)} of tensors (the source: {_size(plan.bytes_in)}) in {plural(len(plan.shards), 'shard')} |",
        f"| planned for | `--tp {deployment.tp}`" + (" `--ep`" if deployment.ep else "")
        + (" `--shared-experts-as-routed`" if deployment.shared_experts_as_routed else "") + " |",
    ]
    if provenance.overrides:
        lines.append(f"| overrides | {', '.join(md.code(o) for o in provenance.overrides)} |")
    lines += ["", "## Serve", "", "```", serve_command(deployment.tp, deployment.ep), "```", "",
              f"`--tensor-parallel-size` and `--enable-expert-parallel` must match the `--tp {deployment.tp}`"
              f"{' --ep' if deployment.ep else ''} the package was planned for: the fallbacks below were chosen for them.",
              "", "## Verify", "", *md.code_block(f"ascendconv verify PACKAGE_DIR --source {shlex.quote(source_spec(provenance))}"), "",
              "`verify` checks that vllm-ascend will load the package and, with `--source`, how close each weight is to the "
              "source; it takes the recorded `--tp` and `--ep` by default.", "",
              "## Types per module group (layer and expert numbers as *)", "", "| module | modules | written as |", "|---|---|---|"]
    for pattern, types in plan.module_groups().items():
        lines.append(f"| {md.code(pattern)} | {sum(types.values())} | {', '.join(f'{t} {n}' for t, n in types.items())} |")
    kept = plan.kept_float()
    if kept:
        lines += ["", "## Kept FLOAT by the model's rules", "", "| modules | reason |", "|---|---|"]
        lines += [f"| {n} | {md.text(why)} |" for why, n in kept.items()]
    fallbacks = plan.fallbacks
    lines += ["", f"## Fallbacks ({len(fallbacks)})", ""]
    if fallbacks:
        merged: dict[tuple, int] = {}
        for fb in fallbacks:
            key = (module_pattern(fb.module), fb.requested, fb.written, reason_pattern(fb.reason))
            merged[key] = merged.get(key, 0) + 1
        lines += ["| module | n | requested | written | reason |", "|---|---|---|---|---|"]
        for (pattern, requested, written, reason), n in list(merged.items())[:CARD_FALLBACKS_LISTED]:
            lines.append(f"| {md.code(pattern)} | {n} | {requested} | {written} | {md.text(reason)} |")
        if len(merged) > CARD_FALLBACKS_LISTED:
            lines.append(f"\n… and {plural(len(merged) - CARD_FALLBACKS_LISTED, 'more kind')}: every fallback is in `{PROVENANCE_NAME}`.")
    else:
        lines.append("None: every quantizable linear is written in the type the scheme asks for.")
    lines += ["", "## Reproduce", "", *md.code_block(provenance.command), ""]
    if original_text.strip():
        lines += ["---", "", "# The source model's card", "", original_text.rstrip("\n"), ""]
    return "\n".join(lines)
