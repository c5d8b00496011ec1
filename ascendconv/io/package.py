"""Read an AscendV1 package: description, index, shard headers, provenance, config.

Reading is lenient on purpose: disagreements between the parts are collected, not raised, because
`inspect` reports them and `verify` turns each into a failed check. Only a directory that is not a
package at all (no readable description) raises.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterator

from ascendconv.errors import (
    AscendconvError, HeaderError, NotFoundError, PackageAsSourceError, PackageError, PackageReplacedError,
    PartDirectoryError, plural, shown,
)
from ascendconv.io.files import file_size, identity, irregular_kind, read_json_object
from ascendconv.formats.constants import FLOAT, GROUP_SIZE
from ascendconv.io.safetensors import SafetensorsHeader, TensorEntry, read_header
from ascendconv.sources.base import NATIVE_TYPES
from ascendconv.ascendv1 import (
    DESCRIPTION_NAME,
    DESCRIPTION_VERSION,
    INDEX_NAME,
    PART_MANIFEST_NAME,
    PROVENANCE_NAME,
    QUANT_TYPES,
    SCHEME_TABLE,
    SINGLE_SHARD_NAME,
    Provenance,
    quant_type_named,
    split_description,
)


def is_package(path: Path) -> bool:
    """A description of any kind makes a package: one that is no regular file is refused by name when
    read, not taken for none (which would call the package incomplete)."""
    return os.path.lexists(path / DESCRIPTION_NAME)


@contextlib.contextmanager
def unreplaced(root: Path, doing: str) -> Iterator[None]:
    """PackageReplacedError if, when the block inside ends or fails, `root` is no longer the
    directory it was on entry: a run published another package there meanwhile (--overwrite), and
    the files read may come from both, so neither what was read of that mix nor its failure may be
    reported. `doing` says what the block did to it ('verified')."""
    was = identity(root)
    try:
        yield
    except (AscendconvError, OSError) as exc:
        _still_there(root, was, doing, exc)
        raise
    _still_there(root, was, doing)


def _still_there(root: Path, was: tuple[int, int] | None, doing: str, failure: BaseException | None = None) -> None:
    if identity(root) == was:
        return
    raise PackageReplacedError(
        f"{root}: was replaced while it was being {doing} (a run published a package there); the files read "
        "may come from the old package and the new one, so nothing is reported of either"
    ) from failure


def _load_json(path: Path) -> dict:
    return read_json_object(path, PackageError)


def _check_index(path: Path, index: dict) -> None:
    """The index's shape, which everything else relies on: weight_map names a file for each tensor."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise PackageError(f"{path}: weight_map is {shown(weight_map)}, not an object")
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise PackageError(f"{path}: weight_map maps {shown(name)} to {shown(file)}, not to a file name")
    if not isinstance(index.get("metadata", {}), dict):
        raise PackageError(f"{path}: metadata is {shown(index['metadata'])}, not an object")


@dataclass
class Package:
    """One lenient reading of a package, shared by `inspect` and `verify` so that they always see the
    same thing: the shards the package is made of (`expected`: named by the index, or the single
    weight file) are read; a `*.safetensors` beside them is a stray (named, never read as part of the
    package, although vLLM would load it); an expected shard that is absent is missing."""

    root: Path
    description: dict[str, str]  # tensor name -> TYPE
    fields: dict[str, object]  # version, model_quant_type, group_size, ...
    index: dict | None
    headers: dict[str, SafetensorsHeader]  # expected shard file -> header, for readable shards
    broken_shards: dict[str, str]  # expected shard file -> why its header could not be read
    tensors: dict[str, TensorEntry]
    duplicates: list[tuple[str, str, str]] = field(default_factory=list)  # (tensor, file, other file)
    provenance: dict | None = None
    config: dict | None = None
    expected: list[str] = field(default_factory=list)  # the shards the package is made of
    present: list[str] = field(default_factory=list)  # every *.safetensors in the directory
    irregular: dict[str, str] = field(default_factory=dict)  # index, provenance, config.json -> what it is instead

    @classmethod
    def open(cls, path: str | Path) -> "Package":
        root = Path(path)
        if not root.is_dir():
            raise NotFoundError(f"{root}: no such directory")
        if not is_package(root):
            raise PackageError(f"{root}: no {DESCRIPTION_NAME}; this is not an AscendV1 package")
        raw = _load_json(root / DESCRIPTION_NAME)
        description, fields = split_description(raw)
        # read leniently as absent, as vLLM cannot read them either, but named among the disagreements
        irregular = {f: kind for f in (INDEX_NAME, PROVENANCE_NAME, "config.json") if (kind := irregular_kind(root / f))}
        index = _load_json(root / INDEX_NAME) if (root / INDEX_NAME).is_file() else None
        if index is not None:
            _check_index(root / INDEX_NAME, index)
        provenance = _load_json(root / PROVENANCE_NAME) if (root / PROVENANCE_NAME).is_file() else None
        config = _load_json(root / "config.json") if (root / "config.json").is_file() else None

        present = sorted(p.name for p in root.glob("*.safetensors"))
        if index is not None:
            expected = sorted(set(index["weight_map"].values()))
        else:
            expected = [SINGLE_SHARD_NAME]
        headers: dict[str, SafetensorsHeader] = {}
        broken: dict[str, str] = {}
        tensors: dict[str, TensorEntry] = {}
        duplicates = []
        present_names = set(present)
        for shard in (root / name for name in expected if name in present_names):
            try:
                header = read_header(shard)
            except HeaderError as exc:
                broken[shard.name] = exc.message
                continue
            headers[shard.name] = header
            for name, entry in header.tensors.items():
                if name in tensors:
                    duplicates.append((name, shard.name, tensors[name].path.name))
                else:
                    tensors[name] = entry
        return cls(
            root, description, fields, index, headers, broken, tensors, duplicates, provenance, config, expected, present,
            irregular,
        )

    @property
    def record(self) -> Provenance:
        """The provenance file as a typed record (empty when there is none)."""
        return Provenance(self.provenance or {})

    # Membership by sets: a package may have 100,000 shards, and lists would make these quadratic.
    @cached_property
    def missing(self) -> list[str]:
        present = set(self.present)
        return [f for f in self.expected if f not in present]

    @cached_property
    def strays(self) -> list[str]:
        expected = set(self.expected)
        return [f for f in self.present if f not in expected]

    @property
    def shard_files(self) -> list[str]:
        return sorted([*self.headers, *self.broken_shards])

    @property
    def weight_map(self) -> dict[str, str]:
        if self.index and isinstance(self.index.get("weight_map"), dict):
            return self.index["weight_map"]
        return {}

    @property
    def total_bytes(self) -> int:
        return sum(file_size(self.root / f) for f in self.shard_files)

    def unknown_types(self) -> list[str]:
        """A problem per description entry whose type names no known type, or is no string at all."""
        return [
            f"{shown(name)} has type {shown(label)}; known types: {', '.join(QUANT_TYPES)}"
            for name, label in sorted(self.description.items())
            if quant_type_named(label) is None
        ]

    def scheme_problems(self) -> list[str]:
        """Where the provenance's scheme cannot have written the described types: an unknown scheme,
        or a type that is neither one the scheme asks for, nor FLOAT (modules the model keeps so),
        nor written by a recorded fallback or --override (with no fallbacks recorded, an older
        package: any type down the chains of those it asks for)."""
        record = self.record
        scheme = record.scheme
        if scheme is None:
            return []  # no scheme recorded: the provenance check says so
        row = SCHEME_TABLE.get(scheme)
        if row is None:
            return [f"{PROVENANCE_NAME}: scheme is {shown(scheme)}, not one convert writes ({', '.join(SCHEME_TABLE)})"]
        asked = {row.linear, row.expert, *(NATIVE_TYPES.values() if row.native else ())}
        asked |= {o.rpartition("=")[2] for o in record.overrides}
        writable = {FLOAT, *asked} | record.chosen_types()
        if "fallbacks" not in (self.provenance or {}):
            writable |= {t for name in asked if name in QUANT_TYPES for t in QUANT_TYPES[name].chain()}
        strays: dict[str, list[str]] = {}
        for name, label in sorted(self.description.items()):
            if quant_type_named(label) is not None and label not in writable:
                strays.setdefault(label, []).append(name)
        return [
            f"{PROVENANCE_NAME}: scheme {scheme} writes {row.linear} linears and {row.expert} routed experts, but "
            f"{plural(len(names), 'described tensor')} {'is' if len(names) == 1 else 'are'} {label} "
            f"(e.g. {shown(names[0])}), which no recorded fallback or override writes: the package was not "
            "converted with the scheme recorded"
            for label, names in strays.items()
        ]

    def field_problems(self) -> list[str]:
        """Where the description's own fields (version, group_size, metadata, optional) are not
        what vllm-ascend's loader reads: each named with what the file holds."""
        fields, problems = self.fields, []
        if fields.get("version") != DESCRIPTION_VERSION:
            problems.append(f"version is {field_shown(fields, 'version')}, expected {DESCRIPTION_VERSION!r}")
        group_size = fields.get("group_size")
        if type(group_size) is not int or group_size != GROUP_SIZE:  # 32.0 == 32, but breaks vllm-ascend's shapes
            problems.append(
                f"group_size is {field_shown(fields, 'group_size')}, expected the integer {GROUP_SIZE} "
                "(0 breaks the loader, a float its shapes)"
            )
        for key in ("metadata", "optional"):
            if not isinstance(fields.get(key, {}), dict):
                problems.append(f"{key} is {shown(fields[key])}, expected an object")
        return problems

    def disagreements(self) -> list[str]:
        """Where description, index and shard headers do not name the same tensors."""
        problems = [f"{f} is {kind}, not a regular file: read as absent" for f, kind in self.irregular.items()]
        problems += [
            f"stray file {f}: not part of the package, and vLLM loads every *.safetensors in the directory"
            for f in self.strays
        ]
        problems += [f"shard {f} is missing" for f in self.missing]
        problems += [f"{f}: {why}" for f, why in sorted(self.broken_shards.items())]
        problems += [f"tensor {shown(n)} is in both {a} and {b}" for n, a, b in self.duplicates]
        described, stored = set(self.description), set(self.tensors)
        if not self.broken_shards and not self.missing:
            problems += [f"{shown(n)} is described but in no shard" for n in sorted(described - stored)]
        problems += [f"{shown(n)} is in {self.tensors[n].path.name} but not described" for n in sorted(stored - described)]
        if self.index is not None:
            weight_map = self.weight_map
            for name, file in sorted(weight_map.items()):
                entry = self.tensors.get(name)
                if entry is not None and entry.path.name != file:
                    problems.append(f"index maps {shown(name)} to {shown(file)} but it is in {entry.path.name}")
                elif entry is None and not self.broken_shards and not self.missing:
                    problems.append(f"index maps {shown(name)} to {shown(file)} but no shard holds it")
            problems += [f"{shown(n)} is in {self.tensors[n].path.name} but not in the index" for n in sorted(stored - set(weight_map))]
        return problems


def field_shown(fields: dict, key: str) -> str:
    """A JSON object's field as a message shows it, 'missing' where it is not there."""
    return shown(fields[key]) if key in fields else "missing"


def refuse_part_directory(directory: Path, wanted: str) -> None:
    """A part directory is not a package: say which part it is and that `assemble` makes the package."""
    import json

    manifest_path = directory / PART_MANIFEST_NAME
    if not manifest_path.is_file() or manifest_path.is_symlink():
        return
    try:
        manifest = json.loads(manifest_path.read_bytes()[: 1 << 20])
    except ValueError:
        manifest = {}
    number, count = (manifest.get("part"), manifest.get("parts")) if isinstance(manifest, dict) else (None, None)
    which = f"part {number} of {count}" if isinstance(number, int) and isinstance(count, int) else "a part"
    raise PartDirectoryError(
        f"{directory}: {which} of a `convert --part` run, not {wanted}",
        "run assemble: `ascendconv assemble OUT PARTDIR...` with every part's directory, then use OUT",
    )


def refuse_package_as_source(directory: Path, hint: str | None = None) -> None:
    """A package (or a part of one) given where a source checkpoint is expected, which failed to open
    as one: say what it is, not what a source would lack (its config.json has no quantization_config)."""
    if (directory / PART_MANIFEST_NAME).is_file():  # inspect and verify refuse a part: never hint them
        raise PackageAsSourceError(
            f"{directory}: this is a part of an AscendV1 package (it holds {PART_MANIFEST_NAME}), not a source checkpoint",
            hint or "pass the checkpoint it came from; `ascendconv assemble OUT PARTDIR...` joins the parts into the package",
        )
    marker = DESCRIPTION_NAME if (directory / DESCRIPTION_NAME).is_file() else None
    if marker is not None:
        raise PackageAsSourceError(f"{directory}: this is an AscendV1 package (it holds {marker}), not a source checkpoint", hint)
