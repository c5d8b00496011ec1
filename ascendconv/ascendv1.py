"""The AscendV1 package format as code (contract section 3): what every other module builds from.

File names and layout, the description's schema and version, and one table of quant types from which
a package tensor's dtype and shape, its scale's shape and its K rule are computed instead of being
worked out again in branches. `plan` writes by it, `io/package` reads by it, `inspect` and `verify`
check by it. Pure: no I/O, no numpy.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ascendconv.formats.constants import E2M1, E4M3, FLOAT, GROUP_SIZE, W4A8_MXFP, W8A8_MXFP8, ElementFormat

# --- files ---------------------------------------------------------------------------------------

SHARD_NAME = "quant_model_weights-{:05d}-of-{:05d}.safetensors"
SHARD_PATTERN = re.compile(r"^quant_model_weights-(\d{5})-of-(\d{5})\.safetensors$")
SINGLE_SHARD_NAME = "quant_model_weights.safetensors"  # --max-shard-size 0: one file, no index
INDEX_NAME = "quant_model_weights.safetensors.index.json"
DESCRIPTION_NAME = "quant_model_description.json"
PROVENANCE_NAME = "ascendconv_provenance.json"  # ours; loaders ignore it
PART_MANIFEST_NAME = "ascendconv_part.json"  # in a part directory (convert --part), not in a package
DEFAULT_MAX_SHARD_SIZE = 4 * 1024**3  # msModelSlim's part_file_size


def is_shard_name(name: str) -> bool:
    return name == SINGLE_SHARD_NAME or SHARD_PATTERN.match(name) is not None


def written_by_package(name: str) -> bool:
    """A name the package writes itself: a source file of that name would overwrite or shadow it."""
    return name in (DESCRIPTION_NAME, INDEX_NAME, PROVENANCE_NAME, PART_MANIFEST_NAME) or name.startswith(
        "quant_model_weights"
    )


# --- the description -----------------------------------------------------------------------------

DESCRIPTION_VERSION = "1.0.0"
# The keys beside the tensor entries; a tensor may never bear one of these names.
DESCRIPTION_FIELDS = ("version", "model_quant_type", "metadata", "group_size", "optional")


def description_document(entries: dict[str, str], model_quant_type: str) -> dict:
    """quant_model_description.json: one "tensor": "TYPE" per tensor (sorted), then the fields."""
    return {
        **dict(sorted(entries.items())),
        "version": DESCRIPTION_VERSION,
        "model_quant_type": model_quant_type,
        "metadata": {},
        "group_size": GROUP_SIZE,
        "optional": {},
    }


def split_description(raw: dict) -> tuple[dict, dict]:
    """A description read back: (tensor name -> TYPE, the fields present)."""
    fields = {k: raw[k] for k in DESCRIPTION_FIELDS if k in raw}
    return {k: v for k, v in raw.items() if k not in DESCRIPTION_FIELDS}, fields


# --- the quant types -----------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantType:
    """One TYPE of the description and what a weight [N, K] of that type is in the package.

    element: the MX element format of the payload (None: FLOAT holds plain values);
    weight_dtype: the payload's safetensors dtype (None: FLOAT keeps the source's dtype, or BF16 for
    a resolved FP8 weight); k_per_byte: payload elements per stored byte along K (2 for packed E2M1);
    scaled: whether `P.weight_scale` (U8, E8M0, one byte per 32 values along K) comes with it;
    linear_k / routed_k: what K (per rank) must be a multiple of, for a linear and for a routed expert.
    """

    name: str
    rank: int  # msModelSlim's priority order: model_quant_type is the highest present
    element: ElementFormat | None
    weight_dtype: str | None
    k_per_byte: int
    scaled: bool
    linear_k: int
    routed_k: int
    why_paired: str = ""  # why the rule is 2 groups, in words

    def weight_shape(self, n: int, k: int) -> tuple[int, int]:
        return (n, k // self.k_per_byte)

    def scale_shape(self, n: int, k: int) -> tuple[int, int] | None:
        return (n, -(-k // GROUP_SIZE)) if self.scaled else None

    def k_multiple(self, routed: bool) -> int:
        return self.routed_k if routed else self.linear_k

    def k_problem(self, k: int, routed: bool, k_label: str | None = None) -> str | None:
        """Why a weight with reduction size K (per rank) cannot take this type, or None if it can."""
        multiple = self.k_multiple(routed)
        if k % multiple == 0:
            return None
        why = self.why_paired if multiple == self.linear_k else "MoE experts pair scale groups"
        return f"{k_label or f'K={k}'} is not a multiple of {multiple}" + (f" ({why})" if multiple == 2 * GROUP_SIZE else "")


QUANT_TYPES: dict[str, QuantType] = {
    FLOAT: QuantType(FLOAT, 0, None, None, 1, False, 1, 1),
    # The linear loader pads an odd scale-group count, but MoE experts pair groups without padding.
    W8A8_MXFP8: QuantType(W8A8_MXFP8, 1, E4M3, "F8_E4M3", 1, True, GROUP_SIZE, 2 * GROUP_SIZE),
    W4A8_MXFP: QuantType(W4A8_MXFP, 2, E2M1, "U8", 2, True, 2 * GROUP_SIZE, 2 * GROUP_SIZE, "W4A8_MXFP pairs scale groups"),
}
RANK = {name: t.rank for name, t in QUANT_TYPES.items()}
MX_TYPES = tuple(name for name, t in QUANT_TYPES.items() if t.scaled)  # the types with E8M0 scales


def quant_type_named(label: object) -> QuantType | None:
    """The table entry a description label names, or None: an unknown type, or no string at all
    (a description is read from a file anyone may have written)."""
    return QUANT_TYPES.get(label) if isinstance(label, str) else None


# --- provenance ------------------------------------------------------------------------------------

LEGACY_CHECKSUM = "sha256"  # what packages written before the "checksum" field recorded


def _json_value(value):
    """A record as the JSON the file holds: dataclasses as objects with their fields in declaration
    order (the file's key order), tuples as lists."""
    if dataclasses.is_dataclass(value):
        return {f.name: _json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


@dataclass(frozen=True)
class SourceFileRecord:
    """One source shard as provenance identifies it: its header and size, not its data."""

    name: str
    size: int
    fingerprint: str  # sha256 of the header bytes and the size


@dataclass(frozen=True)
class SourceRecord:
    name: str  # the source directory's name
    format: str  # the source format's name (sources/: "hf-fp8-block", ...)
    quantization_config: str  # where config.json holds it ("quantization_config" or under "text_config")
    params: dict  # what the format read from its config (e.g. weight_block_size)
    files: tuple[SourceFileRecord, ...]


LEGACY_SOURCE_FORMAT = "hf-fp8-block"  # packages of 0.3 and before record no format: they read only this one


@dataclass(frozen=True)
class ProvenanceRecord:
    """ascendconv_provenance.json as `convert` writes it, less the shard checksums: nothing in it
    depends on the run (time, host, part), so a package assembled from parts carries the same file
    as a one-process conversion. The fields, in this order, are the file's keys; `Provenance` reads
    them back."""

    tool: str
    version: str
    source: SourceRecord
    scheme: str
    scale_rule: str
    resolve_dtype: str
    kernel: str
    fallbacks: tuple[dict, ...]  # plan.ModuleDecision.to_dict() of each fallback
    source_nonfinite: dict[str, int]  # FLOAT tensor carried from the source -> its NaN / Inf values
    checksum: str  # the algorithm of the shard digests
    # tensors the package adds (FLOAT copies the MTP drafter needs): name -> {"source", "reason"}
    added_tensors: dict[str, dict] = dataclasses.field(default_factory=dict)

    def base(self) -> dict:
        """The record as JSON (what a part manifest keeps to write the provenance when assembled)."""
        return _json_value(self)

    def document(self, digests: dict[str, str]) -> dict:
        return provenance_document(self.base(), digests)


def provenance_document(base: dict, digests: dict[str, str]) -> dict:
    """The provenance file: a record's JSON (`ProvenanceRecord.base`), then every shard's digest
    under the record's checksum algorithm."""
    return {**base, "shards": {name: {base["checksum"]: digest} for name, digest in sorted(digests.items())}}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _text_field(key: str) -> property:
    """A provenance field that should be a string: its value, or None."""
    return property(lambda self: _text(self.raw.get(key)))


@dataclass(frozen=True)
class Provenance:
    """ascendconv_provenance.json as read back: every field typed, None where the file does not hold
    a value of the right type (it is a file anyone may have edited; `verify` says what is wrong).

    Written from a `ProvenanceRecord` (its fields, then shards)."""

    raw: dict

    SETTINGS = ("version", "scheme", "scale_rule", "resolve_dtype", "kernel")  # how the package was made

    tool = _text_field("tool")
    version = _text_field("version")
    scheme = _text_field("scheme")
    scale_rule = _text_field("scale_rule")
    resolve_dtype = _text_field("resolve_dtype")
    kernel = _text_field("kernel")

    def settings(self) -> dict:
        """The settings as recorded (values of any type: reports show what the file holds)."""
        return {key: self.raw.get(key) for key in self.SETTINGS}

    def origin(self) -> str:
        """The settings in one line, as reports print them."""
        s = self.settings()
        return (
            f"ascendconv {s['version']}, {s['scheme']}, rule {s['scale_rule']}, resolve {s['resolve_dtype']}, "
            f"kernel {s['kernel']}"
        )

    @property
    def source(self) -> dict:
        source = self.raw.get("source")
        return source if isinstance(source, dict) else {}

    @property
    def source_name(self) -> str | None:
        return _text(self.source.get("name"))

    @property
    def source_format(self) -> str | None:
        """The source format's name (None where the file holds something else)."""
        return _text(self.source.get("format", LEGACY_SOURCE_FORMAT))

    @property
    def source_files(self) -> list | None:
        files = self.source.get("files")
        return files if isinstance(files, list) else None

    @property
    def fallbacks(self) -> list | None:
        fallbacks = self.raw.get("fallbacks", [])
        return fallbacks if isinstance(fallbacks, list) else None

    @property
    def checksum(self) -> object:
        """The checksum algorithm's name as recorded (possibly not a string: verify reports it)."""
        return self.raw.get("checksum", LEGACY_CHECKSUM)

    @property
    def shards(self) -> dict | None:
        shards = self.raw.get("shards")
        return shards if isinstance(shards, dict) else None

    def digest(self, shard: str) -> str | None:
        """The hex digest recorded for `shard` under the recorded algorithm, or None."""
        entry = (self.shards or {}).get(shard)
        algorithm = self.checksum
        if not isinstance(entry, dict) or not isinstance(algorithm, str):
            return None
        return _text(entry.get(algorithm))

    @property
    def added_tensors(self) -> dict[str, str]:
        """Tensor the package added -> the source tensor it copies (valid entries only)."""
        recorded = self.raw.get("added_tensors")
        if not isinstance(recorded, dict):
            return {}
        return {
            name: entry["source"]
            for name, entry in recorded.items()
            if isinstance(name, str) and isinstance(entry, dict) and isinstance(entry.get("source"), str)
        }

    @property
    def source_nonfinite(self) -> dict[str, int]:
        """FLOAT tensor -> NaN / Inf values convert carried from the source (valid entries only)."""
        recorded = self.raw.get("source_nonfinite")
        if not isinstance(recorded, dict):
            return {}
        return {k: v for k, v in recorded.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
