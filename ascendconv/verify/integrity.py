"""Integrity: the data scan (scales, payload, checksums in one pass per shard) and the provenance."""

from __future__ import annotations

import math
from pathlib import Path

from ascendconv.ascendv1 import PROVENANCE_NAME, QUANT_TYPES, Provenance
from ascendconv.errors import HeaderError, json_shown, plural, shown
from ascendconv.formats.constants import E8M0_NAN, RESOLVE_DTYPES, SCALE_RULES
from ascendconv.io.checksum import ALGORITHMS, file_digest, recorded_checksum
from ascendconv.io.files import file_size
from ascendconv.io.safetensors import TensorEntry, TensorReader, itemsize, nonfinite_count
from ascendconv.sources import FORMAT_NAMES
from ascendconv.sources.base import WEIGHT_SUFFIX
from ascendconv.verify.checks import make_check, skip_check
from ascendconv.verify.layout import FLOAT_DTYPES, _Layout, _row_chunks
from ascendconv.options import KERNELS, VerifyProgress as Progress, VerifyOptions
from ascendconv.verify.report import Check


def _position(entry: TensorEntry, flat: int, row_start: int) -> str:
    shape = entry.shape
    if len(shape) >= 2:
        cols = math.prod(shape[1:])
        return f"row {row_start + flat // cols}, column {flat % cols}"
    return f"element {flat}"


class _ScanFindings:
    def __init__(self) -> None:
        self.scales: list[str] = []
        self.payload: list[str] = []
        self.carried: dict[str, int] = {}  # non-finite values the provenance says came from the source
        self.nonfinite: dict[str, int] = {}  # what the scan found in those tensors
        self.digests: dict[str, str] = {}
        self.vouched: set[str] = set()  # shards whose checksum matched: their bytes are convert's
        self.unreadable: dict[str, str] = {}

    def detail(self, what: str) -> str:
        if not self.vouched:
            return what
        return (
            f"{what} ({plural(len(self.vouched), 'shard')} not scanned: "
            + ("its checksum matches, so it holds" if len(self.vouched) == 1 else "their checksums match, so they hold")
            + " the bytes convert wrote and checked)"
        )


def _scan(lay: _Layout, options: VerifyOptions, progress: Progress | None) -> _ScanFindings:
    """Checksum each shard; scan the tensors of those whose checksum does not vouch for them.

    A shard whose checksum matches the one recorded holds exactly the bytes convert wrote, and
    convert never writes a NaN code or a scale byte 255 (it refuses such input; NaN / Inf carried in
    FLOAT tensors are recorded in the provenance): scanning it would find nothing new, so it is
    hashed only, at the speed of reading it, except for the tensors whose NaN / Inf the provenance
    records, which are counted again. A shard without a recorded
    checksum (`--no-checksums`, no provenance) or with a wrong one is scanned tensor by tensor."""
    findings = _ScanFindings()
    findings.carried = lay.pkg.record.source_nonfinite
    present = set(lay.present)
    files = [f for f in lay.expected if f in present]
    total = sum(file_size(lay.root / f) for f in files)
    done = 0
    with TensorReader() as reader:
        for file in files:
            path = lay.root / file
            recorded = recorded_checksum(lay.pkg.provenance or {}, file) if options.checksums else None
            header = lay.headers.get(file)
            unhashable = _unhashable(lay, file, header)
            if unhashable is not None:
                findings.unreadable[file] = unhashable
                recorded = None
            try:
                if recorded is not None:
                    findings.digests[file] = file_digest(path, recorded[0])
                    if findings.digests[file] == recorded[1]:
                        findings.vouched.add(file)
                if header is not None:
                    # a vouched shard still has its carried NaN / Inf counted (a few FLOAT tensors)
                    scanned = [
                        e for e in header.tensors.values() if file not in findings.vouched or e.name in findings.carried
                    ]
                    for entry in sorted(scanned, key=lambda e: e.offset):
                        for r0, _, start, count in _row_chunks(entry):
                            _scan_chunk(lay, entry, reader.read_bytes(entry, start, count), r0, findings)
            except OSError as exc:
                findings.unreadable[file] = f"{file}: cannot read ({exc})"
            except HeaderError as exc:  # cut short while being read, or no longer a regular file
                findings.unreadable[file] = f"{file}: {exc.message}"
            done += file_size(path)
            if progress:
                progress("scan", done, total)
    return findings


def _unhashable(lay: _Layout, file: str, header) -> str | None:
    """Why a shard is not hashed, or None: a file whose header cannot be read, or whose size is not
    the one the provenance recorded, would give a wrong checksum however long it is read (a link to a
    50 GB sparse file, a device), so it is refused before a byte of its data is read."""
    if header is None:
        return f"{file}: not hashed, its header cannot be read ({lay.broken.get(file, 'see headers')})"
    size, recorded = file_size(lay.root / file), lay.pkg.record.size(file)
    if recorded is not None and size != recorded:
        return f"{file}: {size} bytes, not the {recorded} recorded at conversion; not hashed"
    return None


def _scan_chunk(lay: _Layout, entry: TensorEntry, data: bytearray, row_start: int, findings: _ScanFindings) -> None:
    # numpy only here: shards whose checksum vouches for them are never scanned, so `verify OUT` of an
    # intact package does not import it
    import numpy as np

    from ascendconv.formats import requantize
    from ascendconv.io.safetensors import NUMPY_DTYPES

    name = entry.name
    if name.endswith(".weight_scale") and itemsize(entry.dtype) == 1:
        raw = np.frombuffer(data, np.uint8)
        hits = np.flatnonzero(raw == E8M0_NAN)
        if hits.size:
            groups = entry.shape[1] if len(entry.shape) == 2 else 1
            flat = int(hits[0])
            findings.scales.append(
                f"{name!r} ({entry.path.name}) holds the E8M0 NaN byte 255 at row {row_start + flat // groups}, "
                f"group {flat % groups} ({hits.size} in rows {row_start}..)"
            )
    elif entry.dtype == "F8_E4M3":
        raw = np.frombuffer(data, np.uint8)
        hit = requantize.first_nan_code(raw)
        if hit is not None:
            (flat,) = hit
            findings.payload.append(
                f"{name!r} ({entry.path.name}) holds the E4M3 NaN code 0x{raw[flat]:02X} at "
                f"{_position(entry, flat, row_start)}"
            )
    elif entry.dtype in FLOAT_DTYPES:
        if name in findings.carried:  # the source held NaN / Inf here: counted, compared at the end
            findings.nonfinite[name] = findings.nonfinite.get(name, 0) + nonfinite_count(data, entry.dtype)
            return
        values = np.frombuffer(data, NUMPY_DTYPES[entry.dtype])
        finite = np.isfinite(values.astype(np.float32) if entry.dtype == "BF16" else values)
        if not finite.all():
            flat = int(np.flatnonzero(~finite)[0])
            findings.payload.append(
                f"{name!r} ({entry.path.name}) holds {values[flat]} at {_position(entry, flat, row_start)}"
            )


def check_scales(findings: _ScanFindings) -> Check:
    return make_check("scales", findings.scales, findings.detail("no E8M0 scale byte is 255"))


def check_payload(findings: _ScanFindings) -> Check:
    problems = list(findings.payload)
    for name, want in sorted(findings.carried.items()):
        got = findings.nonfinite.get(name)
        if got is not None and got != want:
            problems.append(
                f"{shown(name)} holds {plural(got, 'NaN/Inf value')}; the source held {want} (recorded at conversion)"
            )
    detail = "no NaN codes in FP8 payloads, no NaN/Inf in floats"
    # scanned counts, or the recorded ones where a matching checksum vouched for the shard
    counts = {name: findings.nonfinite.get(name, want) for name, want in findings.carried.items()}
    carried = sum(counts.values())
    if carried and not problems:
        detail += (
            f" but the {plural(carried, 'NaN/Inf value')} in {plural(len(counts), 'FLOAT tensor')} the source held "
            "(recorded at conversion)"
        )
    return make_check("payload", problems, findings.detail(detail))


def check_provenance(lay: _Layout, source=None) -> Check:
    """The provenance file's fields, and whether its scheme can have written the package's types;
    with `source` (an opened Source), whether the plan of the recorded options describes the
    package's types."""
    prov = lay.pkg.provenance
    if prov is None:
        return skip_check("provenance", f"no {PROVENANCE_NAME} (not written by ascendconv convert)")
    record = lay.pkg.record
    problems = [f"{PROVENANCE_NAME}: {problem}" for problem in record.field_problems() + _value_problems(record)]
    shards, algorithm = record.shards, record.checksum
    if shards is not None and algorithm in ALGORITHMS:
        for file in sorted(set(lay.expected) - set(shards)):
            problems.append(f"{PROVENANCE_NAME} records no checksum for {file}")
        for file in sorted(f for f in set(lay.expected) & set(shards) if recorded_checksum(prov, f) is None):
            problems.append(f"{PROVENANCE_NAME} records no {algorithm} digest for {file}")
        for file in sorted(set(shards) - set(lay.expected)):
            problems.append(f"{PROVENANCE_NAME} records {file}, which is not a shard of the package")
    if source is not None:
        problems += _format_problems(record, source)
    scheme_problems = lay.pkg.scheme_problems()
    problems += scheme_problems
    if not scheme_problems and lay.pkg.record.scheme is not None:
        problems += _planned_type_problems(lay, source) if source is not None else _role_problems(lay)
    return make_check("provenance", problems, lay.pkg.record.origin())


# The values a field of the right type may hold (the shapes are PROVENANCE_SHAPE's).
KNOWN_VALUES = {
    "tool": ("ascendconv",), "scale_rule": SCALE_RULES, "resolve_dtype": RESOLVE_DTYPES, "kernel": KERNELS,
    "checksum": ALGORITHMS,
}


def _value_problems(record: Provenance) -> list[str]:
    """Each string field whose value is none convert writes, and each carried NaN / Inf count that
    counts nothing (their types are field_problems')."""
    values = {key: (record.raw.get(key), known) for key, known in KNOWN_VALUES.items()}
    values["source.format"] = (record.source_format, FORMAT_NAMES)
    problems = [
        f"{key} is {shown(value)}, expected " + (shown(known[0]) if len(known) == 1 else f"one of {', '.join(known)}")
        for key, (value, known) in values.items()
        if isinstance(value, str) and value not in known
    ]
    carried = record.raw.get("source_nonfinite")
    if isinstance(carried, dict):
        problems += [
            f"source_nonfinite[{shown(name)}] is {count}, expected the count of NaN / Inf values carried (at least 1)"
            for name, count in carried.items()
            if type(count) is int and count < 1
        ]
    return problems


OTHER_SOURCE = "this package was converted from another checkpoint, or its provenance was edited; convert again"
UNSET = object()  # a param that one side has and the other lacks


def _format_problems(record: Provenance, source) -> list[str]:
    """What the provenance says of the source's format against what the source seam reads from the
    source given, as convert recorded it (package_files.format_record): the format's name, where its
    quantization_config is, and, of the same format, each param. Fields of the wrong type are
    field_problems'. Nothing else recorded is derived from the source: its directory's name changes
    with a copy or a rename of the same checkpoint (the source check proves its shards), the hub
    revision names a snapshot whose bytes are the same under other revisions and in a local copy,
    and the kernel is which implementation ran (both write the same bytes: exact checks them)."""
    import json

    from ascendconv.package_files import format_record

    found = json.loads(json.dumps(format_record(source)))  # as the provenance file holds it
    recorded = {"format": record.source_format, "quantization_config": record.source_location}
    differing = [(f"source.{key}", value, found[key]) for key, value in recorded.items() if value is not None and value != found[key]]
    params = record.source_params
    if params is not None and record.source_format == found["format"]:  # another format's params mean nothing here
        differing += [
            (f"source.params.{key}", params.get(key, UNSET), found["params"].get(key, UNSET))
            for key in sorted(params.keys() | found["params"].keys())
            if params.get(key, UNSET) != found["params"].get(key, UNSET)
        ]

    def spelled(value: object, unset: str) -> str:
        return unset if value is UNSET else json_shown(value)

    return [
        f"{PROVENANCE_NAME}: {field} is {spelled(value, 'not recorded')}, but the source given has "
        f"{spelled(derived, 'none')}: {OTHER_SOURCE}"
        for field, value, derived in differing
    ]


def _role_problems(lay: _Layout) -> list[str]:
    """Without the source, what the scheme says of each module by its role: under a scheme whose
    linears and routed experts ask for different types, a linear described with the experts' type
    (or an expert with the linears') that no recorded override or fallback wrote. The roles are the
    planner's own (_Layout.as_expert). Older packages, which record no fallbacks, are not judged."""
    from ascendconv.ascendv1 import SCHEME_TABLE

    record = lay.pkg.record
    row = SCHEME_TABLE[record.scheme]  # known: scheme_problems found none
    if row.native or row.linear == row.expert or "fallbacks" not in (lay.pkg.provenance or {}):
        return []
    chosen = record.chosen_types()
    misplaced: dict[tuple[str, str], list[str]] = {}
    for prefix, module in sorted(lay.modules.items()):
        if module.label in chosen or module.label not in (row.linear, row.expert):
            continue
        as_expert = lay.as_expert(prefix)
        asked = row.expert if as_expert else row.linear
        if module.label != asked:
            misplaced.setdefault(("routed expert" if as_expert else "linear", module.label), []).append(prefix)
    return [
        f"{PROVENANCE_NAME}: scheme {record.scheme} writes {row.expert if role == 'routed expert' else row.linear} "
        f"{role}s, but {plural(len(prefixes), role)} {'is' if len(prefixes) == 1 else 'are'} described {label} "
        f"(e.g. {shown(prefixes[0])}), which no recorded fallback or override writes: the package was not "
        "converted with the scheme recorded"
        for (role, label), prefixes in sorted(misplaced.items())
    ]


def _planned_type_problems(lay: _Layout, source) -> list[str]:
    """The plan of the recorded scheme, overrides and deployment, recomputed from the source (the
    planner is pure), against the description: each (planned, described) pair of types that
    differ, with a count and the first module."""
    from ascendconv.decide import Deployment, Override
    from ascendconv.errors import AscendconvError
    from ascendconv.plan import Planner

    record = lay.pkg.record
    recorded = record.deployment or {}
    try:
        deployment = Deployment(
            recorded.get("tp", 1), recorded.get("ep", False), recorded.get("shared_experts_as_routed", False),
            mtp_heads=bool(record.raw.get("added_tensors")),
        )
        plan = Planner.for_source(source, deployment).plan(record.scheme, overrides=[Override.parse(o) for o in record.overrides])
        decisions = plan.decisions
    except AscendconvError as exc:
        return [f"{PROVENANCE_NAME}: the plan of the recorded options cannot be made from this source: {exc.message}"]
    differing: dict[tuple[str, str], list[str]] = {}
    for prefix, decision in decisions.items():
        label = lay.description.get(prefix + WEIGHT_SUFFIX)
        if isinstance(label, str) and label in QUANT_TYPES and label != decision.written:
            differing.setdefault((decision.written, label), []).append(prefix)
    return [
        f"{PROVENANCE_NAME}: scheme {record.scheme} (with the recorded overrides and deployment) plans "
        f"{plural(len(prefixes), 'module')} of this source as {planned} that the description holds as {label} "
        f"(e.g. {shown(prefixes[0])}): the package was not converted with the scheme recorded"
        for (planned, label), prefixes in sorted(differing.items())
    ]


def check_checksums(lay: _Layout, findings: _ScanFindings) -> Check:
    prov = lay.pkg.provenance
    if prov is None:
        return make_check(
            "checksums", [f"no {PROVENANCE_NAME}: the shard checksums are unknown (pass --no-checksums for a "
                          "package written by another tool)"], "")
    problems = [why for _, why in sorted(findings.unreadable.items())]
    checked = 0
    algorithms = set()
    for file in lay.expected:
        recorded = recorded_checksum(prov, file)
        if file not in findings.digests or recorded is None:
            continue  # unreadable, or no checksum recorded (reported by provenance)
        algorithm, want = recorded
        checked += 1
        algorithms.add(algorithm)
        got = findings.digests[file]
        if got != want:
            problems.append(
                f"{file}: {algorithm} {got[:16]}... differs from the {want[:16]}... recorded at conversion "
                f"(size now {file_size(lay.root / file)} bytes)"
            )
    named = "/".join(sorted(algorithms)) or "checksum"
    if not checked and not problems:
        return skip_check("checksums", "compared nothing: no shard has a checksum recorded (reported by provenance)")
    return make_check(
        "checksums",
        problems,
        f"{plural(checked, 'shard')} {'matches' if checked == 1 else 'match'} the {named} recorded at conversion: "
        f"{'it holds' if checked == 1 else 'they hold'} the bytes written then, unless shard and provenance were both "
        "rewritten (only --source can tell)",
    )



def check_copies(lay: _Layout, source=None) -> Check:
    """The package's files other than shards (description, index, config.json, tokenizer, code) have
    the sha256 the provenance recorded as written; with `source` (an opened Source), the files
    carried from it are also its files: config.json once its quantization keys are removed, the
    others byte for byte."""
    from ascendconv.io.files import copy_regular
    from ascendconv.errors import CopiedFileError

    recorded = lay.pkg.record.files
    if recorded is None:
        if source is None:
            why = "(an older package)" if "files" not in lay.pkg.record.raw else "it can read (see provenance)"
            return skip_check("copies", f"{PROVENANCE_NAME} records no digests of the package's other files {why}")
        recorded = {}
    problems = []
    for name, want in sorted(recorded.items()):
        path = lay.root / name
        if name != Path(name).name or name.startswith("."):
            problems.append(f"{PROVENANCE_NAME} records {shown(name)}, which is not a file of the package")
            continue
        try:
            got = copy_regular(path, None, CopiedFileError, follow=False)
        except (CopiedFileError, FileNotFoundError) as exc:
            problems.append(f"{name}: {getattr(exc, 'message', 'is missing')}")
            continue
        if got != want:
            problems.append(f"{name}: sha256 {got[:16]}... differs from the {want[:16]}... recorded at conversion")
    compared = 0
    if source is not None:
        compared, source_problems = _copies_against_source(lay, source)
        problems += source_problems
    has = "has" if len(recorded) == 1 else "have"
    detail = f"{plural(len(recorded), 'file')} {has} the sha256 recorded at conversion"
    if source is not None:
        detail += f"; {plural(compared, 'carried file')} {'matches' if compared == 1 else 'match'} the source's"
    return make_check("copies", problems, detail)


def _copies_against_source(lay: _Layout, source) -> tuple[int, list[str]]:
    import os

    from ascendconv.errors import CopiedFileError
    from ascendconv.io.files import MAX_COPIED_BYTES, copy_regular, read_json_object, read_regular_bytes
    from ascendconv.package_files import CARD_NAME, carries_card, strip_quantization_config
    from ascendconv.decide import Deployment
    from ascendconv.plan import Planner

    carried = Planner.for_source(source, Deployment()).copied_files  # what convert carries from this source
    problems, compared = [], 0
    for name in carried:
        path = lay.root / name
        if not os.path.lexists(path):
            problems.append(f"{name}: in the source but not in the package")
            continue
        compared += 1
        try:
            if name == "config.json":
                ours = read_json_object(path, CopiedFileError, follow=False)
                if ours != strip_quantization_config(source.config):
                    problems.append(
                        "config.json differs from the source's (its quantization keys removed): another model's, or edited"
                    )
            elif name == CARD_NAME:  # the package's own card, the source's text below it
                ours = read_regular_bytes(path, MAX_COPIED_BYTES, CopiedFileError, follow=False)
                theirs = read_regular_bytes(Path(os.path.realpath(source.root / name)), MAX_COPIED_BYTES, CopiedFileError)
                if not carries_card(ours.decode("utf-8", errors="replace"), theirs.decode("utf-8", errors="replace")):
                    problems.append(f"{name}: does not carry the source's model card below the package's own")
            elif copy_regular(path, None, CopiedFileError, follow=False) != copy_regular(
                Path(os.path.realpath(source.root / name)), None, CopiedFileError
            ):
                problems.append(f"{name}: differs from the source's {name}")
        except CopiedFileError as exc:
            problems.append(exc.message)
    return compared, problems
