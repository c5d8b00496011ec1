"""Pure planning: from headers and config alone, decide every tensor's fate and every shard.

Nothing here reads tensor data or writes a file. `make_plan` is what `convert --dry-run` prints and
what `convert` executes; `inspect` uses it to estimate what each scheme would produce.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field
from enum import Enum

from ascendconv.ascendv1 import (
    DEFAULT_MAX_SHARD_SIZE,
    QUANT_TYPES,
    RANK,
    SHARD_NAME,
    SINGLE_SHARD_NAME,
    description_document,
    written_by_package,
)
from ascendconv.errors import BadOptionError
from ascendconv.gcpause import gc_paused
from ascendconv.formats.constants import FLOAT, W4A8_MXFP, W8A8_MXFP8
from ascendconv.io.safetensors import TensorEntry, TensorSpec
from ascendconv.io.source import Fp8Linear
from ascendconv.models import ModelRules, rules_for, tp_role



class Scheme(str, Enum):
    """What convert writes: W8A8 everywhere, W4A8 everywhere, or W4A8 experts and W8A8 the rest."""

    W8A8_MXFP8 = "w8a8-mxfp8"
    W4A8_MXFP = "w4a8-mxfp"
    W4A8_MXFP_MOE = "w4a8-mxfp-moe"


SCHEMES = tuple(scheme.value for scheme in Scheme)
SCHEME_REASONS = {scheme: f"scheme {scheme}" for scheme in SCHEMES}
RESOLVE_DTYPES = ("bf16", "fp32")

# Files of the source directory never carried into the package: weights in any format, and the
# source's own index. vLLM loads every *.safetensors in the directory.
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")
SKIPPED_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class Override:
    glob: str
    quant_type: str

    @classmethod
    def parse(cls, text: str) -> "Override":
        glob, sep, quant_type = text.rpartition("=")
        if not sep or not glob:
            raise BadOptionError(f"--override {text!r}: expected GLOB=TYPE", "e.g. --override 'model.layers.0.*=FLOAT'")
        if quant_type not in QUANT_TYPES:
            raise BadOptionError(
                f"--override {text!r}: unknown type {quant_type!r}", f"TYPE is one of {', '.join(QUANT_TYPES)}"
            )
        return cls(glob, quant_type)


GENERIC_RULES = rules_for(None)


@dataclass(frozen=True)
class Deployment:
    """How vLLM will run the package: the plan checks each type's K rule per rank.

    tp: tensor-parallel ranks (row-parallel linears split K over them). ep: expert parallelism
    (routed experts are placed whole on ranks, never split). shared_experts_as_routed: shared
    experts take the routed experts' type and rules (vllm-ascend's mix_placement loads them into the
    routed experts' tensor).
    """

    tp: int = 1
    ep: bool = False
    shared_experts_as_routed: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.tp, int) or self.tp < 1:
            raise BadOptionError(f"--tp {self.tp}: the tensor-parallel size must be at least 1")

    def to_dict(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "shared_experts_as_routed": self.shared_experts_as_routed}


def packed_group(prefix: str, rules: ModelRules = GENERIC_RULES) -> str:
    """The group a module's type is decided with: a whole MoE layer, a packed set, or itself."""
    return rules.packed_group(prefix)


NUMBERED_SEGMENT = re.compile(r"(?<=\.)\d+(?=\.|$)")


def module_pattern(name: str) -> str:
    """A module name with its layer and expert numbers (every numeric segment) replaced by '*'."""
    return NUMBERED_SEGMENT.sub("*", name)


def is_routed_expert(prefix: str, rules: ModelRules = GENERIC_RULES) -> bool:
    return rules.routed_expert(prefix) is not None


def requested_type(
    prefix: str, scheme: str, overrides: list[Override], kept_float: str | None = None, routed: bool = False
) -> tuple[str, str]:
    """The type the user asked for and where that came from (`kept_float`: why the model's rules
    keep the module FLOAT, if they do)."""
    if kept_float:
        wanted, why = FLOAT, kept_float
    elif scheme == "w8a8-mxfp8":
        wanted, why = W8A8_MXFP8, SCHEME_REASONS[scheme]
    elif scheme == "w4a8-mxfp" or routed:
        wanted, why = W4A8_MXFP, SCHEME_REASONS[scheme]
    else:
        wanted, why = W8A8_MXFP8, SCHEME_REASONS[scheme]
    for override in overrides:
        if fnmatch.fnmatchcase(prefix, override.glob):
            wanted, why = override.quant_type, f"--override {override.glob}={override.quant_type}"
    return wanted, why


def alignment_problem(quant_type: str, k: int, routed: bool, k_label: str | None = None) -> str | None:
    """Why a weight with reduction size K (per rank) cannot take `quant_type`, or None if it can."""
    return QUANT_TYPES[quant_type].k_problem(k, routed, k_label)


def rank_k(prefix: str, k: int, routed: bool, deployment: Deployment) -> tuple[int | None, str]:
    """K as one rank sees it (None if K does not split) and how to say it.

    Row-parallel linears split K over the tensor-parallel ranks; with expert parallelism routed
    experts are placed whole, so they keep their K.
    """
    tp = deployment.tp
    if tp == 1 or tp_role(prefix) != "row" or (routed and deployment.ep):
        return k, f"K={k}"
    if k % tp:
        return None, f"K={k} does not split over --tp {tp} ranks"
    return k // tp, f"K/T = {k}/{tp} = {k // tp}"


@functools.lru_cache(maxsize=4096)  # few distinct (type, K) pairs in a checkpoint, met thousands of times
def best_feasible(requested: str, k: int | None, routed: bool, k_label: str | None = None) -> tuple[str, str | None]:
    """Walk the fallback chain W4A8_MXFP -> W8A8_MXFP8 -> FLOAT down to the first type that fits."""
    if k is None:
        return FLOAT, None if requested == FLOAT else k_label
    chain = [t for t in (W4A8_MXFP, W8A8_MXFP8, FLOAT) if RANK[t] <= RANK[requested]]
    first_reason = None
    for quant_type in chain:
        problem = alignment_problem(quant_type, k, routed, k_label)
        if problem is None:
            return quant_type, first_reason
        first_reason = first_reason or problem
    raise AssertionError("FLOAT always fits")


@dataclass(slots=True)
class ModuleDecision:
    module: str
    group: str
    shape: tuple[int, int]
    requested: str
    written: str
    reason: str  # why `written`, in words

    @property
    def is_fallback(self) -> bool:
        return self.written != self.requested

    def to_dict(self) -> dict:
        return {"module": self.module, "requested": self.requested, "written": self.written, "reason": self.reason}


@dataclass(frozen=True)
class ModuleFacts:
    """What the model's rules and the deployment say about one FP8 linear, whatever the scheme."""

    group: str  # decided together: a MoE layer ('....experts'), a fused module, or itself
    routed: bool  # a routed expert (or a shared one placed with them): the MoE kernels' K rule
    kept_float: str | None  # why the model's rules keep it FLOAT, if they do
    mtp: bool  # in a multi-token-prediction layer
    k: int | None  # K as one rank sees it (None: K does not split over the ranks)
    k_label: str  # how to say K in a reason


def module_facts(
    linears: dict[str, Fp8Linear], rules: ModelRules = GENERIC_RULES, deployment: Deployment = Deployment()
) -> dict[str, ModuleFacts]:
    facts = {}
    for prefix, linear in linears.items():
        expert = rules.routed_expert(prefix)
        routed = expert is not None
        group = expert["layer"] + ".experts" if routed else rules.packed_group(prefix)
        if deployment.shared_experts_as_routed and not routed:
            shared_in = rules.shared_expert_layer(prefix)
            if shared_in is not None:  # loaded into the routed experts' tensor: one of them
                routed, group = True, shared_in + ".experts"
        k, k_label = rank_k(prefix, linear.shape[1], routed, deployment)
        facts[prefix] = ModuleFacts(group, routed, rules.default_float(prefix), rules.is_mtp(prefix), k, k_label)
    return facts


def group_members(facts: dict[str, ModuleFacts]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for prefix, fact in facts.items():
        groups.setdefault(fact.group, []).append(prefix)
    return groups


def decide_modules(
    linears: dict[str, Fp8Linear],
    scheme: str,
    overrides: list[Override],
    facts: dict[str, ModuleFacts] | None = None,
    groups: dict[str, list[str]] | None = None,
) -> dict[str, ModuleDecision]:
    """Every FP8 linear's written type and why. `facts` and `groups` (module_facts, group_members)
    are computed here unless given: a Planner computes them once for every scheme."""
    if scheme not in SCHEMES:
        raise BadOptionError(f"unknown scheme {scheme!r}", f"choose one of {', '.join(SCHEMES)}")
    facts = facts if facts is not None else module_facts(linears)
    groups = groups if groups is not None else group_members(facts)
    decisions: dict[str, ModuleDecision] = {}
    for group, members in groups.items():
        wants, fits = [], []
        for prefix in members:
            fact = facts[prefix]
            want = requested_type(prefix, scheme, overrides, fact.kept_float, fact.routed)
            wants.append(want)
            fits.append(best_feasible(want[0], fact.k, fact.routed, fact.k_label))
        group_type = min((fit[0] for fit in fits), key=RANK.__getitem__)
        at = next(i for i, fit in enumerate(fits) if fit[0] == group_type)
        limiting, limiting_fit, limiting_want = members[at], fits[at], wants[at]
        # vllm-ascend reads a MoE layer's type from its first expert and a fused module's from one
        # member: the whole group takes the lowest type any member needs
        if group.endswith(".experts"):
            joined = f"one type per MoE layer; {limiting[len(group) - len('experts'):]}"
        else:
            joined = f"packed with {limiting}"
        for prefix, (requested, why), (fit_type, fit_reason) in zip(members, wants, fits):
            if group_type == requested:
                reason = why
            elif fit_type == group_type and fit_reason:
                reason = fit_reason
            elif limiting_fit[1]:
                reason = f"{joined}: {limiting_fit[1]}"
            else:
                reason = f"{joined} was requested as {limiting_want[0]} ({limiting_want[1]})"
            decisions[prefix] = ModuleDecision(prefix, group, linears[prefix].shape, requested, group_type, reason)
    return decisions


class OutputKind(str, Enum):
    """How a package tensor is made from its source tensor."""

    COPY = "copy"  # bytes as they are
    RESOLVE = "resolve"  # FP8 -> BF16 (a FLOAT module)
    MX_WEIGHT = "mx_weight"  # the payload half of an MX linear
    MX_SCALE = "mx_scale"  # the E8M0 half, made with its weight
    BIAS_F32 = "bias_f32"  # an MX layer's bias, cast to float32


@dataclass(slots=True)
class OutputTensor:
    """One tensor of the package and how it is made from the source. `shard` is set when the plan
    places it; `nbytes` is stored (a full-scale plan sums it many times)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    quant_type: str
    kind: OutputKind
    source: str
    nbytes: int
    shard: int = 0

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.dtype, self.shape)


@dataclass
class ShardPlan:
    file: str
    tensors: list[OutputTensor] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass
class Plan:
    scheme: str
    scale_rule: str
    resolve_dtype: str
    max_shard_size: int
    decisions: dict[str, ModuleDecision]
    tensors: list[OutputTensor]
    shards: list[ShardPlan]
    copied_files: list[str]
    bytes_in: int
    skipped_files: dict[str, str] = field(default_factory=dict)  # source file -> why it is not copied
    rules: ModelRules = GENERIC_RULES
    deployment: Deployment = Deployment()
    facts: dict[str, ModuleFacts] = field(default_factory=dict)  # per FP8 linear, as decided with

    @property
    def warnings(self) -> list[str]:
        return [self.rules.warning] if self.rules.warning else []

    def kept_float(self) -> dict[str, int]:
        """Modules the model's rules keep FLOAT (and were not overridden), per reason."""
        counts: dict[str, int] = {}
        for decision in self.decisions.values():
            if decision.written == FLOAT and decision.reason == self.facts[decision.module].kept_float:
                counts[decision.reason] = counts.get(decision.reason, 0) + 1
        return counts

    def quantized_mtp_modules(self) -> int:
        """MTP modules written in an MX type (only an --override does that)."""
        return sum(1 for d in self.decisions.values() if d.written != FLOAT and self.facts[d.module].mtp)

    @property
    def fallbacks(self) -> list[ModuleDecision]:
        return [d for d in self.decisions.values() if d.is_fallback]

    @property
    def bytes_out(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def model_quant_type(self) -> str:
        present = {t.quant_type for t in self.tensors}
        return max(present, key=RANK.__getitem__) if present else FLOAT

    def type_counts(self) -> dict[str, int]:
        """Source linears per written type (how many modules became what)."""
        counts = dict.fromkeys(QUANT_TYPES, 0)
        for decision in self.decisions.values():
            counts[decision.written] += 1
        return counts

    def module_groups(self) -> dict[str, dict[str, int]]:
        """Source linears by name pattern (layer and expert numbers as '*'): written type -> count."""
        groups: dict[str, dict[str, int]] = {}
        for prefix, decision in sorted(self.decisions.items()):
            types = groups.setdefault(module_pattern(prefix), {})
            types[decision.written] = types.get(decision.written, 0) + 1
        return dict(sorted(groups.items()))

    def tensor_counts(self) -> dict[str, int]:
        """Package tensors per description label."""
        counts = dict.fromkeys(QUANT_TYPES, 0)
        for tensor in self.tensors:
            counts[tensor.quant_type] += 1
        return counts

    def description(self) -> dict:
        return description_document({t.name: t.quant_type for t in self.tensors}, self.model_quant_type)

    def index(self) -> dict | None:
        if self.max_shard_size == 0:
            return None
        weight_map = {t.name: self.shards[t.shard].file for t in sorted(self.tensors, key=lambda t: t.name)}
        return {"metadata": {"total_size": self.bytes_out}, "weight_map": weight_map}

    def to_dict(self) -> dict:
        return {
            "scheme": self.scheme,
            "model_type": self.rules.model_type,
            **self.deployment.to_dict(),
            "warnings": self.warnings,
            "scale_rule": self.scale_rule,
            "resolve_dtype": self.resolve_dtype,
            "model_quant_type": self.model_quant_type,
            "modules": self.type_counts(),
            "tensors": self.tensor_counts(),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "fallbacks": [d.to_dict() for d in self.fallbacks],
            "kept_float": self.kept_float(),
            "shards": [{"file": s.file, "tensors": len(s.tensors), "bytes": s.nbytes} for s in self.shards],
            "copied_files": self.copied_files,
            "skipped_files": self.skipped_files,
        }


def source_layout(tensors: dict[str, TensorEntry], linears: dict[str, Fp8Linear]) -> list[tuple]:
    """The source tensors a package is made from, in source order, as (name, entry, prefix of the
    linear whose FP8 weight it is, prefix of the linear whose bias it is). Scales are left out: an
    MX weight's scale is made with it."""
    by_weight = {linear.weight.name: linear for linear in linears.values()}
    scales = {linear.scale.name for linear in linears.values()}
    bias_of = {linear.bias.name: linear.prefix for linear in linears.values() if linear.bias}
    layout = []
    for name, entry in tensors.items():
        if name in scales:
            continue
        linear = by_weight.get(name)
        layout.append((name, entry, linear.prefix if linear else None, bias_of.get(name)))
    return layout


def output_tensors(
    tensors: dict[str, TensorEntry],
    linears: dict[str, Fp8Linear],
    decisions: dict[str, ModuleDecision],
    layout: list | None = None,
) -> list[OutputTensor]:
    """Every package tensor, in source order so that reading the source stays sequential."""
    out: list[OutputTensor] = []
    add = out.append
    for name, entry, prefix, bias_of in layout if layout is not None else source_layout(tensors, linears):
        if prefix is None:
            if bias_of is not None and decisions[bias_of].written != FLOAT:
                add(OutputTensor(name, "F32", entry.shape, FLOAT, OutputKind.BIAS_F32, name, 4 * entry.numel))
            else:
                add(OutputTensor(name, entry.dtype, entry.shape, FLOAT, OutputKind.COPY, name, entry.nbytes))
            continue
        written = decisions[prefix].written
        n, k = entry.shape
        if written == FLOAT:
            add(OutputTensor(name, "BF16", (n, k), FLOAT, OutputKind.RESOLVE, name, 2 * n * k))
            continue
        quant = QUANT_TYPES[written]
        shape = quant.weight_shape(n, k)
        add(OutputTensor(name, quant.weight_dtype, shape, written, OutputKind.MX_WEIGHT, name, shape[0] * shape[1]))
        scale = quant.scale_shape(n, k)
        add(OutputTensor(prefix + ".weight_scale", "U8", scale, written, OutputKind.MX_SCALE, name, scale[0] * scale[1]))
    return out


def assign_shards(tensors: list[OutputTensor], max_shard_size: int) -> tuple[list[OutputTensor], list[ShardPlan]]:
    """Fill shards in write order; cut before a tensor that would take a shard past the limit.

    An MX weight and its scale stay in one shard: they are produced together.
    """
    if max_shard_size == 0:
        return tensors, [ShardPlan(SINGLE_SHARD_NAME, list(tensors))]
    bins: list[list[OutputTensor]] = [[]]
    size = 0
    i, count = 0, len(tensors)
    while i < count:
        step = 2 if tensors[i].kind is OutputKind.MX_WEIGHT else 1  # the weight and its scale
        unit_size = tensors[i].nbytes + (tensors[i + 1].nbytes if step == 2 else 0)
        if bins[-1] and size + unit_size > max_shard_size:
            bins.append([])
            size = 0
        bins[-1].extend(tensors[i : i + step])
        size += unit_size
        i += step
    total = len(bins)
    shards = []
    for number, members in enumerate(bins):
        for tensor in members:
            tensor.shard = number
        shards.append(ShardPlan(SHARD_NAME.format(number + 1, total), members))
    return tensors, shards


def files_to_copy(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Top-level source files the package carries (configs, tokenizer, templates, code, docs), and
    the ones it leaves out although they are not weights, with why."""
    keep: list[str] = []
    skipped: dict[str, str] = {}
    for name in sorted(names):
        lower = name.lower()
        if name.startswith(".") or lower.endswith(WEIGHT_FILE_SUFFIXES) or name in SKIPPED_FILES:
            continue
        if written_by_package(name):
            skipped[name] = "the package writes a file of this name itself"
            continue
        keep.append(name)
    return keep, skipped


class Planner:
    """Plans for one source and deployment. The model's rules are applied to every FP8 linear once;
    each `plan()` (inspect makes one per scheme) then only decides types, tensors and shards.

    `config` is the source's config.json: its model_type selects the rules in models.py.
    """

    @gc_paused()
    def __init__(
        self,
        tensors: dict[str, TensorEntry],
        linears: dict[str, Fp8Linear],
        source_files: list[str],
        bytes_in: int,
        config: dict | None = None,
        deployment: Deployment | None = None,
        unsafe_files: dict[str, str] | None = None,
    ):
        self.tensors = tensors
        self.linears = linears
        self.copied_files, skipped = files_to_copy(source_files)
        self.skipped_files = {**(unsafe_files or {}), **skipped}  # source file -> why it is not copied
        self.bytes_in = bytes_in
        self.rules = rules_for(config)
        self.deployment = deployment or Deployment()
        self.facts = module_facts(linears, self.rules, self.deployment)
        self.groups = group_members(self.facts)
        self.layout = source_layout(tensors, linears)

    @gc_paused()
    def plan(
        self,
        scheme: str = "w8a8-mxfp8",
        scale_rule: str = "mse",
        resolve_dtype: str = "bf16",
        overrides: list[Override] | None = None,
        max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    ) -> Plan:
        from ascendconv.formats.constants import SCALE_RULES

        if scale_rule not in SCALE_RULES:
            raise BadOptionError(f"unknown scale rule {scale_rule!r}", f"choose one of {', '.join(SCALE_RULES)}")
        if resolve_dtype not in RESOLVE_DTYPES:
            raise BadOptionError(f"unknown resolve dtype {resolve_dtype!r}", "choose bf16 or fp32")
        if max_shard_size < 0:
            raise BadOptionError("--max-shard-size must not be negative")
        decisions = decide_modules(self.linears, scheme, overrides or [], self.facts, self.groups)
        placed, shards = assign_shards(
            output_tensors(self.tensors, self.linears, decisions, self.layout), max_shard_size
        )
        return Plan(
            scheme=scheme,
            scale_rule=scale_rule,
            resolve_dtype=resolve_dtype,
            max_shard_size=max_shard_size,
            decisions=decisions,
            tensors=placed,
            shards=shards,
            copied_files=list(self.copied_files),
            bytes_in=self.bytes_in,
            skipped_files=dict(self.skipped_files),
            rules=self.rules,
            deployment=self.deployment,
            facts=self.facts,
        )


def make_plan(
    tensors: dict[str, TensorEntry],
    linears: dict[str, Fp8Linear],
    source_files: list[str],
    bytes_in: int,
    scheme: str = "w8a8-mxfp8",
    scale_rule: str = "mse",
    resolve_dtype: str = "bf16",
    overrides: list[Override] | None = None,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    unsafe_files: dict[str, str] | None = None,
    config: dict | None = None,
    deployment: Deployment | None = None,
) -> Plan:
    """One plan: `Planner(...).plan(...)`."""
    planner = Planner(tensors, linears, source_files, bytes_in, config, deployment, unsafe_files)
    return planner.plan(scheme, scale_rule, resolve_dtype, overrides, max_shard_size)


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """'4GiB', '500MB', '0' -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match[2].upper() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise BadOptionError(f"cannot read size {text!r}", "use a number with an optional unit: 500MB, 2GiB, 0")
    return int(float(match[1]) * _SIZE_UNITS[unit])
