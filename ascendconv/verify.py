"""Structural, integrity and numerical checks of an AscendV1 package (contract sections 3-5).

`verify(path, options, progress)` returns a `VerifyReport`: a list of named `Check`s (each with
every problem it found, the tensor or file it concerns, and what to do), per-tensor error figures
against the source, and the results of the MoE and NPU checks. Nothing here prints or exits; the
CLI renders the report and turns `report.ok` into the exit code.

The checks, in the order they run (names are stable: the JSON output and CI scripts use them):

- structure (always): files, config, description, headers, index, coverage, dtypes, shapes, pairs,
  alignment, packed_groups, scales, payload; `tp` with `tp > 1`;
- integrity: provenance, checksums (the BLAKE3, or for older packages sha256, of every shard against
  ascendconv_provenance.json);
- with a source: source (the package holds exactly what the source implies, copies are
  byte-identical), accuracy (per-tensor SQNR thresholds; FLOAT-resolved weights exact), exact (the
  package bytes re-derived with the numpy reference under the recorded rule), moe (the
  GroupedMatmulSituQuant chain run on sampled MoE layers with package and with source experts);
- npu: the fused op on an Ascend 950 against the CPU reference (needs no source).

Memory stays bounded: tensors are read in row chunks with positioned reads, never a whole shard;
a shard is hashed mapped (BLAKE3, every core) and its tensors are scanned only when its checksum
does not vouch for it (see `_scan`).
"""

from __future__ import annotations

import collections
import math
import os
import re
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ascendconv.errors import BadOptionError, NpuUnavailableError, clip, shown
from ascendconv.formats import elements, mx, requantize, resolve
from ascendconv.npu import reference as gmm_situ
from ascendconv.npu.reference import GmmSituInputs
from ascendconv.formats.constants import E2M1, E4M3, E8M0_NAN, FLOAT, GROUP_SIZE, SCALE_RULES, W4A8_MXFP, W8A8_MXFP8
from ascendconv.formats.metrics import ErrorAccumulator, ErrorStats
from ascendconv.io.checksum import ALGORITHMS, file_digest, recorded_checksum
from ascendconv.io.files import file_size
from ascendconv.io.package import Package
from ascendconv.io.rules import moe_coverage_problems, moe_layers
from ascendconv.io.safetensors import NUMPY_DTYPES, SafetensorsHeader, TensorEntry, TensorReader, nonfinite_count
from ascendconv.ascendv1 import (
    DESCRIPTION_NAME,
    INDEX_NAME,
    PROVENANCE_NAME,
    QUANT_TYPES,
    RANK,
    SHARD_NAME,
    SINGLE_SHARD_NAME,
    quant_type_named,
)
from ascendconv.plan import (
    RESOLVE_DTYPES,
    Deployment,
    alignment_problem,
    is_routed_expert,
    packed_group,
    rank_k,
)
from ascendconv.models import rules_for, tp_role

Notice = Callable[[str], None]  # a one-line message for the user (the kernels' first compilation)
Progress = Callable[[str, int, int], None]  # (phase, done, total); phases: scan, source, moe, npu

MX_TYPES = (W8A8_MXFP8, W4A8_MXFP)
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")
CHUNK_BYTES = 16 * 2**20  # bytes read at a time, per tensor
STATS_ELEMENTS = 2**15  # elements per weight whose error --source measures (every row: --exact-full)
SHARD_PATTERN = re.compile(r"^quant_model_weights-(\d{5})-of-(\d{5})\.safetensors$")

# Tensor parallelism: models.tp_role says how vLLM splits each linear. Row-parallel linears split K
# (the type's K rule applies to K/T, as the plan checks it); column-parallel ones split N (N/T must be
# whole). Routed experts split like a dense MLP under plain TP, and not at all with --ep.
KV_HEAD_PROJECTIONS = ("k_proj", "v_proj")  # replicated instead of split when kv heads < T

# Defaults of the numerical thresholds (see docs/verify.md for how they were chosen).
DEFAULT_MIN_SQNR_MXFP8 = 25.0  # dB; real block-FP8 weights give about 30 dB (rel. L2 0.03)
DEFAULT_MIN_SQNR_MXFP4 = 15.0  # dB; real weights give about 19 dB (rel. L2 0.115)
DEFAULT_MAX_MOE_REL_ERR = {W4A8_MXFP: 0.30, W8A8_MXFP8: 0.10, FLOAT: 0.10}
DEFAULT_NPU_TOL = 0.05
MAX_MOE_TOKENS = 8192  # activations of (tokens, hidden) floats per sampled layer stay under a GB
MOE_BATCH_BYTES = 256 * 2**20  # packed w13 bytes per reference / NPU launch
MAX_PROBLEM_CHARS = 1000
STRUCTURAL_HINT = "fix the structural problems reported by the other checks first; these tensors could not be compared"

HINTS = {
    "files": "delete stray *.safetensors files (vLLM loads every one) and restore missing shards, or convert again",
    "config": "remove quantization_config from config.json (and text_config), or convert again",
    "description": "quant_model_description.json is damaged or hand-edited; convert again",
    "headers": "the shard is truncated or corrupt; copy it again or convert again",
    "index": "the index and the shards disagree; convert again (or restore the shard the index names)",
    "coverage": "a tensor is missing or unexpected: the loader fills a missing tensor with uninitialised "
    "memory; convert again",
    "dtypes": "the loader copies by value into fixed dtypes, so a wrong dtype code silently corrupts the "
    "weights; convert again",
    "shapes": "a tensor has the wrong shape for its type; convert again",
    "pairs": "every MX weight needs its weight_scale with the same type; convert again",
    "alignment": "convert again: convert falls back (W4A8_MXFP -> W8A8_MXFP8 -> FLOAT) for layers that do "
    "not align",
    "packed_groups": "modules the runtime fuses must share one type; convert again, or use --override on "
    "the whole group",
    "scales": "scale byte 255 is E8M0 NaN and is never written; the shard is corrupt, convert again",
    "payload": "NaN or Inf in the weights; the shard is corrupt, convert again",
    "tp": "choose a --tp under which every split aligns, or convert the named layers to a type whose rule "
    "the split meets (e.g. --override 'GLOB=W8A8_MXFP8' or '=FLOAT')",
    "provenance": "ascendconv_provenance.json is damaged; convert again",
    "checksums": "a shard changed after conversion (truncated, bit-flipped or replaced): copy it again or "
    "convert again; pass --no-checksums for a package written by another tool",
    "source": "the package does not match this source: pass the checkpoint it was converted from, or "
    "convert again",
    "accuracy": "try --scale-rule mse (or rceil), or keep the worst layers in W8A8_MXFP8 / FLOAT with "
    "--override",
    "exact": "the package bytes differ from the numpy reference under the recorded rule: the kernel that "
    "wrote them is wrong (convert again with --kernel reference) or the shard was modified",
    "moe": "the MoE layer output drifts too far from the source: keep experts in W8A8_MXFP8 (--scheme "
    "w8a8-mxfp8) or try another --scale-rule",
    "npu": "",
}


@dataclass
class VerifyOptions:
    tp: int = 1
    ep: bool = False  # expert parallelism: routed experts are not split over the tp ranks
    checksums: bool = True
    source: str | os.PathLike | None = None
    min_sqnr_mxfp8: float = DEFAULT_MIN_SQNR_MXFP8
    min_sqnr_mxfp4: float = DEFAULT_MIN_SQNR_MXFP4
    exact: str = "off"  # off | sample | full
    exact_rows: int = 8  # rows per tensor when exact == "sample"
    sample: float = 1.0  # share of each weight's tile rows --source re-derives (1: every row)
    moe_check: bool = False
    moe_layers: int = 2  # 0: every MoE layer
    moe_tokens: int = 64
    beta: float = 4.0
    linear_beta: float = 25.0
    max_moe_rel_err: float | None = None  # None: DEFAULT_MAX_MOE_REL_ERR by expert type
    on_npu: bool = False
    npu_tol: float = DEFAULT_NPU_TOL
    seed: int = 0

    def validate(self) -> None:
        if self.tp < 1:
            raise BadOptionError(f"--tp {self.tp}: the tensor-parallel size must be at least 1")
        if self.exact not in ("off", "sample", "full"):
            raise BadOptionError(f"exact={self.exact!r}: choose off, sample or full")
        if self.exact_rows < 1:
            raise BadOptionError("--exact-rows must be at least 1")
        if not (isinstance(self.sample, (int, float)) and 0.0 < self.sample <= 1.0):
            raise BadOptionError(f"--sample {self.sample}: choose a fraction in (0, 1]", "1 re-derives every row")
        if self.sample < 1.0 and self.exact == "full":
            raise BadOptionError("--sample and --exact-full contradict each other", "--exact-full checks every row")
        if self.source is None and (self.exact != "off" or self.moe_check):
            flag = "--moe-check" if self.moe_check else "--exact"
            raise BadOptionError(f"{flag} needs --source SRC", "pass the block-FP8 checkpoint the package came from")
        if self.moe_layers < 0 or not 1 <= self.moe_tokens <= MAX_MOE_TOKENS:
            raise BadOptionError(f"--moe-layers must be >= 0 and --moe-tokens from 1 to {MAX_MOE_TOKENS}")
        if self.seed < 0:
            raise BadOptionError(f"--seed {self.seed}: must be 0 or more (it seeds numpy's generator)")
        for name in ("beta", "linear_beta", "npu_tol"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise BadOptionError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
        for name in ("min_sqnr_mxfp8", "min_sqnr_mxfp4"):
            if not math.isfinite(getattr(self, name)):
                raise BadOptionError(f"--{name.replace('_', '-')} must be a finite number of dB, got {getattr(self, name)}")
        if self.max_moe_rel_err is not None and not self.max_moe_rel_err > 0:
            raise BadOptionError("--max-moe-rel-err must be > 0")

    def min_sqnr(self, quant_type: str) -> float | None:
        return {W8A8_MXFP8: self.min_sqnr_mxfp8, W4A8_MXFP: self.min_sqnr_mxfp4}.get(quant_type)

    def moe_limit(self, quant_type: str) -> float:
        return self.max_moe_rel_err if self.max_moe_rel_err is not None else DEFAULT_MAX_MOE_REL_ERR[quant_type]


def _finite(x: float | None) -> float | None:
    """JSON has no inf / nan: those become null (an SQNR of null means exact)."""
    return x if x is not None and math.isfinite(x) else None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    problems: list[str] = field(default_factory=list)
    hint: str = ""
    skipped: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TensorReport:
    """One converted linear weight against the resolved source."""

    name: str
    type: str
    rel_err: float
    sqnr_db: float
    max_abs: float
    saturated: float  # share of element codes at the format's largest magnitude
    min_sqnr_db: float | None  # threshold; None for FLOAT, which must be exact
    ok: bool

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "type": self.type,
            "rel_err": _finite(self.rel_err),
            "sqnr_db": _finite(self.sqnr_db),
            "max_abs": _finite(self.max_abs),
            "saturated": self.saturated,
            "min_sqnr_db": self.min_sqnr_db,
            "ok": self.ok,
        }


@dataclass
class MoeReport:
    """One sampled MoE layer: the GroupedMatmulSituQuant chain with package vs source experts."""

    layer: str
    type: str
    path: str  # how the package side was computed
    experts: int
    experts_used: int
    tokens: int
    rel_err_situ: float  # SiTU output (before the op's MX quantization): the weights' share
    rel_err: float  # expert output after down_proj, MXFP8 SiTU output included: what the model sees
    max_rel_err: float
    ok: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rel_err_situ"], d["rel_err"] = _finite(self.rel_err_situ), _finite(self.rel_err)
        return d


@dataclass
class NpuReport:
    """The fused op on the NPU against the CPU reference, for one MoE layer."""

    layer: str
    experts_used: int
    tokens: int
    rel_err: float
    codes_equal: float  # share of output E4M3 codes equal to the reference
    scales_equal: float  # share of output E8M0 scale bytes equal to the reference
    tol: float
    ok: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rel_err"] = _finite(self.rel_err)
        return d


@dataclass
class VerifyReport:
    package: Path
    checks: list[Check]
    tensors: list[TensorReport]
    moe: list[MoeReport]
    npu: list[NpuReport]
    provenance: dict | None
    options: VerifyOptions
    seconds: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict:
        prov = self.provenance or {}
        options = asdict(self.options)
        options["source"] = None if self.options.source is None else str(self.options.source)
        return {
            "ok": self.ok,
            "package": str(self.package),
            "failed": [c.name for c in self.failed],
            "checks": [c.to_dict() for c in self.checks],
            "tensors": [t.to_dict() for t in self.tensors],
            "moe": [m.to_dict() for m in self.moe],
            "npu": [n.to_dict() for n in self.npu],
            "provenance": {k: prov.get(k) for k in ("version", "scheme", "scale_rule", "resolve_dtype", "kernel")}
            if self.provenance
            else None,
            "options": options,
            "seconds": round(self.seconds, 3),
        }


def _make_check(name: str, problems: list[str], ok_detail: str, skipped: bool = False) -> Check:
    problems = [clip(p, MAX_PROBLEM_CHARS) for p in problems]  # names and labels come from the files
    if not problems:
        return Check(name, True, clip(ok_detail, MAX_PROBLEM_CHARS), [], "", skipped)
    detail = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    return Check(name, False, detail, problems, HINTS.get(name, ""))


def _skip(name: str, why: str) -> Check:
    return Check(name, True, why, [], "", True)


# --- the package as the loader sees it -----------------------------------------------------------


@dataclass
class _Module:
    """A linear of the package: its weight, its type, and its reduction size K."""

    prefix: str
    label: str
    weight: TensorEntry | None
    scale: TensorEntry | None

    @property
    def n(self) -> int | None:
        return self.weight.shape[0] if self.weight is not None and len(self.weight.shape) == 2 else None

    @property
    def k(self) -> int | None:
        if self.weight is None or len(self.weight.shape) != 2:
            return None
        cols = self.weight.shape[1]
        return 2 * cols if self.label == W4A8_MXFP else cols


class _Layout:
    """Which shards the package is made of, and the tensors they hold (stray files excluded)."""

    def __init__(self, pkg: Package):
        self.pkg = pkg
        self.root = pkg.root
        present = sorted(p.name for p in pkg.root.glob("*.safetensors"))
        self.index = pkg.index
        if pkg.index is not None:
            self.expected = sorted(set(pkg.weight_map.values()))
        else:
            self.expected = [SINGLE_SHARD_NAME]
        self.present = present
        self.missing = [f for f in self.expected if f not in present]
        self.strays = [f for f in present if f not in self.expected]
        self.headers: dict[str, SafetensorsHeader] = {f: pkg.headers[f] for f in self.expected if f in pkg.headers}
        self.broken: dict[str, str] = {f: pkg.broken_shards[f] for f in self.expected if f in pkg.broken_shards}
        self.tensors: dict[str, TensorEntry] = {}
        self.duplicates: list[tuple[str, str, str]] = []
        for file in sorted(self.headers):
            for name, entry in self.headers[file].tensors.items():
                if name in self.tensors:
                    self.duplicates.append((name, file, self.tensors[name].path.name))
                else:
                    self.tensors[name] = entry
        self.rules = rules_for(pkg.config)  # the model family's routed-expert naming and packed groups
        self.description = {k: v for k, v in pkg.description.items()}
        self.modules: dict[str, _Module] = {}
        for name, label in self.description.items():
            if name.endswith(".weight") and isinstance(label, str):
                prefix = name[: -len(".weight")]
                self.modules[prefix] = _Module(
                    prefix, label, self.tensors.get(name), self.tensors.get(prefix + ".weight_scale")
                )

    def label(self, name: str) -> str | None:
        value = self.description.get(name)
        return value if isinstance(value, str) else None

    @property
    def complete(self) -> bool:
        """Every shard the package should have is present and readable."""
        return not self.missing and not self.broken


# --- structural checks ----------------------------------------------------------------------------


def check_files(lay: _Layout) -> Check:
    problems = []
    for stray in lay.strays:
        if lay.index is None and SHARD_PATTERN.match(stray):
            problems.append(f"{stray} is a numbered shard but {INDEX_NAME} is missing")
            continue
        if SHARD_PATTERN.match(stray) or stray == SINGLE_SHARD_NAME:
            why = "is not named by the index" if lay.index is not None else "is not the package's weight file"
        else:
            why = "is not part of the package"
        problems.append(f"stray file {stray}: {why}, and vLLM loads every *.safetensors in the directory")
    for missing in lay.missing:
        if lay.index is not None:
            users = sorted(t for t, f in lay.pkg.weight_map.items() if f == missing)
            problems.append(f"shard {missing} is named by {INDEX_NAME} for {len(users)} tensor(s) but is missing")
        elif not any(SHARD_PATTERN.match(f) for f in lay.present):
            problems.append(f"no {INDEX_NAME} and no {SINGLE_SHARD_NAME}: the package has no weights")
    if lay.index is not None:
        numbers = []
        for file in lay.expected:
            match = SHARD_PATTERN.match(file)
            if not match:
                problems.append(f"{INDEX_NAME} names shard {shown(file)}, which does not follow {shown(SHARD_NAME.format(1, 1))}")
            else:
                numbers.append((int(match[1]), int(match[2])))
        totals = {total for _, total in numbers}
        if numbers and len(totals) == 1:
            total = totals.pop()
            have = {number for number, _ in numbers}
            holes = [SHARD_NAME.format(i, total) for i in range(1, total + 1) if i not in have]
            for hole in holes:
                if hole not in lay.present:
                    problems.append(f"shard numbering has a hole: {hole} is neither indexed nor present")
        elif len(totals) > 1:
            problems.append(f"shards disagree on their count: {', '.join(lay.expected)}")
    if not (lay.root / "config.json").is_file():
        problems.append("config.json is missing: vLLM cannot build the model")
    return _make_check("files", problems, f"{len(lay.expected)} shard(s), no stray *.safetensors")


def check_config(lay: _Layout) -> Check:
    config = lay.pkg.config
    if config is None:
        return _skip("config", "no config.json (reported by files)")
    problems = []
    if "quantization_config" in config:
        problems.append(
            "config.json keeps quantization_config: vLLM would take the FP8 path or refuse the model"
        )
    text = config.get("text_config")
    if isinstance(text, dict) and "quantization_config" in text:
        problems.append("config.json keeps text_config.quantization_config: vLLM would take the FP8 path")
    return _make_check("config", problems, "config.json has no quantization_config")


def check_description(lay: _Layout) -> Check:
    fields = lay.pkg.fields
    problems = []
    if fields.get("version") != "1.0.0":
        problems.append(f"{DESCRIPTION_NAME}: version is {shown(fields.get('version'))}, expected '1.0.0'")
    group_size = fields.get("group_size")
    if isinstance(group_size, bool) or group_size != GROUP_SIZE:
        problems.append(f"{DESCRIPTION_NAME}: group_size is {shown(group_size)}, expected {GROUP_SIZE} (0 breaks the loader)")
    for key in ("metadata", "optional"):
        if not isinstance(fields.get(key, {}), dict):
            problems.append(f"{DESCRIPTION_NAME}: {key} is {shown(fields[key])}, expected an object")
    labels = []
    for name, label in sorted(lay.description.items()):
        if quant_type_named(label) is None:
            problems.append(f"{shown(name)} has type {shown(label)}; known types: {', '.join(QUANT_TYPES)}")
            continue
        labels.append(label)
        if label in MX_TYPES and not (name.endswith(".weight") or name.endswith(".weight_scale")):
            problems.append(f"{shown(name)} is labelled {label}, but only P.weight and P.weight_scale carry MX types")
    expected = max(labels, key=RANK.__getitem__) if labels else FLOAT
    found = fields.get("model_quant_type")
    if found != expected:
        problems.append(
            f"{DESCRIPTION_NAME}: model_quant_type is {shown(found)} but the highest type present is {shown(expected)}"
        )
    return _make_check("description", problems, f"{len(lay.description)} entries, model_quant_type {found}")


def check_headers(lay: _Layout) -> Check:
    problems = [why if file in why else f"{file}: {why}" for file, why in sorted(lay.broken.items())]
    problems += [f"tensor {shown(n)} is in both {a} and {b}" for n, a, b in lay.duplicates]
    return _make_check("headers", problems, f"{len(lay.headers)} shard header(s) valid, offsets in bounds")


def check_index(lay: _Layout) -> Check:
    if lay.index is None:
        return _skip("index", f"single file {SINGLE_SHARD_NAME}, no index")
    problems = []
    weight_map = lay.pkg.weight_map
    metadata = lay.index.get("metadata") if isinstance(lay.index.get("metadata"), dict) else {}
    for name, file in sorted(weight_map.items()):
        entry = lay.tensors.get(name)
        if entry is None:
            if file not in lay.broken and file not in lay.missing:
                problems.append(f"{INDEX_NAME} maps {shown(name)} to {file} but no shard holds it")
        elif entry.path.name != file:
            problems.append(f"{INDEX_NAME} maps {shown(name)} to {file} but it is in {entry.path.name}")
    for name in sorted(set(lay.tensors) - set(weight_map)):
        problems.append(f"{shown(name)} is in {lay.tensors[name].path.name} but not in {INDEX_NAME}")
    total = metadata.get("total_size")
    actual = sum(e.nbytes for e in lay.tensors.values())
    if lay.complete and total != actual:
        problems.append(f"{INDEX_NAME}: metadata.total_size is {shown(total)} but the shards hold {actual} bytes of tensor data")
    return _make_check("index", problems, f"{len(weight_map)} entries, total_size {total}")


def check_coverage(lay: _Layout) -> Check:
    problems = []
    described, stored = set(lay.description), set(lay.tensors)
    if lay.complete:
        for name in sorted(described - stored):
            problems.append(f"{shown(name)} is described ({lay.description[name]}) but in no shard")
    for name in sorted(stored - described):
        problems.append(f"{shown(name)} is in {lay.tensors[name].path.name} but not described in {DESCRIPTION_NAME}")
    for name in sorted(n for n in stored if n.endswith(".weight_scale_inv")):
        problems.append(f"{shown(name)} ({lay.tensors[name].path.name}) is a block-FP8 scale; an AscendV1 package has none")
    # whole MoE layers: the rule convert applies to its source (io.rules)
    problems += moe_coverage_problems(lay.description, lay.pkg.config, DESCRIPTION_NAME)
    return _make_check("coverage", problems, f"{len(stored)} tensors, each described and stored once")


def check_dtypes(lay: _Layout) -> Check:
    problems = []
    for name, entry in sorted(lay.tensors.items()):
        label = lay.label(name)
        where = f"{shown(name)} ({entry.path.name})"
        if label is None:
            continue
        if label in MX_TYPES and name.endswith(".weight"):
            want = "F8_E4M3" if label == W8A8_MXFP8 else "U8"
            if entry.dtype != want:
                problems.append(f"{where} is {entry.dtype}; a {label} weight must be {want}")
        elif label in MX_TYPES and name.endswith(".weight_scale"):
            if entry.dtype != "U8":
                problems.append(f"{where} is {entry.dtype}; a {label} scale must be U8 (E8M0 bytes)")
        elif label == FLOAT:
            if entry.dtype in FP8_DTYPES:
                problems.append(f"{where} is {entry.dtype} but labelled FLOAT: the loader reads it as float by value")
            prefix = name[: -len(".bias")] if name.endswith(".bias") else None
            module = lay.modules.get(prefix) if prefix else None
            if module is not None and module.label in MX_TYPES and entry.dtype != "F32":
                problems.append(f"{where} is {entry.dtype}; the bias of a {module.label} layer must be F32")
    for name, label in sorted(lay.description.items()):
        if name.endswith(".bias") and label in MX_TYPES:
            problems.append(f"{shown(name)} is labelled {label}; the bias of an MX layer is labelled FLOAT")
    return _make_check("dtypes", problems, "every tensor has its type's dtype")


def check_shapes(lay: _Layout) -> Check:
    problems = []
    for prefix, module in sorted(lay.modules.items()):
        w = module.weight
        if module.label not in MX_TYPES or w is None:
            continue
        if len(w.shape) != 2:
            problems.append(f"{shown(w.name)} ({w.path.name}) has shape {list(w.shape)}; a {module.label} weight is 2-D")
            continue
        s = module.scale
        if s is None:
            continue  # reported by pairs
        n, k = module.n, module.k
        want = (n, math.ceil(k / GROUP_SIZE)) if module.label == W8A8_MXFP8 else (n, k // GROUP_SIZE)
        if s.shape != want:
            problems.append(
                f"{shown(s.name)} ({s.path.name}) has shape {list(s.shape)}; {module.label} weight {shown(w.name)} "
                f"{list(w.shape)} (N={n}, K={k}) needs {list(want)}"
            )
    return _make_check("shapes", problems, "every MX weight and scale has the shape its type implies")


def check_pairs(lay: _Layout) -> Check:
    problems = []
    for prefix, module in sorted(lay.modules.items()):
        scale_name = prefix + ".weight_scale"
        scale_label = lay.label(scale_name)
        if module.label in MX_TYPES:
            if scale_label is None:
                problems.append(f"{module.label} weight {shown(prefix + '.weight')} has no {shown(scale_name)}")
            elif scale_label != module.label:
                problems.append(f"{shown(prefix + '.weight')} is {module.label} but {shown(scale_name)} is {scale_label}")
        elif scale_label is not None:
            problems.append(f"{shown(scale_name)} is {scale_label} but its weight is {module.label}")
    for name in sorted(lay.description):
        if name.endswith(".weight_scale") and name[: -len("_scale")] not in lay.description:
            problems.append(f"scale {shown(name)} has no weight {shown(name[: -len('_scale')])}")
    return _make_check("pairs", problems, "every MX weight has its scale, of the same type")


def check_alignment(lay: _Layout) -> Check:
    problems = []
    for prefix, module in sorted(lay.modules.items()):
        if module.label not in MX_TYPES or module.k is None:
            continue
        problem = alignment_problem(module.label, module.k, is_routed_expert(prefix, lay.rules))
        if problem:
            problems.append(f"{prefix} ({module.label}): {problem}")
    return _make_check("alignment", problems, "K of every MX layer meets its type's rule")


def check_packed_groups(lay: _Layout) -> Check:
    groups: dict[str, dict[str, list[str]]] = {}
    for prefix, module in lay.modules.items():
        group = packed_group(prefix, lay.rules)
        if group == prefix:
            continue
        groups.setdefault(group, {}).setdefault(module.label, []).append(prefix)
    problems = []
    for group, by_type in sorted(groups.items()):
        if len(by_type) < 2:
            continue
        parts = []
        for label, members in sorted(by_type.items(), key=lambda kv: RANK.get(kv[0], -1)):
            names = sorted(m[len(group.rsplit(".", 1)[0]) + 1 :] for m in members)
            shown = ", ".join(names[:3]) + (f", ... ({len(names)} modules)" if len(names) > 3 else "")
            parts.append(f"{label}: {shown}")
        kind = "MoE layer" if group.endswith(".experts") else "packed module"
        problems.append(f"{kind} {group} mixes types ({'; '.join(parts)}); the loader refuses the model")
    return _make_check("packed_groups", problems, f"{len(groups)} packed group(s) and MoE layer(s), each of one type")


def check_tp(lay: _Layout, tp: int, ep: bool = False) -> Check:
    config = lay.pkg.config or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    kv_heads = config.get("num_key_value_heads", text.get("num_key_value_heads"))
    problems = []
    checked = 0
    for prefix, module in sorted(lay.modules.items()):
        role = tp_role(prefix)
        n, k = module.n, module.k
        if role in (None, "replicated") or n is None:
            continue
        checked += 1
        where = f"{prefix} ({module.label}, {role}-parallel)"
        if role == "row":
            routed = is_routed_expert(prefix, lay.rules)
            rank_k_value, k_label = rank_k(prefix, k, routed, Deployment(tp, ep))
            problem = k_label if rank_k_value is None else alignment_problem(module.label, rank_k_value, routed, k_label)
            if problem:
                problems.append(f"{where}: {problem}")
        else:
            last = prefix.rsplit(".", 1)[-1]
            if last in KV_HEAD_PROJECTIONS and isinstance(kv_heads, int) and 0 < kv_heads < tp:
                if tp % kv_heads:
                    problems.append(f"{where}: {kv_heads} KV heads cannot be replicated evenly over {tp} ranks")
                continue
            if n % tp:
                problems.append(f"{where}: N={n} does not split over {tp} ranks (N/T = {n / tp:g})")
    return _make_check("tp", problems, f"{checked} split linears align under --tp {tp}")


# --- the data scan: scales, payload, checksums in one pass per shard -----------------------------


def _row_chunks(entry: TensorEntry, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, int, int, int]]:
    """(row_start, row_stop, byte_start, byte_count) covering the tensor, whole rows per chunk."""
    rows = entry.shape[0] if entry.shape else 1
    if entry.nbytes == 0 or rows == 0:
        return
    row_bytes = entry.nbytes // rows
    step = max(1, chunk_bytes // max(row_bytes, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        yield r0, r1, r0 * row_bytes, (r1 - r0) * row_bytes


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
            f"{what} ({len(self.vouched)} shard(s) not scanned: their checksums match, so they hold the bytes "
            "convert wrote and checked)"
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
    findings.carried = recorded_nonfinite(lay.pkg.provenance)
    files = [f for f in lay.expected if f in lay.present]
    total = sum(file_size(lay.root / f) for f in files)
    done = 0
    with TensorReader() as reader:
        for file in files:
            path = lay.root / file
            recorded = recorded_checksum(lay.pkg.provenance or {}, file) if options.checksums else None
            header = lay.headers.get(file)
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
            except Exception as exc:  # TruncatedFileError from a file that shrank while being read
                findings.unreadable[file] = f"{file}: {getattr(exc, 'message', exc)}"
            done += file_size(path)
            if progress:
                progress("scan", done, total)
    return findings


def _scan_chunk(lay: _Layout, entry: TensorEntry, data: bytearray, row_start: int, findings: _ScanFindings) -> None:
    name = entry.name
    if name.endswith(".weight_scale") and NUMPY_DTYPES[entry.dtype].itemsize == 1:
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


def recorded_nonfinite(provenance: dict | None) -> dict[str, int]:
    """FLOAT tensor -> NaN / Inf values convert carried from the source (provenance 'source_nonfinite')."""
    recorded = (provenance or {}).get("source_nonfinite")
    if not isinstance(recorded, dict):
        return {}
    return {k: v for k, v in recorded.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


def check_payload(findings: _ScanFindings) -> Check:
    problems = list(findings.payload)
    for name, want in sorted(findings.carried.items()):
        got = findings.nonfinite.get(name)
        if got is not None and got != want:
            problems.append(
                f"{shown(name)} holds {got} NaN/Inf value(s); the source held {want} (recorded at conversion)"
            )
    detail = "no NaN codes in FP8 payloads, no NaN/Inf in floats"
    # scanned counts, or the recorded ones where a matching checksum vouched for the shard
    counts = {name: findings.nonfinite.get(name, want) for name, want in findings.carried.items()}
    carried = sum(counts.values())
    if carried and not problems:
        detail += (
            f" but the {carried} NaN/Inf value(s) in {len(counts)} FLOAT tensor(s) the source held "
            "(recorded at conversion)"
        )
    return _make_check("payload", problems, findings.detail(detail))


def check_provenance(lay: _Layout) -> Check:
    prov = lay.pkg.provenance
    if prov is None:
        return _skip("provenance", f"no {PROVENANCE_NAME} (not written by ascendconv convert)")
    problems = []
    if prov.get("tool") != "ascendconv":
        problems.append(f"{PROVENANCE_NAME}: tool is {shown(prov.get('tool'))}, expected 'ascendconv'")
    if prov.get("scale_rule") not in SCALE_RULES:
        problems.append(f"{PROVENANCE_NAME}: scale_rule is {shown(prov.get('scale_rule'))}")
    if prov.get("resolve_dtype") not in RESOLVE_DTYPES:
        problems.append(f"{PROVENANCE_NAME}: resolve_dtype is {shown(prov.get('resolve_dtype'))}")
    for key in ("version", "scheme", "kernel"):
        if not isinstance(prov.get(key), str):
            problems.append(f"{PROVENANCE_NAME}: {key} is missing")
    shards = prov.get("shards")
    algorithm = prov.get("checksum", "sha256")  # packages written before the field: sha256
    if algorithm not in ALGORITHMS:
        problems.append(f"{PROVENANCE_NAME}: checksum is {algorithm!r}, expected one of {', '.join(ALGORITHMS)}")
    elif not isinstance(shards, dict):
        problems.append(f"{PROVENANCE_NAME}: no shards with checksums")
    else:
        for file in sorted(set(lay.expected) - set(shards)):
            problems.append(f"{PROVENANCE_NAME} records no checksum for {file}")
        for file in sorted(f for f in set(lay.expected) & set(shards) if recorded_checksum(prov, f) is None):
            problems.append(f"{PROVENANCE_NAME} records no {algorithm} digest for {file}")
        for file in sorted(set(shards) - set(lay.expected)):
            problems.append(f"{PROVENANCE_NAME} records {file}, which is not a shard of the package")
    carried = prov.get("source_nonfinite", {})
    if not isinstance(carried, dict) or len(recorded_nonfinite(prov)) != len(carried):
        problems.append(f"{PROVENANCE_NAME}: source_nonfinite is {shown(carried)}, expected tensor names -> counts")
    if not isinstance(prov.get("fallbacks", []), list):
        problems.append(f"{PROVENANCE_NAME}: fallbacks is {shown(prov['fallbacks'])}, expected a list")
    source = prov.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("files"), list):
        problems.append(f"{PROVENANCE_NAME}: the source files are not recorded")
    elif not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in source["files"]):
        problems.append(f"{PROVENANCE_NAME}: a source file is recorded without its name")
    detail = f"ascendconv {prov.get('version')}, {prov.get('scheme')}, rule {prov.get('scale_rule')}, kernel {prov.get('kernel')}"
    return _make_check("provenance", problems, detail)


def check_checksums(lay: _Layout, findings: _ScanFindings) -> Check:
    prov = lay.pkg.provenance
    if prov is None:
        return _make_check(
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
    return _make_check(
        "checksums",
        problems,
        f"{checked} shard(s) match the {named} recorded at conversion: they hold the bytes written then, unless "
        "shard and provenance were both rewritten (only --source can tell)",
    )


# --- numerical checks against the source ----------------------------------------------------------


def _sample_rows(n: int, count: int, seed: int, name: str) -> np.ndarray:
    """Deterministic rows of a tensor: the first, the last, and random ones (all when few)."""
    if count >= n:
        return np.arange(n)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    middle = rng.choice(np.arange(1, n - 1), size=max(0, count - 2), replace=False) if n > 2 else []
    return np.unique(np.concatenate([[0, n - 1], middle]).astype(np.int64))


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """a == b everywhere, compared 8 bytes at a time where the layout allows (8x fewer elements)."""
    if a.shape != b.shape:
        return False
    if a.nbytes % 8 == 0 and a.flags.c_contiguous and b.flags.c_contiguous:
        a, b = a.reshape(-1).view(np.uint64), b.reshape(-1).view(np.uint64)
    return bool(np.array_equal(a, b))


class _Differences:
    """Bytes of one tensor that differ from the reference, counted over chunks; the first kept."""

    def __init__(self, name: str, what: str):
        self.name, self.what = name, what
        self.count = 0
        self.rows: set[int] = set()
        self.first: tuple[int, int, int, int] | None = None  # row, byte, package, reference

    def update(self, got: np.ndarray, want: np.ndarray, rows: np.ndarray) -> None:
        """`got` and `want`: uint8 arrays with one row per entry of `rows`."""
        if _same_bytes(got, want):
            return
        diff = got != want
        where = np.argwhere(diff)
        self.count += len(where)
        self.rows.update(int(rows[r]) for r in np.unique(where[:, 0]))
        if self.first is None:
            at = tuple(where[0])
            self.first = (int(rows[at[0]]), int(at[1]), int(got[at]), int(want[at]))

    def message(self) -> str | None:
        if self.first is None:
            return None
        row, byte, got, want = self.first
        return (
            f"{self.name!r} {self.what}: {self.count} byte(s) in {len(self.rows)} row(s) differ from the reference; "
            f"first at row {row}, byte {byte}: package 0x{got:02X}, reference 0x{want:02X}"
        )


@dataclass
class _SourceFindings:
    source: list[str] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)
    exact_rows: int = 0  # rows re-derived with the numpy reference (--exact)
    rows: int = 0  # rows re-derived with the compiled kernels
    rows_of: int = 0  # rows of the weights compared
    tensors: list[TensorReport] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def add(self, compared: "_Compared") -> None:
        self.source += compared.source
        self.exact += compared.exact
        self.exact_rows += compared.reference_rows
        self.skipped += compared.skipped
        if compared.report is not None:
            self.tensors.append(compared.report)


def _mapped_rows(reader: TensorReader, entry: TensorEntry, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of a 2-D tensor, read-only and mapped from the page cache (no copy)."""
    row_bytes = entry.nbytes // entry.shape[0]
    data = reader.map_range(entry, r0 * row_bytes, (r1 - r0) * row_bytes)
    return data.view(NUMPY_DTYPES[entry.dtype]).reshape(r1 - r0, *entry.shape[1:])


def _read_package_rows(
    reader: TensorReader, module: _Module, r0: int, r1: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(stored payload, element codes unpacked [R, K] or float32 values, scale bytes or None)."""
    payload = _mapped_rows(reader, module.weight, r0, r1)
    if module.label == FLOAT:
        return payload, payload.astype(np.float32), None
    scales = _mapped_rows(reader, module.scale, r0, r1)
    codes = elements.unpack_fp4(payload) if module.label == W4A8_MXFP else payload
    return payload, codes, scales


def _dequantize(module: _Module, codes: np.ndarray, scales: np.ndarray | None) -> np.ndarray:
    if module.label == FLOAT:
        return codes
    fmt = E2M1 if module.label == W4A8_MXFP else E4M3
    k = module.k
    groups = scales.shape[1] * GROUP_SIZE
    if groups != k:  # W8A8 with K % 32 (not reached: alignment fails first), pad to whole groups
        codes = np.pad(codes, ((0, 0), (0, groups - k)))
    return mx.dequantize_mx(codes, scales, fmt)[:, :k]


def _module_measurable(lay: _Layout, module: _Module, linear) -> str | None:
    """Why a module cannot be compared with its source linear, or None."""
    w = module.weight
    if w is None:
        return "not stored"
    n, k = linear.shape
    if module.label == FLOAT:
        if w.dtype != "BF16" or w.shape != (n, k):
            return f"FLOAT weight is {w.dtype} {list(w.shape)}, expected BF16 {[n, k]}"
        return None
    if module.label not in MX_TYPES:
        return f"unknown type {module.label!r}"
    want_dtype = "F8_E4M3" if module.label == W8A8_MXFP8 else "U8"
    want_shape = (n, k) if module.label == W8A8_MXFP8 else (n, k // 2)
    if w.dtype != want_dtype or w.shape != want_shape or (module.label == W4A8_MXFP and k % 2):
        return f"{module.label} weight is {w.dtype} {list(w.shape)}, expected {want_dtype} {list(want_shape)}"
    s = module.scale
    if s is None or s.dtype != "U8" or s.shape != (n, math.ceil(k / GROUP_SIZE)) or k % GROUP_SIZE:
        return "scale missing or misshapen"
    return None


def _compare_source(
    lay: _Layout, source, options: VerifyOptions, progress: Progress | None, notice: Notice | None = None
) -> _SourceFindings:
    from ascendconv.convert import source_fingerprint

    found = _SourceFindings()
    prov = lay.pkg.provenance or {}
    rule = prov.get("scale_rule") if prov.get("scale_rule") in SCALE_RULES else None
    resolve_dtype = prov.get("resolve_dtype") if prov.get("resolve_dtype") in RESOLVE_DTYPES else "bf16"

    # 1. is this the source the package was made from?
    recorded = (prov.get("source") or {}).get("files") if isinstance(prov.get("source"), dict) else None
    if isinstance(recorded, list):
        have = {h.path.name: (h.file_size, source_fingerprint(h.header_bytes, h.file_size)) for h in source.headers}
        want = {f.get("name"): (f.get("size"), f.get("fingerprint")) for f in recorded if isinstance(f, dict)}
        if set(have) != set(want):
            found.source.append(
                f"the package was converted from shards {sorted(want)}, the source given has {sorted(have)}"
            )
        else:
            for name in sorted(have):
                if have[name] != want[name]:
                    found.source.append(
                        f"source shard {name} differs from the one converted (size {have[name][0]} vs recorded "
                        f"{want[name][0]}, or another header)"
                    )

    # 2. the tensor set the source implies
    by_weight = {linear.weight.name: linear for linear in source.linears.values()}
    scale_names = source.scale_names
    implied: set[str] = set()
    for name in source.tensors:
        if name in scale_names:
            continue
        implied.add(name)
        linear = by_weight.get(name)
        if linear is not None and lay.label(name) in MX_TYPES:
            implied.add(linear.prefix + ".weight_scale")
    for name in sorted(implied - set(lay.tensors)):
        if lay.complete:
            found.source.append(f"{name!r} comes from the source but is not in the package")
    for name in sorted(set(lay.tensors) - implied):
        found.source.append(f"package tensor {name!r} does not come from the source")

    work = [e for n, e in source.tensors.items() if n not in scale_names and n in lay.tensors]
    total = sum(e.nbytes for e in work)
    derive = _Rederive(lay, source, options, rule, resolve_dtype, notice)

    def compare(entry: TensorEntry) -> _Compared:
        linear = by_weight.get(entry.name)
        if linear is None:
            return _Compared(source=[p for p in [_compare_plain(lay, reader, source, entry)] if p])
        module = lay.modules.get(linear.prefix)
        why = "not described" if module is None else _module_measurable(lay, module, linear)
        if why is not None:
            return _Compared(skipped=[f"{entry.name}: {why}"])
        return derive.linear(reader, linear, module)

    done = 0
    with TensorReader() as reader:
        # tensors in parallel (kernels, numpy and reads release the GIL), results taken in order
        for entry, compared in _ordered_map(compare, work, os.cpu_count() or 1):
            found.add(compared)
            done += entry.nbytes
            if progress:
                progress("source", done, total)
    found.rows, found.rows_of = derive.rows, derive.rows_of
    return found


def _ordered_map(function, items: list, workers: int) -> Iterator[tuple]:
    """(item, function(item)) in the order of `items`, computed by `workers` threads with at most
    2 x workers results in flight (memory stays bounded)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append((item, pool.submit(function, item)))
            while len(pending) >= 2 * workers:
                item_done, future = pending.popleft()
                yield item_done, future.result()
        while pending:
            item_done, future = pending.popleft()
            yield item_done, future.result()


def _compare_plain(lay: _Layout, reader: TensorReader, source, entry: TensorEntry) -> str | None:
    """A tensor convert copies (bytes as they are) or casts (an MX layer's bias to F32)."""
    pkg = lay.tensors[entry.name]
    if pkg.shape != entry.shape:
        return f"{entry.name!r} has shape {list(pkg.shape)} in the package, {list(entry.shape)} in the source"
    if pkg.dtype == entry.dtype:
        for _, _, start, count in _row_chunks(entry):
            a = source.reader.read_bytes(entry, start, count)
            b = reader.read_bytes(pkg, start, count)
            if a != b:
                offset = next(i for i in range(count) if a[i] != b[i])
                return f"{entry.name!r} ({pkg.path.name}) differs from the source copy at byte {start + offset}"
        return None
    if pkg.dtype == "F32" and entry.dtype in FLOAT_DTYPES:
        want = source.reader.read(entry).astype(np.float32)
        got = reader.read(pkg)
        if not np.array_equal(want, got, equal_nan=True):
            return f"{entry.name!r} ({pkg.path.name}) is not the source {entry.dtype} values cast to F32"
        return None
    return f"{entry.name!r} is {pkg.dtype} in the package but {entry.dtype} in the source"


@dataclass
class _Compared:
    """What comparing one source tensor with the package found."""

    source: list[str] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)
    reference_rows: int = 0  # rows the numpy reference re-derived (--exact)
    report: TensorReport | None = None
    skipped: list[str] = field(default_factory=list)


def _sample_bands(n: int, bn: int, fraction: float, seed: int, name: str) -> list[tuple[int, int]]:
    """Row ranges [r0, r1) to re-derive: every band of `bn` rows (a source tile row), or a seeded
    `fraction` of them, at least one, in every weight (so every layer and every module kind)."""
    bands = [(r0, min(n, r0 + bn)) for r0 in range(0, n, bn)]
    if fraction >= 1.0 or not bands:
        return bands
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    count = max(1, round(fraction * len(bands)))
    return [bands[i] for i in sorted(rng.choice(len(bands), size=count, replace=False))]


def _chunks(bands: list[tuple[int, int]], max_rows: int) -> Iterator[tuple[int, int]]:
    """Consecutive bands merged into row ranges of at most max_rows rows (at least one band)."""
    start = stop = None
    for r0, r1 in bands:
        if start is not None and r0 == stop and r1 - start <= max_rows:
            stop = r1
            continue
        if start is not None:
            yield start, stop
        start, stop = r0, r1
    if start is not None:
        yield start, stop


class _Rederive:
    """Re-derive a package weight from its source with the compiled kernels convert uses (bit-
    identical to the numpy reference) and compare bytes: every row, or `--sample` of the bands.
    The error against the resolved source is measured on STATS_ELEMENTS sampled elements per
    weight, among the rows re-derived (every row with --exact-full); --exact also re-derives
    sampled rows with the reference.
    """

    def __init__(self, lay: _Layout, source, options: VerifyOptions, rule: str | None, resolve_dtype: str, notice):
        self.lay, self.source, self.options = lay, source, options
        self.rule, self.resolve_dtype = rule, resolve_dtype
        self.fraction = 1.0 if options.exact == "full" else options.sample
        self.rows = 0  # rows re-derived with the kernels
        self.rows_of = 0  # rows of the weights compared
        self._lock = threading.Lock()
        self._local = threading.local()
        from ascendconv import kernels

        self.kernels = kernels
        kinds = {m.label for m in lay.modules.values()}
        needed = kernels.entry_points_for(bool(kinds & set(MX_TYPES)) and rule is not None, FLOAT in kinds, source.quant.block)
        if kinds & set(MX_TYPES) and (options.exact == "full" or rule is None):
            needed.append("error")  # the error of every row
        kernels.compile_entry_points(needed, notice)

    def linear(self, reader: TensorReader, linear, module: _Module) -> _Compared:
        out = _Compared()
        n, k = linear.shape
        name = linear.weight.name
        try:
            scale = self.source.read_scale(linear)
        except Exception as exc:  # NonFiniteScaleError
            out.source.append(getattr(exc, "message", str(exc)))
            return out
        block = self.source.quant.block
        w = _Weight(name, module, scale, block, E2M1 if module.label == W4A8_MXFP else None if module.label == FLOAT else E4M3)
        derivable = module.label == FLOAT or self.rule is not None
        bands = _sample_bands(n, block[0], self.fraction, self.options.seed, name) if derivable else []
        full_stats = self.options.exact == "full" or not derivable  # nothing re-derived: measure every row
        reference_rows = (
            set(_sample_rows(n, self.options.exact_rows, self.options.seed, name).tolist())
            if self.options.exact == "sample" and derivable else set()
        )
        rows_per_chunk = max(block[0], (CHUNK_BYTES // 4) // max(k, 1) // block[0] * block[0])
        read = bands if derivable else _sample_bands(n, block[0], 1.0, 0, name)
        # the error is measured on sampled rows of those read (the first, the last, random ones)
        candidates = np.concatenate([np.arange(a, b) for a, b in read])
        picks = _sample_rows(len(candidates), max(2, STATS_ELEMENTS // max(k, 1)), self.options.seed, name)
        stats_set = set(candidates[picks].tolist())
        acc = ErrorAccumulator()
        for r0, r1 in _chunks(read, rows_per_chunk):
            src_codes = _mapped_rows(self.source.reader, linear.weight, r0, r1)
            stored, codes, scales = _read_package_rows(reader, module, r0, r1)
            if derivable and any(a <= r0 < b for a, b in bands):
                problem = self._rederive(w, r0, src_codes, stored, scales)
                if problem:
                    out.source.append(problem)
                    return out
            if full_stats and w.fmt is not None:  # every row: summed by a kernel
                ref_sq, err_sq, max_abs, saturated = self.kernels.error_sums(
                    src_codes, scale, block, r0, self.resolve_dtype, w.fmt, stored, scales
                )
                acc.add_sums(ref_sq, err_sq, max_abs, (r1 - r0) * k, saturated)
            else:
                picked = [r - r0 for r in range(r0, r1) if full_stats or r in stats_set]
                self._measure(w, acc, np.array(picked, np.int64), r0, src_codes, codes, scales)
            for r in sorted(r for r in reference_rows if r0 <= r < r1):
                out.reference_rows += 1
                self._reference_row(w, r, src_codes[r - r0 : r - r0 + 1], stored, scales, r0)
        with self._lock:
            self.rows_of += n
        out.exact += [m for m in (w.payload_diff.message(), w.scale_diff.message()) if m]
        if not out.exact and w.reference_diff.message():  # the kernels agree with the package, not the reference
            out.exact.append(w.reference_diff.message())
        stats: ErrorStats = acc.result()
        threshold = self.options.min_sqnr(module.label)
        ok = stats.rel_l2 == 0.0 if module.label == FLOAT else stats.sqnr_db >= threshold  # False for NaN
        out.report = TensorReport(
            name, module.label, stats.rel_l2, stats.sqnr_db, stats.max_abs, stats.saturated_fraction, threshold, ok
        )
        return out

    def _rederive(self, w: "_Weight", r0: int, src_codes, stored, scales) -> str | None:
        """Compare rows [r0, r0 + len) of the package with the kernels' output; a broken source
        (NaN codes, values that overflow) is returned as a problem."""
        rows = np.arange(r0, r0 + len(src_codes))
        out = self._buffer(stored.nbytes).view(stored.dtype).reshape(stored.shape)
        try:
            if w.fmt is None:
                want = self.kernels.resolve_rows_bf16(src_codes, w.scale, w.block, r0, out=out).view(np.uint8)
                w.payload_diff.update(stored.view(np.uint8), want, rows)
            else:
                payload, scale_bytes = self.kernels.requantize_rows(
                    src_codes, w.scale, w.block, r0, self.resolve_dtype, w.fmt, self.rule, out=out
                )
                w.payload_diff.update(stored, payload, rows)
                w.scale_diff.update(scales, scale_bytes, rows)
        except ValueError:
            nan_at = self.kernels.first_nan_code(src_codes)
            if nan_at:
                return f"source {w.name!r} holds a NaN code at row {r0 + nan_at[0]}, column {nan_at[1]}"
            return f"source {w.name!r} holds values that overflow in rows {r0}..{rows[-1]}"
        with self._lock:
            self.rows += len(rows)
        return None

    def _buffer(self, nbytes: int) -> np.ndarray:
        """This thread's output buffer for the kernels, kept across chunks: re-deriving into fresh
        memory would fault in as many new pages as the package is large."""
        held = getattr(self._local, "buffer", None)
        if held is None or held.nbytes < nbytes:
            held = self._local.buffer = np.empty(max(nbytes, CHUNK_BYTES), dtype=np.uint8)
        return held[:nbytes]

    def _measure(self, w: "_Weight", acc: ErrorAccumulator, picked: np.ndarray, r0: int, src_codes, codes, scales) -> None:
        """The error of the picked rows (indices into the block starting at r0), with numpy."""
        if not picked.size:
            return
        # one "tile row" per picked row: (1, bk) tiles carrying each row's own tile scales
        reference = resolve.resolve_tiles(
            src_codes[picked], w.scale[(r0 + picked) // w.block[0]], (1, w.block[1]),
            "bf16" if w.fmt is None else self.resolve_dtype,
        )
        approx = _dequantize(w.module, codes[picked], None if scales is None else scales[picked])
        acc.update(reference, approx, codes[picked] if w.fmt is not None else None, w.fmt)

    def _reference_row(self, w: "_Weight", r: int, src_row, stored, scales, r0: int) -> None:
        """Row r re-derived with the numpy reference (--exact), compared with the package."""
        i = r - r0
        if w.fmt is None:
            want = requantize.resolve_rows_bf16(src_row, w.scale, w.block, r).view(np.uint8)
            w.reference_diff.update(stored[i : i + 1].view(np.uint8), want, np.array([r]))
            return
        payload, scale_bytes = requantize.requantize_rows(src_row, w.scale, w.block, r, self.resolve_dtype, w.fmt, self.rule)
        got = np.concatenate([stored[i : i + 1], scales[i : i + 1]], axis=1)
        w.reference_diff.update(got, np.concatenate([payload, scale_bytes], axis=1), np.array([r]))


class _Weight:
    """One weight being compared: what re-deriving it needs, and the differences found."""

    def __init__(self, name: str, module: _Module, scale: np.ndarray, block: tuple[int, int], fmt):
        self.name, self.module, self.scale, self.block, self.fmt = name, module, scale, block, fmt
        self.payload_diff = _Differences(name, "BF16 bytes" if fmt is None else "payload")
        self.scale_diff = _Differences(module.prefix + ".weight_scale", "scale")
        self.reference_diff = _Differences(name, "bytes (numpy reference)")


def check_source(found: _SourceFindings) -> Check:
    return _make_check("source", found.source, "the package holds what the source implies; copies byte-identical")


def check_accuracy(found: _SourceFindings, options: VerifyOptions) -> Check:
    problems = []
    for t in found.tensors:
        if t.ok:
            continue
        if t.type == FLOAT:
            problems.append(f"{t.name!r} (FLOAT) is not the BF16-resolved source: rel. error {t.rel_err:.3g}")
        else:
            problems.append(
                f"{t.name!r} ({t.type}): SQNR {t.sqnr_db:.1f} dB < {t.min_sqnr_db:g} dB (rel. error {t.rel_err:.4f})"
            )
    measured_problems = bool(problems)
    problems += [f"not measured: {s}" for s in found.skipped]
    mx_tensors = [t for t in found.tensors if t.type in MX_TYPES]
    detail = f"{len(found.tensors)} weights measured"
    if mx_tensors:
        worst = min(mx_tensors, key=lambda t: t.sqnr_db if not math.isnan(t.sqnr_db) else -math.inf)
        detail += f"; worst {worst.name} {worst.sqnr_db:.1f} dB"
    check = _make_check("accuracy", problems, detail)
    if problems and not measured_problems:
        check.hint = STRUCTURAL_HINT
    return check


def check_exact(found: _SourceFindings, lay: _Layout, options: VerifyOptions) -> Check:
    prov = lay.pkg.provenance or {}
    if prov.get("scale_rule") not in SCALE_RULES:
        return _make_check("exact", [f"no scale rule recorded in {PROVENANCE_NAME}: the bytes cannot be re-derived"], "")
    if options.exact == "full" or options.sample >= 1.0:
        what = f"every row ({found.rows} rows)"
    else:
        what = (
            f"{found.rows} of {found.rows_of} rows (--sample {options.sample:g}, seed {options.seed}: that share of "
            "the tile rows of every weight, at least one)"
        )
    detail = (
        f"{what} re-derived from the source with the compiled kernels equal the package bytes "
        f"(rule {prov['scale_rule']}, resolve {prov.get('resolve_dtype')})"
    )
    if options.exact == "sample":
        detail += f"; {found.exact_rows} sampled rows ({options.exact_rows} per weight) equal the numpy reference"
    return _make_check("exact", found.exact, detail)


# --- MoE: the GroupedMatmulSituQuant chain on sampled layers --------------------------------------


def sample_layers(layers: list[str], count: int) -> list[str]:
    """`count` layers spread evenly from first to last (all when count is 0 or too large)."""
    if count == 0 or count >= len(layers):
        return list(layers)
    picks = np.unique(np.round(np.linspace(0, len(layers) - 1, count)).astype(int))
    return [layers[i] for i in picks]


def routing_counts(seed: int, layer_number: int, tokens: int, experts: int) -> np.ndarray:
    """Deterministic per-expert token counts: `tokens` routed uniformly at random."""
    rng = np.random.default_rng([seed, layer_number, 1])
    return rng.multinomial(tokens, np.full(experts, 1.0 / experts)).astype(np.int64)


def situ_float(x_float: np.ndarray, w13: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
    """Stages 1-2 of the chain for one expert with float weights ``(2I, K)``: float32 ``(R, I)``
    holding BF16 values (``h`` accumulated in float32 and rounded to BF16, SiTU in float32)."""
    h = elements.bf16_round(np.matmul(x_float, w13.T).astype(np.float32, copy=False))
    return gmm_situ.situ_bf16(h, beta, linear_beta)


def mx_output(y: np.ndarray) -> np.ndarray:
    """Stage 3 and back: the op's dynamic MX quantization (floor, E4M3) of ``y``, dequantized."""
    codes, scales = mx.quantize_mx(y, E4M3, "floor")
    return mx.dequantize_mx(codes, scales, E4M3)


def down_float(y: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """The expert's down_proj: ``y (R, I) @ w2 (K, I)^T`` in float32, rounded to BF16."""
    return elements.bf16_round(np.matmul(y, w2.T).astype(np.float32, copy=False))


def _rel(ref: np.ndarray, approx: np.ndarray) -> float:
    acc = ErrorAccumulator()
    acc.update(ref, approx)
    return acc.result().rel_l2


class _Experts:
    """Reads one MoE layer's experts from the package and from the source, on demand."""

    def __init__(self, lay: _Layout, reader: TensorReader, source, names: dict[int, dict[str, str]], by_weight=None):
        self.lay, self.reader, self.source, self.names = lay, reader, source, names
        self.by_weight = by_weight or {}

    def module(self, e: int, proj: str) -> _Module:
        return self.lay.modules[self.names[e][proj][: -len(".weight")]]

    def package_float(self, e: int, proj: str) -> np.ndarray:
        module = self.module(e, proj)
        _, codes, scales = _read_package_rows(self.reader, module, 0, module.n)
        return _dequantize(module, codes, scales)

    def package_packed(self, e: int, proj: str) -> tuple[np.ndarray, np.ndarray]:
        module = self.module(e, proj)
        return self.reader.read(module.weight), self.reader.read(module.scale)

    def source_float(self, e: int, proj: str) -> np.ndarray:
        linear = self.by_weight[self.names[e][proj]]
        codes = self.source.reader.read(linear.weight)
        return resolve.resolve_tiles(codes, self.source.read_scale(linear), self.source.quant.block, "bf16")


def _layer_problem(
    lay: _Layout, layer: str, names: dict[int, dict[str, str]], by_weight: dict | None
) -> tuple[str | None, str]:
    """(why the layer cannot be checked or None, its expert type); `by_weight` maps source weight
    names to their linears (None: the package alone is checked)."""
    count = max(names) + 1
    types = set()
    for e in range(count):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            name = names.get(e, {}).get(proj)
            if name is None:
                return f"{layer}: expert {e} has no {proj}", ""
            module = lay.modules.get(name[: -len(".weight")])
            if module is None or module.weight is None:
                return f"{layer}: {name!r} is not stored", ""
            if by_weight is not None:
                linear = by_weight.get(name)
                if linear is None:
                    return f"{layer}: {name!r} is not an FP8 linear of the source", ""
                why = _module_measurable(lay, module, linear)
                if why:
                    return f"{layer}: {name!r}: {why}", ""
            types.add(module.label)
    if len(types) != 1:
        return f"{layer}: experts mix types {sorted(types)} (see packed_groups)", ""
    quant_type = types.pop()
    gate = lay.modules[names[0]["gate_proj"][: -len(".weight")]]
    k, inter = gate.k, gate.n
    need = 2 * GROUP_SIZE if quant_type == W4A8_MXFP else GROUP_SIZE
    if k % need or inter % need:
        return f"{layer}: K={k}, I={inter} do not meet the op's alignment (multiples of {need})", quant_type
    return None, quant_type


def _batches(active: list[int], bytes_per_expert: int) -> Iterator[list[int]]:
    per = max(1, MOE_BATCH_BYTES // max(bytes_per_expert, 1))
    for i in range(0, len(active), per):
        yield active[i : i + per]


def _layer_number(layer: str) -> int:
    digits = re.findall(r"\d+", layer)
    return int(digits[-1]) if digits else 0


def _layer_inputs(layer: str, k: int, experts: int, options: VerifyOptions):
    number = _layer_number(layer)
    x_codes, x_scales, _ = gmm_situ.make_activations(options.seed * 1_000_003 + number, options.moe_tokens, k)
    counts = routing_counts(options.seed, number, options.moe_tokens, experts)
    return x_codes, x_scales, counts


def moe_layer_check(
    experts: _Experts, layer: str, quant_type: str, options: VerifyOptions
) -> MoeReport:
    """Run the chain on one layer with the package's and the source's experts; compare the outputs."""
    count = max(experts.names) + 1
    gate = experts.module(0, "gate_proj")
    k, inter = gate.k, gate.n
    x_codes, x_scales, counts = _layer_inputs(layer, k, count, options)
    x = gmm_situ.dequantize_activations(x_codes, x_scales)
    starts = np.concatenate([[0], np.cumsum(counts)])
    active = [e for e in range(count) if counts[e] > 0]
    total = int(counts.sum())
    y_ref = np.zeros((total, inter), np.float32)
    y_pkg = np.zeros((total, inter), np.float32)
    out_ref = np.zeros((total, k), np.float32)
    out_pkg = np.zeros((total, k), np.float32)
    for batch in _batches(active, 2 * inter * k):
        if quant_type == W4A8_MXFP:
            # the op's CPU reference, stages 1-2 (stage 3 is mx_output below)
            packed = [experts.package_packed(e, p) for e in batch for p in ("gate_proj", "up_proj")]
            w13, s13 = gmm_situ.stack_w13(
                [packed[2 * i][0] for i in range(len(batch))],
                [packed[2 * i][1] for i in range(len(batch))],
                [packed[2 * i + 1][0] for i in range(len(batch))],
                [packed[2 * i + 1][1] for i in range(len(batch))],
            )
            rows = np.concatenate([np.arange(starts[e], starts[e + 1]) for e in batch])
            y = gmm_situ.gmm_situ_float(
                GmmSituInputs(x_codes[rows], x_scales[rows], w13, s13, counts[batch], options.beta, options.linear_beta)
            )
            for i, e in enumerate(batch):
                lo = int(np.searchsorted(rows, starts[e]))
                y_pkg[starts[e] : starts[e + 1]] = y[lo : lo + counts[e]]
        for e in batch:
            lo, hi = int(starts[e]), int(starts[e + 1])
            if quant_type != W4A8_MXFP:
                w13 = np.concatenate([experts.package_float(e, "gate_proj"), experts.package_float(e, "up_proj")])
                y_pkg[lo:hi] = situ_float(x[lo:hi], w13, options.beta, options.linear_beta)
            w13_src = np.concatenate([experts.source_float(e, "gate_proj"), experts.source_float(e, "up_proj")])
            y_ref[lo:hi] = situ_float(x[lo:hi], w13_src, options.beta, options.linear_beta)
            out_ref[lo:hi] = down_float(y_ref[lo:hi], experts.source_float(e, "down_proj"))
            out_pkg[lo:hi] = down_float(mx_output(y_pkg[lo:hi]), experts.package_float(e, "down_proj"))
    path = "gmm_situ reference (W4A8_MXFP experts)" if quant_type == W4A8_MXFP else f"float chain ({quant_type} dequantized)"
    rel_situ, rel = _rel(y_ref, y_pkg), _rel(out_ref, out_pkg)
    limit = options.moe_limit(quant_type)
    return MoeReport(layer, quant_type, path, count, len(active), total, rel_situ, rel, limit, bool(rel <= limit))


def _run_moe(lay: _Layout, source, options: VerifyOptions, progress: Progress | None) -> tuple[Check, list[MoeReport]]:
    layers = moe_layers(lay.description, lay.pkg.config)
    if not layers:
        return _skip("moe", "no MoE layers in the package: nothing to check"), []
    chosen = sample_layers(list(layers), options.moe_layers)
    by_weight = {linear.weight.name: linear for linear in source.linears.values()}
    problems, reports = [], []
    with TensorReader() as reader:
        for i, layer in enumerate(chosen):
            why, quant_type = _layer_problem(lay, layer, layers[layer], by_weight)
            if why:
                problems.append(f"not checked: {why}")
                continue
            experts = _Experts(lay, reader, source, layers[layer], by_weight)
            report = moe_layer_check(experts, layer, quant_type, options)
            reports.append(report)
            if not report.ok:
                problems.append(
                    f"{layer} ({quant_type}): MoE output rel. error {report.rel_err:.4f} > {report.max_rel_err:g} "
                    f"(SiTU output {report.rel_err_situ:.4f})"
                )
            if progress:
                progress("moe", i + 1, len(chosen))
    detail = f"{len(reports)} of {len(layers)} MoE layer(s)"
    if reports:
        detail += f"; worst output rel. error {max(r.rel_err for r in reports):.4f}"
    check = _make_check("moe", problems, detail)
    if problems and all(p.startswith("not checked") for p in problems):
        check.hint = STRUCTURAL_HINT
    return check, reports


# --- the fused op on the NPU ---------------------------------------------------------------------


def compare_npu_output(
    ref: tuple[np.ndarray, np.ndarray], got: tuple[np.ndarray, np.ndarray]
) -> tuple[float, float, float]:
    """(rel. L2 of the dequantized outputs, share of equal codes, share of equal scale bytes)."""
    (rc, rs), (gc, gs) = ref, got
    a = mx.dequantize_mx(rc, rs, E4M3)
    b = mx.dequantize_mx(gc, gs, E4M3)
    rel = _rel(a, b) if np.isfinite(b).all() else math.nan
    return rel, float(np.mean(rc == gc)) if rc.size else 1.0, float(np.mean(rs == gs)) if rs.size else 1.0


def _npu_layers(lay: _Layout) -> dict[str, dict]:
    """The W4A8_MXFP MoE layers GroupedMatmulSituQuant can run on."""
    w4 = {}
    for layer, names in moe_layers(lay.description, lay.pkg.config).items():
        why, quant_type = _layer_problem(lay, layer, names, None)
        if why is None and quant_type == W4A8_MXFP:
            w4[layer] = names
    return w4


def require_npu(lay: _Layout) -> None:
    """--on-npu on a machine that cannot run the operator is the environment's problem (exit 4),
    told before any other check spends time, never a failed check of the package."""
    from ascendconv import npu

    if not _npu_layers(lay):
        return
    ok, reason = npu.npu_available()
    if not ok:
        raise NpuUnavailableError(f"--on-npu: GroupedMatmulSituQuant cannot run here: {reason}")


def _run_npu(lay: _Layout, options: VerifyOptions, progress: Progress | None) -> tuple[Check, list[NpuReport]]:
    from ascendconv import npu

    w4 = _npu_layers(lay)
    if not w4:
        return _skip("npu", "no W4A8_MXFP MoE layer: GroupedMatmulSituQuant runs only on W4A8_MXFP experts"), []
    _, reason = npu.npu_available()  # available: require_npu said so before the other checks
    chosen = sample_layers(list(w4), options.moe_layers)
    problems, reports = [], []
    with TensorReader() as reader:
        for i, layer in enumerate(chosen):
            experts = _Experts(lay, reader, None, w4[layer])
            count = max(w4[layer]) + 1
            gate = experts.module(0, "gate_proj")
            x_codes, x_scales, counts = _layer_inputs(layer, gate.k, count, options)
            starts = np.concatenate([[0], np.cumsum(counts)])
            active = [e for e in range(count) if counts[e] > 0]
            refs, gots = [], []
            for batch in _batches(active, gate.n * gate.k):
                packed = [experts.package_packed(e, p) for e in batch for p in ("gate_proj", "up_proj")]
                w13, s13 = gmm_situ.stack_w13(
                    [p[0] for p in packed[0::2]], [p[1] for p in packed[0::2]],
                    [p[0] for p in packed[1::2]], [p[1] for p in packed[1::2]],
                )
                rows = np.concatenate([np.arange(starts[e], starts[e + 1]) for e in batch])
                inputs = GmmSituInputs(
                    x_codes[rows], x_scales[rows], w13, s13, counts[batch], options.beta, options.linear_beta
                )
                refs.append(gmm_situ.gmm_situ_quant_reference(inputs))
                try:
                    gots.append(npu.run_gmm_situ_on_npu(inputs))
                except npu.NpuUnavailable as exc:
                    problems.append(f"{layer}: the NPU became unavailable: {exc.reason}")
                    break
                except Exception as exc:
                    problems.append(f"{layer}: GroupedMatmulSituQuant failed on the NPU: {type(exc).__name__}: {exc}")
                    break
            if len(gots) != len(refs):
                continue
            ref = (np.concatenate([r[0] for r in refs]), np.concatenate([r[1] for r in refs]))
            got = (np.concatenate([g[0] for g in gots]), np.concatenate([g[1] for g in gots]))
            rel, codes_equal, scales_equal = compare_npu_output(ref, got)
            passed = bool(rel <= options.npu_tol)
            reports.append(NpuReport(layer, len(active), int(counts.sum()), rel, codes_equal, scales_equal, options.npu_tol, passed))
            if not passed:
                problems.append(
                    f"{layer}: NPU output differs from the CPU reference by rel. error {rel:.4f} > {options.npu_tol:g} "
                    f"({codes_equal:.1%} of codes equal)"
                )
            if progress:
                progress("npu", i + 1, len(chosen))
    detail = f"{len(reports)} W4A8_MXFP MoE layer(s) on {reason}"
    if reports:
        detail += f"; worst rel. error {max(r.rel_err for r in reports):.4f} (tolerance {options.npu_tol:g})"
    check = _make_check("npu", problems, detail)
    if problems:
        check.hint = "the fused op disagrees with the CPU reference: check the vllm-ascend / CANN versions"
    return check, reports


# --- entry point ---------------------------------------------------------------------------------


def verify(
    package: str | os.PathLike,
    options: VerifyOptions | None = None,
    progress: Progress | None = None,
    notice: Notice | None = None,
) -> VerifyReport:
    """Check a package; see the module docstring for the checks.

    Raises `BadOptionError` (exit 2) for inconsistent options and an `InputError` (exit 3) when the
    package or the source cannot be read at all (no directory, no description, unparsable JSON).
    Every problem of a readable package is a failed check in the report, never an exception; a
    file another process truncates or opens for writing while it is mapped is SourceChangedError.
    """
    from ascendconv.io.files import mapped_reads_guarded

    with mapped_reads_guarded():
        return _verify(package, options, progress, notice)


def _verify(
    package: str | os.PathLike,
    options: VerifyOptions | None,
    progress: Progress | None,
    notice: Notice | None,
) -> VerifyReport:
    from ascendconv.io.source import SourceCheckpoint

    started = time.perf_counter()
    options = options or VerifyOptions()
    options.validate()
    pkg = Package.open(package)
    source = SourceCheckpoint.open(options.source) if options.source is not None else None
    try:
        lay = _Layout(pkg)
        if options.on_npu:
            require_npu(lay)
        checks = [
            check_files(lay),
            check_config(lay),
            check_description(lay),
            check_headers(lay),
            check_index(lay),
            check_coverage(lay),
            check_dtypes(lay),
            check_shapes(lay),
            check_pairs(lay),
            check_alignment(lay),
            check_packed_groups(lay),
        ]
        findings = _scan(lay, options, progress)
        checks.append(_make_check("scales", findings.scales, findings.detail("no E8M0 scale byte is 255")))
        checks.append(check_payload(findings))
        if options.tp > 1:
            checks.append(check_tp(lay, options.tp, options.ep))
        checks.append(check_provenance(lay))
        if options.checksums:
            checks.append(check_checksums(lay, findings))

        tensors: list[TensorReport] = []
        moe: list[MoeReport] = []
        if source is not None:
            found = _compare_source(lay, source, options, progress, notice)
            checks.append(check_source(found))
            checks.append(check_accuracy(found, options))
            checks.append(check_exact(found, lay, options))
            tensors = sorted(found.tensors, key=lambda t: (-math.inf if math.isnan(t.sqnr_db) else t.sqnr_db, t.name))
            if options.moe_check:
                check, moe = _run_moe(lay, source, options, progress)
                checks.append(check)
        npu_reports: list[NpuReport] = []
        if options.on_npu:
            check, npu_reports = _run_npu(lay, options, progress)
            checks.append(check)
        return VerifyReport(
            pkg.root, checks, tensors, moe, npu_reports, pkg.provenance, options, time.perf_counter() - started
        )
    finally:
        if source is not None:
            source.close()
