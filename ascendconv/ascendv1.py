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

from ascendconv.errors import BadOptionError, json_kind, json_shown, json_text, shown
from ascendconv.formats.constants import (
    E2M1,
    E4M3,
    FLOAT,
    GROUP_SIZE,
    W4A4_MXFP4,
    W4A8_MXFP,
    W4A16_MXFP4,
    W8A8_MXFP8,
    ElementFormat,
)

# --- files ---------------------------------------------------------------------------------------

SHARD_NAME = "quant_model_weights-{:05d}-of-{:05d}.safetensors"
# five digits at least: a plan of more than 99,999 shards names them with six, which must still match
SHARD_PATTERN = re.compile(r"^quant_model_weights-(\d{5,})-of-(\d{5,})\.safetensors$")
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
class MoeCheck:
    """What `verify --moe-check` runs for a MoE layer of one type (contract section 5): the CPU chain
    the runtime's activations go through. `activation`: what the activations into gate/up and into
    down_proj are quantized to (None: they stay BF16); `input_round` / `inner_round`: the element
    rounding of each (contract section 4); `op_reference`: the GroupedMatmulSituQuant reference on
    the packed experts instead of the float chain."""

    path: str  # how the report names the chain
    activation: ElementFormat | None
    input_round: str = "rint"
    inner_round: str = "rint"
    op_reference: bool = False


@dataclass(frozen=True)
class QuantType:
    """One TYPE of the description: what a weight [N, K] of that type is in the package, where the
    loader takes it, and how convert falls back from it and verify judges it (contract section 3).

    element / activation: the MX element format of the weights and of the activations at run time
    (None: FLOAT holds plain values; an A16 type keeps BF16 activations);
    weight_dtype: the payload's safetensors dtype (None: FLOAT keeps the source's dtype, or BF16 for
    a resolved FP8 weight); k_per_byte: payload elements per stored byte along K (2 for packed E2M1);
    scaled: whether `P.weight_scale` (U8, E8M0, one byte per 32 values along K, cdiv(K, 32) columns)
    comes with it; linear_k / routed_k: what K (per rank) must be a multiple of, for a linear and for
    a routed expert (None: vllm-ascend has no scheme for the type there); fallback: the next type
    down the chain convert walks when K does not fit; min_sqnr_db / moe_rel_err: verify's default
    thresholds (None: exact, for FLOAT); moe_check: the chain `verify --moe-check` runs.
    """

    name: str
    rank: int  # model_quant_type is the highest present (msModelSlim's order; W4A16_MXFP4's is ours)
    element: ElementFormat | None
    activation: ElementFormat | None
    weight_dtype: str | None
    k_per_byte: int
    scaled: bool
    linear_k: int | None
    routed_k: int | None
    fallback: str | None
    min_sqnr_db: float | None
    moe_rel_err: float
    moe_check: MoeCheck
    why_paired: str = ""  # why the rule is 2 groups, in words
    not_for_linears: str = ""  # why a linear cannot take it, when linear_k is None
    runtime: str = ""  # what vllm-ascend runs with it, in a few words (inspect)

    def weight_shape(self, n: int, k: int) -> tuple[int, int]:
        return (n, k // self.k_per_byte)

    def scale_shape(self, n: int, k: int) -> tuple[int, int] | None:
        return (n, -(-k // GROUP_SIZE)) if self.scaled else None

    def k_multiple(self, routed: bool) -> int | None:
        return self.routed_k if routed else self.linear_k

    def k_problem(self, k: int, routed: bool, k_label: str | None = None) -> str | None:
        """Why a weight with reduction size K (per rank) cannot take this type, or None if it can."""
        multiple = self.k_multiple(routed)
        if multiple is None:
            return f"{self.name} is for routed experts only ({self.not_for_linears})"
        if k % multiple == 0:
            return None
        why = self.why_paired if multiple == self.linear_k else "MoE experts pair scale groups"
        return f"{k_label or f'K={k}'} is not a multiple of {multiple}" + (f" ({why})" if multiple == 2 * GROUP_SIZE else "")

    def chain(self) -> tuple[str, ...]:
        """This type and every type below it on its fallback chain, ending at FLOAT."""
        names, at = [self.name], self.fallback
        while at is not None:
            names.append(at)
            at = QUANT_TYPES[at].fallback
        return tuple(names)


# The float chain: activations MXFP8 into gate/up, the SiTU output MXFP8 into down_proj.
_MXFP8_CHAIN = MoeCheck("float chain", E4M3)
# Thresholds (docs/verify.md): MXFP8 weights give about 30 dB on real block-FP8 weights (rel. L2
# 0.03), MXFP4 weights about 19 dB (0.115), whatever the activations.
_MXFP8_DB, _MXFP4_DB = 25.0, 15.0

QUANT_TYPES: dict[str, QuantType] = {
    FLOAT: QuantType(FLOAT, 0, None, None, None, 1, False, 1, 1, None, None, 0.10, _MXFP8_CHAIN,
                     runtime="unquantized BF16 matmuls"),
    # The linear loader pads an odd scale-group count, but MoE experts pair groups without padding.
    W8A8_MXFP8: QuantType(
        W8A8_MXFP8, 1, E4M3, E4M3, "F8_E4M3", 1, True, GROUP_SIZE, 2 * GROUP_SIZE, FLOAT, _MXFP8_DB, 0.10,
        _MXFP8_CHAIN, runtime="MXFP8 weights, activations quantized to MXFP8 at run time",
    ),
    # Weight-only: byte for byte the W4A8_MXFP experts; its MoE scales are not paired, so K % 32.
    W4A16_MXFP4: QuantType(
        W4A16_MXFP4, 2, E2M1, None, "U8", 2, True, None, GROUP_SIZE, W8A8_MXFP8, _MXFP4_DB, 0.30,
        MoeCheck("float chain, BF16 activations", None),
        not_for_linears="vllm-ascend registers no W4A16_MXFP4 linear scheme",
        runtime="MXFP4 weights unpacked and int4-packed at load, BF16 activations; no EPLB",
    ),
    W4A8_MXFP: QuantType(
        W4A8_MXFP, 3, E2M1, E4M3, "U8", 2, True, 2 * GROUP_SIZE, 2 * GROUP_SIZE, W8A8_MXFP8, _MXFP4_DB, 0.30,
        MoeCheck("gmm_situ reference", E4M3, op_reference=True), "W4A8_MXFP pairs scale groups",
        runtime="MXFP4 weights (NZ), activations quantized to MXFP8 at run time; no EPLB",
    ),
    # The linear loader pads an odd group count (as for W8A8_MXFP8); MoE experts pair groups.
    # Activations: round_mode "round" into gate/up, the op's default (rint) into down_proj.
    W4A4_MXFP4: QuantType(
        W4A4_MXFP4, 4, E2M1, E2M1, "U8", 2, True, GROUP_SIZE, 2 * GROUP_SIZE, W4A8_MXFP, _MXFP4_DB, 0.40,
        MoeCheck("float chain, MXFP4 activations", E2M1, input_round="round"),
        runtime="MXFP4 weights (no NZ cast), activations quantized to MXFP4 at run time (round_mode round)",
    ),
}
RANK = {name: t.rank for name, t in QUANT_TYPES.items()}
MX_TYPES = tuple(name for name, t in QUANT_TYPES.items() if t.scaled)  # the types with E8M0 scales


# --- the schemes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemeRow:
    """One `--scheme`: the type every source linear asks for, and the type routed experts ask for;
    `native`: an MX source linear asks for the type its bytes already are instead (re-laid out)."""

    name: str
    linear: str
    expert: str
    native: bool = False

    def requested(self, routed: bool) -> str:
        return self.expert if routed else self.linear


SCHEME_ROWS: tuple[SchemeRow, ...] = (
    SchemeRow("w8a8-mxfp8", W8A8_MXFP8, W8A8_MXFP8),
    SchemeRow("w4a8-mxfp", W4A8_MXFP, W4A8_MXFP),
    SchemeRow("w4a8-mxfp-moe", W8A8_MXFP8, W4A8_MXFP),
    SchemeRow("w4a16-mxfp4-moe", W8A8_MXFP8, W4A16_MXFP4),
    SchemeRow("w4a4-mxfp4", W4A4_MXFP4, W4A4_MXFP4),
    SchemeRow("w4a4-mxfp4-moe", W8A8_MXFP8, W4A4_MXFP4),
    SchemeRow("native", W8A8_MXFP8, W8A8_MXFP8, native=True),
)
SCHEME_TABLE: dict[str, SchemeRow] = {row.name: row for row in SCHEME_ROWS}


def quant_type_named(label: object) -> QuantType | None:
    """The table entry a description label names, or None: an unknown type, or no string at all
    (a description is read from a file anyone may have written)."""
    return QUANT_TYPES.get(label) if isinstance(label, str) else None


# --- provenance ------------------------------------------------------------------------------------

LEGACY_CHECKSUM = "sha256"  # what packages written before the "checksum" field recorded
SOURCE_DATA_KEY = "source_data"  # a shard's digest of the source bytes it was made from (absent before)


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
    """One source shard as provenance identifies it: its header and size, and a sample of its data
    that reads every tensor (so two checkpoints of one layout, a fine-tune of a few layers or a
    re-upload, are told apart). Packages of before recorded "data_sample" (shard windows only,
    io.checksum.sampled_digest) instead of "tensor_sample"."""

    name: str
    size: int
    fingerprint: str  # sha256 of the header bytes and the size
    tensor_sample: str  # BLAKE3 of windows of every tensor and of the shard (io.checksum.tensor_sampled_digest)


@dataclass(frozen=True)
class SourceRecord:
    name: str  # the source directory's name
    format: str  # the source format's name (sources/: "hf-fp8-block", ...)
    quantization_config: str  # where config.json holds it ("quantization_config" or under "text_config")
    params: dict  # what the format read from its config (e.g. weight_block_size)
    files: tuple[SourceFileRecord, ...]


LEGACY_SOURCE_FORMAT = "hf-fp8-block"  # packages of 0.3 and before record no format: they read only this one


@dataclass(frozen=True)
class HubRecord:
    repo_id: str  # org/name
    revision: str  # the snapshot's commit


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
    hub: HubRecord | None  # the Hugging Face repo the source is a cached snapshot of, if it is one
    deployment: dict  # {"tp", "ep", "shared_experts_as_routed", "mtp_heads"} the plan was made for
    overrides: tuple[str, ...]  # every --override as given, GLOB=TYPE
    command: str  # the convert command that makes this package again (run-only options left out)
    # tensors the package adds (FLOAT copies the MTP drafter needs): name -> {"source", "reason"}
    added_tensors: dict[str, dict] = dataclasses.field(default_factory=dict)

    def base(self) -> dict:
        """The record as JSON (what a part manifest keeps to write the provenance when assembled)."""
        return _json_value(self)

    def document(
        self, digests: dict[str, str], sizes: dict[str, int], files: dict[str, str], date: str, reads: dict[str, str]
    ) -> dict:
        return provenance_document(self.base(), digests, sizes, files, date, reads)


def provenance_document(
    base: dict, digests: dict[str, str], sizes: dict[str, int], files: dict[str, str], date: str,
    reads: dict[str, str],
) -> dict:
    """The provenance file: a record's JSON (`ProvenanceRecord.base`), the date the package was
    written (the only field that depends on the run: kept out of the record, so parts converted at
    different times still make one plan), the sha256 of every other file the package holds
    (description, index, config.json, the files copied from the source), then every shard's digest
    under the record's checksum algorithm, its size (which verify compares before it reads a byte of
    the shard) and the BLAKE3 digest of the source bytes it was made from ("source_data", hashed as
    convert read them: io.checksum.reads_digest), which `verify --source` checks."""
    return {
        **base,
        "date": date,
        "files": dict(sorted(files.items())),
        "shards": {
            name: {base["checksum"]: digest, "size": sizes[name], SOURCE_DATA_KEY: reads[name]}
            for name, digest in sorted(digests.items())
        },
    }


LAST_DATE_EPOCH = 253402300799  # 9999-12-31T23:59:59Z: the last date the provenance's format can spell


def package_date(environ=None) -> str:
    """When the package is written, in UTC to the second: SOURCE_DATE_EPOCH when set (the
    reproducible-builds convention, for a byte-identical package), else now. A value that is not
    whole seconds since 1970 (`1.5`, `-1`, a word, beyond year 9999) is BadOptionError: taken as
    unset it would give other bytes at every run without a word, and one past time_t was a crash
    after the whole conversion; convert and assemble call this before they start."""
    import os
    import time

    environ = os.environ if environ is None else environ
    epoch = environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch and not (epoch.isascii() and epoch.isdigit() and len(epoch) <= len(str(LAST_DATE_EPOCH)) and int(epoch) <= LAST_DATE_EPOCH):
        raise BadOptionError(
            f"SOURCE_DATE_EPOCH={shown(epoch)}: not a whole number of seconds since 1970 (the package's date)",
            "set it as `date +%s` prints one (e.g. SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)), or unset it",
        )
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch) if epoch else int(time.time())))


# The recorded deployment's fields (ProvenanceRecord.deployment), what each must hold, and how
# Provenance.deployment_value finds one. mtp_heads (--no-mtp-heads) is recorded since the drafter
# heads were added: a package of before lacks it, and a deployment without it is still read.
DEPLOYMENT_FIELDS = {"tp": "a positive integer", "ep": "true or false", "shared_experts_as_routed": "true or false"}
OPTIONAL_DEPLOYMENT_FIELDS = {"mtp_heads": "true or false"}
RECORDED, ABSENT, UNREADABLE = "recorded", "absent", "unreadable"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ObjectShape:
    """The shape of a JSON object of known keys: each key's shape, the keys every package holds
    (packages of before may lack the others; keys added later are not judged), and whether null
    stands for it."""

    shapes: dict
    required: tuple[str, ...] = ()
    nullable: bool = False


@dataclass(frozen=True)
class EntriesShape:
    """The shape of a JSON list (or, `keyed`, of an object of any keys) whose every entry has `shape`."""

    shape: object
    keyed: bool = False


LEAF_NAMES = {str: "a string", int: "an integer", dict: "an object"}


def _expected(shape: object) -> str:
    if isinstance(shape, ObjectShape):
        return "an object or null" if shape.nullable else "an object"
    if isinstance(shape, EntriesShape):
        return "an object" if shape.keyed else "a list"
    return LEAF_NAMES[shape]


def shape_problems(path: str, value: object, shape: object) -> list[str]:
    """Where `value` (read from JSON, at `path`) is not of `shape`: one message per field of the
    wrong JSON type or missing; of a list's or keyed object's entries, the first, with how many there
    are (a package has as many fallbacks as modules)."""
    at = (lambda key: f"{path}.{key}") if path else str
    if isinstance(shape, ObjectShape):
        if value is None and shape.nullable:
            return []
        if not isinstance(value, dict):
            return [f"{path} is {json_kind(value)}, expected {_expected(shape)}"]
        problems = []
        for key, inner in shape.shapes.items():
            if key in value:
                problems += shape_problems(at(key), value[key], inner)
            elif key in shape.required:
                problems.append(f"{at(key)} is missing, expected {_expected(inner)}")
        return problems
    if isinstance(shape, EntriesShape):
        if not isinstance(value, dict if shape.keyed else list):
            return [f"{path} is {json_kind(value)}, expected {_expected(shape)}"]
        items = ((f"{path}[{json_shown(k)}]", v) for k, v in value.items()) if shape.keyed else (
            (f"{path}[{i}]", v) for i, v in enumerate(value))
        wrong = [found for where, entry in items if (found := shape_problems(where, entry, shape.shape))]
        if len(wrong) > 1:
            return [f"{wrong[0][0]} ({len(wrong)} of the {len(value)} entries of {path} are of the wrong shape)"]
        return wrong[0] if wrong else []
    if isinstance(value, bool) or not isinstance(value, shape):  # JSON's true is no integer
        return [f"{path} is {json_kind(value)}, expected {_expected(shape)}"]
    return []


def _text_field(key: str) -> property:
    """A provenance field that should be a string: its value, or None."""
    return property(lambda self: _text(self.raw.get(key)))


FALLBACK_KEYS = ("module", "requested", "written", "reason")  # plan.ModuleDecision.to_dict()

# ascendconv_provenance.json's shape as convert writes it (ProvenanceRecord's fields, then the
# document's), which verify checks and inspect lists; `deployment` has rules of its own
# (Provenance.deployment_problems), and the values (a known scale rule, the package's shards) are
# verify's to judge.
PROVENANCE_SHAPE = ObjectShape(
    {
        "tool": str,
        "version": str,
        "source": ObjectShape(
            {
                "name": str,
                "format": str,
                "quantization_config": str,
                "params": dict,
                "files": EntriesShape(ObjectShape(
                    {"name": str, "size": int, "fingerprint": str, "tensor_sample": str, "data_sample": str}, ("name",),
                )),
            },
            ("name", "files"),
        ),
        "scheme": str,
        "scale_rule": str,
        "resolve_dtype": str,
        "kernel": str,
        "fallbacks": EntriesShape(ObjectShape(dict.fromkeys(FALLBACK_KEYS, str), FALLBACK_KEYS)),
        "source_nonfinite": EntriesShape(int, keyed=True),
        "checksum": str,
        "hub": ObjectShape({"repo_id": str, "revision": str}, ("repo_id", "revision"), nullable=True),
        "overrides": EntriesShape(str),
        "command": str,
        "added_tensors": EntriesShape(ObjectShape({"source": str, "reason": str}, ("source",)), keyed=True),
        "date": str,
        "files": EntriesShape(str, keyed=True),
        "shards": EntriesShape(ObjectShape({"size": int, SOURCE_DATA_KEY: str}), keyed=True),
    },
    ("tool", "version", "source", "scheme", "scale_rule", "resolve_dtype", "kernel", "shards"),
)


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

    command = _text_field("command")
    date = _text_field("date")

    def settings(self) -> dict:
        """The settings as recorded (values of any type: reports show what the file holds)."""
        return {key: self.raw.get(key) for key in self.SETTINGS}

    @property
    def hub(self) -> dict | None:
        """{"repo_id", "revision"} of the source's Hugging Face repo, when recorded as strings."""
        hub = self.raw.get("hub")
        if isinstance(hub, dict) and isinstance(hub.get("repo_id"), str) and isinstance(hub.get("revision"), str):
            return {"repo_id": hub["repo_id"], "revision": hub["revision"]}
        return None

    @property
    def deployment(self) -> dict | None:
        """{"tp": int >= 1, "ep": bool, "shared_experts_as_routed": bool} as recorded, with
        "mtp_heads": bool where recorded, or None (a package of an older version, or a field of the
        wrong types)."""
        fields = {key: self.deployment_value(key) for key in DEPLOYMENT_FIELDS}
        if any(state != RECORDED for state, _ in fields.values()):
            return None
        optional = {key: self.deployment_value(key) for key in OPTIONAL_DEPLOYMENT_FIELDS}
        return {key: value for key, (state, value) in {**fields, **optional}.items() if state == RECORDED}

    def deployment_value(self, key: str) -> tuple[str, object]:
        """One field of the recorded deployment: (RECORDED, value); (ABSENT, None) in a package
        written before deployments (or that optional field) were recorded; (UNREADABLE, what the
        file holds) otherwise."""
        if "deployment" not in self.raw:
            return ABSENT, None
        d = self.raw["deployment"]
        if key in OPTIONAL_DEPLOYMENT_FIELDS and isinstance(d, dict) and key not in d:
            return ABSENT, None
        value = d.get(key) if isinstance(d, dict) else d
        valid = type(value) is int and value >= 1 if key == "tp" else isinstance(value, bool)  # True is no tp
        if valid:
            return RECORDED, value
        return UNREADABLE, value

    def deployment_problems(self) -> list[str]:
        """Each field of the recorded deployment that does not hold a value of its type."""
        deployment = self.raw.get("deployment")
        if "deployment" in self.raw and not isinstance(deployment, dict):
            return [f"deployment is {json_kind(deployment)}, expected an object"]
        return [
            f"deployment.{key} is {json_kind(value) if key in deployment else 'missing'}, expected {what}"
            for key, what in {**DEPLOYMENT_FIELDS, **OPTIONAL_DEPLOYMENT_FIELDS}.items()
            for state, value in [self.deployment_value(key)]
            if state == UNREADABLE
        ]

    def field_problems(self) -> list[str]:
        """Each field missing or of another JSON type than convert writes (PROVENANCE_SHAPE), and
        each of the deployment's that holds no value of its kind."""
        return shape_problems("", self.raw, PROVENANCE_SHAPE) + self.deployment_problems()

    @property
    def overrides(self) -> list[str]:
        recorded = self.raw.get("overrides")
        return [o for o in recorded if isinstance(o, str)] if isinstance(recorded, list) else []

    def details(self) -> dict:
        """Everything a report shows about how the package was made, typed (None where absent)."""
        return {
            **self.settings(),
            "source": self.source_name,
            "hub": self.hub,
            "deployment": self.deployment,
            "overrides": self.overrides,
            "command": self.command,
            "date": self.date,
            "fallbacks": [
                {key: f[key] for key in FALLBACK_KEYS}
                for f in self.fallbacks or []
                if isinstance(f, dict) and all(isinstance(f.get(key), str) for key in FALLBACK_KEYS)
            ],
        }

    def origin(self) -> str:
        """The settings in one line, as reports print them (a value that is no string as the file
        spells it: a missing one, as JSON's null, never as Python's None)."""
        s = {key: json_text(value) for key, value in self.settings().items()}
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
    def source_location(self) -> str | None:
        """Where the source's config.json holds its quantization_config ("" for none), as recorded."""
        return _text(self.source.get("quantization_config"))

    @property
    def source_params(self) -> dict | None:
        """What the source format read from its config, as recorded (None where not recorded as an
        object: packages of 0.3 and before record a weight_block_size beside the files instead)."""
        params = self.source.get("params")
        return params if isinstance(params, dict) else None

    @property
    def source_files(self) -> list | None:
        files = self.source.get("files")
        return files if isinstance(files, list) else None

    @property
    def fallbacks(self) -> list | None:
        fallbacks = self.raw.get("fallbacks", [])
        return fallbacks if isinstance(fallbacks, list) else None

    def chosen_types(self) -> set[str]:
        """The types the run's --override options and fallbacks wrote, besides the scheme's own. A
        fallback's `written` of another kind than a string (a list, an object) names no type."""
        chosen = {o.rpartition("=")[2] for o in self.overrides}
        return chosen | {f["written"] for f in self.fallbacks or [] if isinstance(f, dict) and isinstance(f.get("written"), str)}

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

    def size(self, shard: str) -> int | None:
        """The size recorded for `shard` (older packages record none)."""
        entry = (self.shards or {}).get(shard)
        size = entry.get("size") if isinstance(entry, dict) else None
        return size if type(size) is int else None

    @property
    def files(self) -> dict[str, str] | None:
        """File name -> sha256 of the package's files other than shards and provenance, as written;
        None when not recorded (older packages) or not of that shape."""
        files = self.raw.get("files")
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return None
        return files

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
