"""Pure planning: from headers and config alone, decide every tensor's fate and every shard.

Nothing here reads tensor data or writes a file. `make_plan` is what `convert --dry-run` prints and
what `convert` executes; `inspect` uses it to estimate what each scheme would produce. Each FP8
linear's type is decided in decide.py; this module turns the decisions into the package's tensors,
shards and small files.
"""

from __future__ import annotations

import bisect
import fnmatch
import functools
import itertools
import operator
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterator

from ascendconv.ascendv1 import (
    DEFAULT_MAX_SHARD_SIZE,
    QUANT_TYPES,
    RANK,
    SHARD_NAME,
    SINGLE_SHARD_NAME,
    description_document,
    written_by_package,
)
from ascendconv.decide import (
    GENERIC_RULES,
    Deployment,
    GroupDecision,
    MemberClasses,
    ModuleDecision,
    ModuleFacts,
    Override,
    best_feasible,
    decide_groups,
    group_members,
    member_classes,
    module_decisions,
    module_facts,
    module_group,
    module_pattern,
)
from ascendconv.errors import BadOptionError, plural
from ascendconv.gcpause import gc_paused
from ascendconv.formats.constants import FLOAT, RESOLVE_DTYPES, transform_for
from ascendconv.io.safetensors import TensorEntry
from ascendconv.io.writer import TensorSpec
from ascendconv.sources import Source, SourceLinear
from ascendconv.sources.plain import FLOAT_DTYPES
from ascendconv.models import AddedTensor, LackingHead, ModelRules, rules_for


# Files of the source directory never carried into the package: weights in any format, and the
# source's own index. vLLM loads every *.safetensors in the directory.
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")
# hf_quant_config.json describes a ModelOpt source's quantization: vLLM would take it for the package's.
SKIPPED_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json", "hf_quant_config.json")


class OutputKind(str, Enum):
    """How a package tensor is made from its source tensor."""

    COPY = "copy"  # bytes as they are
    RESOLVE = "resolve"  # FP8 -> BF16 (a FLOAT module)
    MX_WEIGHT = "mx_weight"  # the payload half of an MX linear, quantized (from FP8 tiles, floats or MX values)
    MX_RELAID = "mx_relaid"  # the payload of an MX source linear re-laid out by a named exact transform
    MX_SCALE = "mx_scale"  # the E8M0 half, made with its weight
    BIAS_F32 = "bias_f32"  # an MX layer's bias, cast to float32


RELAID, REQUANTIZED = "relaid", "requantized"
MX_PAYLOADS = (OutputKind.MX_WEIGHT, OutputKind.MX_RELAID)  # each followed by its scale


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
    transform: str | None = None  # MX_RELAID: the transform of formats/relayout.py

    @property
    def conversion(self) -> str | None:
        """How an MX payload is made: 'relaid' (the source's bytes, losslessly) or 'requantized'."""
        if self.kind is OutputKind.MX_RELAID:
            return RELAID
        return REQUANTIZED if self.kind is OutputKind.MX_WEIGHT else None

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


@dataclass(frozen=True)
class PlanFigures:
    """What a plan's tensors add up to, counted without making them (Planner.figures): inspect
    estimates every scheme of a full-scale checkpoint from these."""

    tensors: dict[str, int]  # package tensors per description label (every label, zeros included)
    bytes_out: int
    shards: int

    @property
    def model_quant_type(self) -> str:
        present = [quant_type for quant_type, count in self.tensors.items() if count]
        return max(present, key=RANK.__getitem__) if present else FLOAT


@dataclass
class Plan:
    """One scheme's plan. Its tensors and shards are made on first use (`place`): a dry run and
    convert use them, inspect only the decisions and the figures."""

    scheme: str
    scale_rule: str
    resolve_dtype: str
    max_shard_size: int
    groups: dict[str, GroupDecision]  # decided together: a MoE layer, a packed set, a linear
    figures: PlanFigures
    place: Callable[[], tuple[list[OutputTensor], list[ShardPlan]]] = field(repr=False, compare=False)
    copied_files: list[str] = field(default_factory=list)
    bytes_in: int = 0
    skipped_files: dict[str, str] = field(default_factory=dict)  # source file -> why it is not copied
    rules: ModelRules = GENERIC_RULES
    deployment: Deployment = Deployment()
    facts: dict[str, ModuleFacts] = field(default_factory=dict)  # per source linear, as decided with
    unmatched_overrides: list[str] = field(default_factory=list)  # --override globs that match no linear
    # tensors the package adds for the MTP drafter (COPY tensors named apart from their source), and
    # the ones the drafter needs that --no-mtp-heads leaves out
    added: list[AddedTensor] = field(default_factory=list)
    heads_left_out: list[AddedTensor] = field(default_factory=list)
    heads_lacking: list[LackingHead] = field(default_factory=list)  # the drafter needs, the source cannot give
    expert_biases: dict[str, str] = field(default_factory=dict)  # MoE layer -> the first bias its routed experts carry
    # (file, tensors, bytes) of each shard, counted without placing the tensors (Planner.count_shards)
    count_shards: Callable[[], list[tuple[str, int, int]]] | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def decisions(self) -> dict[str, ModuleDecision]:
        """Every source linear's decision, by module prefix."""
        return module_decisions(self.groups, self.facts)

    @functools.cached_property
    def _placed(self) -> tuple[list[OutputTensor], list[ShardPlan]]:
        return self.place()

    @property
    def tensors(self) -> list[OutputTensor]:
        """Every package tensor, in write order."""
        return self._placed[0]

    @property
    def shards(self) -> list[ShardPlan]:
        return self._placed[1]

    def shard_rows(self) -> list[tuple[str, int, int]]:
        """(file, tensors, bytes) of each shard: what a dry run shows, without placing the plan's
        hundreds of thousands of tensors unless they are placed already."""
        if "_placed" in self.__dict__ or self.count_shards is None:
            return [(shard.file, len(shard.tensors), shard.nbytes) for shard in self.shards]
        return self.count_shards()

    @property
    def warnings(self) -> list[str]:
        warnings = [self.rules.warning] if self.rules.warning else []
        if self.rules.layer_count_warning:
            warnings.append(self.rules.layer_count_warning)
        mtp = self.quantized_mtp_modules()
        if mtp:
            warnings.append(f"{plural(mtp, 'MTP module')} quantized by --override: vllm-ascend expects the MTP layer FLOAT")
        if self.unmatched_overrides:  # allowed by --allow-unmatched-override, or convert would refuse
            warnings.append(f"--override {', '.join(self.unmatched_overrides)}: matches no linear of the source")
        for head in self.heads_left_out:
            warnings.append(
                f"{head.name} is not in the source and --no-mtp-heads leaves it out: vllm-ascend's MTP drafter "
                f"looks it up at construction, so speculative decoding with MTP will not load ({head.reason})"
            )
        for head in self.heads_lacking:
            untied = (
                f" (config.json does not set tie_word_embeddings, so {head.untied_embedding} is not the output head)"
                if head.untied_embedding else ""
            )
            warnings.append(
                f"{head.name} is not in the source, nor {' or '.join(head.sources)} to copy it from{untied}: "
                "vllm-ascend's MTP drafter looks it up at construction, so speculative decoding with MTP will not load"
            )
        biased = [bias for group, bias in self.expert_biases.items() if self.groups[group].written != FLOAT]
        if biased:
            warnings.append(
                f"routed experts carry biases in {plural(len(biased), 'MoE layer')} (first: {biased[0]}), written F32 beside MX "
                "experts: vllm-ascend's MX MoE applies no expert bias, so served so, these layers run without them"
            )
        warnings += self.tp_growth_warnings()
        # a file the source holds and the package lacks (a tokenizer, a template) is the user's to know of
        warnings += [f"{name} is not carried into the package: {why}" for name, why in self.skipped_files.items()]
        return warnings

    def tp_growth_warnings(self) -> list[str]:
        """Deployment advice: routed experts that fall back only because --tp splits their K (they
        would keep their requested type placed whole, as --ep does), and what that costs in bytes."""
        if self.deployment.tp == 1 or self.deployment.ep:
            return []
        grown: dict[tuple[str, str], list[int]] = {}  # (requested, written) -> [linears, extra bytes]
        layers: dict[tuple[str, str], set[str]] = {}
        for decision in self.fallbacks:
            fact = self.facts[decision.module]
            n, k = decision.shape
            if not fact.routed or best_feasible(decision.requested, k, True)[0] != decision.requested:
                continue
            key = (decision.requested, decision.written)
            row = grown.setdefault(key, [0, 0])
            row[0] += 1
            row[1] += linear_bytes(decision.written, n, k) - linear_bytes(decision.requested, n, k)
            layers.setdefault(key, set()).add(decision.group)
        warnings = []
        for (requested, written), (count, extra) in grown.items():
            before = self.bytes_out - extra
            warnings.append(
                f"--tp {self.deployment.tp} splits the routed experts' K below what {requested} accepts: {count} expert "
                f"linears in {plural(len(layers[(requested, written)]), 'MoE layer')} are written {written}, and the package "
                f"grows by {extra / 1e9:.1f} GB ({before / 1e9:.1f} GB -> {self.bytes_out / 1e9:.1f} GB, "
                f"{self.bytes_out / before:.2f}x); with --ep vLLM places experts whole and they stay {requested}"
            )
        return warnings

    def kept_float(self) -> dict[str, int]:
        """Modules the model's rules keep FLOAT (and were not overridden), per reason."""
        return dict(self._kept_float)

    @functools.cached_property  # warnings, inspect and the render each ask; a plan's decisions are final
    def _kept_float(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for group in self.groups.values():
            if group.written != FLOAT:
                continue
            members = None
            for key, (requested, reason) in group.outcomes.items():
                if reason == self._outcome_facts(group, key).kept_float:
                    members = members or group.counts()
                    counts[reason] = counts.get(reason, 0) + members[key]
        return counts

    def _outcome_facts(self, group: GroupDecision, key) -> ModuleFacts:
        """The facts of the first member with this outcome (members of an outcome share their facts)."""
        return self.facts[group.members[group.keys.index(key)]]

    def quantized_mtp_modules(self) -> int:
        """MTP modules written in an MX type (only an --override does that)."""
        return self._quantized_mtp_modules

    @functools.cached_property
    def _quantized_mtp_modules(self) -> int:
        return sum(group.mtp for group in self.groups.values() if group.written != FLOAT)

    @property
    def fallbacks(self) -> list[ModuleDecision]:
        return list(self._fallbacks)

    @functools.cached_property
    def _fallbacks(self) -> list[ModuleDecision]:
        fallbacks = []
        for name, group in self.groups.items():
            written, outcomes = group.written, group.outcomes
            if all(requested == written for requested, _ in outcomes.values()):
                continue  # ModuleDecision.is_fallback: written is not requested
            for prefix, key in zip(group.members, group.keys):
                requested, reason = outcomes[key]
                if requested != written:
                    fallbacks.append(ModuleDecision(prefix, name, self.facts[prefix].shape, requested, written, reason))
        return fallbacks

    @property
    def bytes_out(self) -> int:
        return self.figures.bytes_out

    @property
    def model_quant_type(self) -> str:
        return self.figures.model_quant_type

    def type_counts(self) -> dict[str, int]:
        """Source linears per written type (how many modules became what)."""
        counts = dict.fromkeys(QUANT_TYPES, 0)
        for group in self.groups.values():
            counts[group.written] += len(group.members)
        return counts

    def module_groups(self) -> dict[str, dict[str, int]]:
        """Source linears by name pattern (layer and expert numbers as '*'): written type -> count."""
        tallies: dict[str, dict[str, list]] = {}  # pattern -> written type -> [count, the member lists it counts]
        for group in self.groups.values():
            for pattern, count in member_patterns(group.members, self.rules.routed_expert).items():
                slot = tallies.setdefault(pattern, {}).setdefault(group.written, [0, []])
                slot[0] += count
                slot[1].append(group.members)
        found = {}
        for pattern, types in sorted(tallies.items()):
            order = list(types)
            if len(order) > 1:  # in the order of their first members by name, looked for only here
                firsts = {written: first_member(pattern, slot[1]) for written, slot in types.items()}
                order.sort(key=firsts.__getitem__)
            found[pattern] = {written: types[written][0] for written in order}
        return found

    def tensor_counts(self) -> dict[str, int]:
        """Package tensors per description label."""
        return dict(self.figures.tensors)

    def conversions(self) -> dict[str, str]:
        """MX payload tensor -> 'relaid' or 'requantized'."""
        return {t.name: t.conversion for t in self.tensors if t.conversion is not None}

    def conversion_counts(self) -> dict[str, int]:
        """MX payloads relaid and requantized, from each MX linear's facts (no tensor is placed)."""
        counts = {RELAID: 0, REQUANTIZED: 0}
        if not any(map(operator.attrgetter("native"), self.facts.values())):  # no MX source linear: none is relaid
            counts[REQUANTIZED] = sum(len(group.members) for group in self.groups.values() if group.written != FLOAT)
            return counts
        for _, kind in self._member_conversions():
            counts[kind] += 1
        return counts

    def conversion_groups(self) -> dict[str, dict[str, int]]:
        """MX payloads by name pattern (layer and expert numbers as '*'): relaid / requantized counts,
        as conversion_counts (a dry run of a full-scale MX source would otherwise place its half a
        million tensors for this table alone)."""
        groups: dict[str, dict[str, int]] = {}
        for prefix, kind in self._member_conversions():
            pattern = module_pattern(prefix + ".weight")  # the payload's name (conversions)
            counts = groups.get(pattern)
            if counts is None:
                counts = groups[pattern] = {RELAID: 0, REQUANTIZED: 0}
            counts[kind] += 1
        return dict(sorted(groups.items()))

    def _member_conversions(self) -> Iterator[tuple[str, str]]:
        """(prefix, 'relaid' or 'requantized') of each linear written MX, its kind found once per
        facts object (the members of a group share a few)."""
        facts = self.facts
        for group in self.groups.values():
            if group.written == FLOAT:
                continue
            kinds: dict[int, str] = {}  # id of a facts object -> its conversion
            for prefix in group.members:
                fact = facts[prefix]
                kind = kinds.get(id(fact))
                if kind is None:
                    n, k = fact.shape
                    relaid = mx_tensors(group.written, n, k, fact.native)[3] is OutputKind.MX_RELAID
                    kind = kinds[id(fact)] = RELAID if relaid else REQUANTIZED
                yield prefix, kind

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
            "conversion_counts": self.conversion_counts(),
            "conversions": self.conversions(),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "fallbacks": [d.to_dict() for d in self.fallbacks],
            "kept_float": self.kept_float(),
            "added_tensors": {added.name: added.to_dict() for added in self.added},
            "shards": [{"file": s.file, "tensors": len(s.tensors), "bytes": s.nbytes} for s in self.shards],
            "copied_files": self.copied_files,
            "skipped_files": self.skipped_files,
        }


def member_patterns(members: list[str], routed_expert: Callable[[str], dict | None]) -> dict[str, int]:
    """Members per module_pattern. A group of routed experts alone (`routed_expert`: the model's
    rule) has one pattern per projection: their names differ in the expert number only, which the
    pattern makes '*'; so it is found once per projection, not once per expert."""
    experts = list(map(routed_expert, members))
    if None in experts:  # a dense module, a packed set, a shared expert placed with the routed ones
        return Counter(map(module_pattern, members))
    by_projection = Counter(map(operator.itemgetter("proj"), experts))
    first: dict[str, str] = {}  # projection -> its first member (the first few members hold them all)
    for member, expert in zip(members, experts):
        first.setdefault(expert["proj"], member)
        if len(first) == len(by_projection):
            break
    counts: dict[str, int] = {}
    for proj, count in by_projection.items():
        pattern = module_pattern(first[proj])
        counts[pattern] = counts.get(pattern, 0) + count
    return counts


def first_member(pattern: str, member_lists: list[list[str]]) -> str:
    """The first by name of the members of `member_lists` that have this module_pattern."""
    return min(member for members in member_lists for member in members if module_pattern(member) == pattern)


def linear_bytes(quant_type: str, n: int, k: int) -> int:
    """Bytes of an [N, K] source linear written as `quant_type`: BF16 when FLOAT, else payload + scales."""
    if quant_type == FLOAT:
        return 2 * n * k
    quant = QUANT_TYPES[quant_type]
    weight, scale = quant.weight_shape(n, k), quant.scale_shape(n, k)
    return weight[0] * weight[1] + (scale[0] * scale[1] if scale else 0)


def source_layout(tensors: dict[str, TensorEntry], linears: dict[str, SourceLinear]) -> list[tuple]:
    """The source tensors a package is made from, in source order, as (name, entry, prefix of the
    linear whose FP8 weight it is, prefix of the linear whose bias it is). Scales are left out: an
    MX weight's scale is made with it."""
    by_weight = {linear.weight.name: linear for linear in linears.values()}
    scales = {linear.scale.name for linear in linears.values() if linear.scale is not None}
    bias_of = {linear.bias.name: linear.prefix for linear in linears.values() if linear.bias}
    layout = []
    for name, entry in tensors.items():
        if name in scales:
            continue
        linear = by_weight.get(name)
        layout.append((name, entry, linear.prefix if linear else None, bias_of.get(name)))
    return layout


@functools.lru_cache(maxsize=1024)  # a full-scale checkpoint has 100,000 linears of a few dozen shapes
def mx_tensors(written: str, n: int, k: int, native: str | None) -> tuple:
    """An [N, K] linear written in the MX type `written` (`native`: the type its source bytes are):
    (payload dtype, payload shape, payload bytes, kind, transform, scale shape, scale bytes)."""
    quant = QUANT_TYPES[written]
    shape, scale = quant.weight_shape(n, k), quant.scale_shape(n, k)
    transform = transform_for(QUANT_TYPES[native].element, quant.element) if native else None
    kind = OutputKind.MX_WEIGHT if transform is None else OutputKind.MX_RELAID
    return quant.weight_dtype, shape, shape[0] * shape[1], kind, transform, scale, scale[0] * scale[1]


def output_tensors(
    tensors: dict[str, TensorEntry],
    linears: dict[str, SourceLinear],
    written_as: dict[str, str],
    layout: list | None = None,
    added: list[AddedTensor] = (),
) -> list[OutputTensor]:
    """Every package tensor, in source order so that reading the source stays sequential, then the
    tensors the package adds (byte copies of a source tensor under another name). `written_as`:
    each linear's written type, by module prefix."""
    out: list[OutputTensor] = []
    add = out.append
    for name, entry, prefix, bias_of in layout if layout is not None else source_layout(tensors, linears):
        if prefix is None:
            if bias_of is not None and written_as[bias_of] != FLOAT:
                add(OutputTensor(name, "F32", entry.shape, FLOAT, OutputKind.BIAS_F32, name, 4 * entry.numel))
            else:
                add(OutputTensor(name, entry.dtype, entry.shape, FLOAT, OutputKind.COPY, name, entry.nbytes))
            continue
        written = written_as[prefix]
        linear = linears[prefix]
        weight = prefix + ".weight"  # the source may name it otherwise (compressed-tensors: weight_packed)
        if written == FLOAT:
            if linear.copied_when_float:
                add(OutputTensor(weight, entry.dtype, entry.shape, FLOAT, OutputKind.COPY, name, entry.nbytes))
            else:
                n, k = linear.shape
                add(OutputTensor(weight, "BF16", (n, k), FLOAT, OutputKind.RESOLVE, name, 2 * n * k))
            continue
        n, k = linear.shape
        dtype, shape, nbytes, kind, transform, scale, scale_bytes = mx_tensors(written, n, k, linear.native)
        add(OutputTensor(weight, dtype, shape, written, kind, name, nbytes, transform=transform))
        add(OutputTensor(prefix + ".weight_scale", "U8", scale, written, OutputKind.MX_SCALE, name, scale_bytes))
    out += [added_tensor(extra, tensors, linears) for extra in added]
    return out


def added_tensor(extra: AddedTensor, tensors: dict[str, TensorEntry], linears: dict[str, SourceLinear]) -> OutputTensor:
    """The package tensor of an added one: a byte copy of its source tensor, or, when that is the
    weight of a quantized source linear (an FP8 lm_head or embedding), its values resolved to BF16,
    as any FLOAT linear's: FP8 bytes under a FLOAT label would not load."""
    entry = tensors[extra.source]
    linear = linears.get(extra.source.rpartition(".")[0])
    if linear is None or linear.weight.name != extra.source or linear.copied_when_float:
        return OutputTensor(extra.name, entry.dtype, entry.shape, FLOAT, OutputKind.COPY, extra.source, entry.nbytes)
    n, k = linear.shape
    return OutputTensor(extra.name, "BF16", (n, k), FLOAT, OutputKind.RESOLVE, extra.source, 2 * n * k)


def assign_shards(tensors: list[OutputTensor], max_shard_size: int) -> tuple[list[OutputTensor], list[ShardPlan]]:
    """Fill shards in write order; cut before a tensor that would take a shard past the limit.

    An MX weight and its scale stay in one shard: they are produced together.
    """
    if max_shard_size == 0:
        return tensors, [ShardPlan(SINGLE_SHARD_NAME, list(tensors))]
    starts, units = [], []  # each unit's first tensor, and its bytes
    i, count = 0, len(tensors)
    while i < count:
        step = 2 if tensors[i].kind in MX_PAYLOADS else 1  # the weight and its scale
        starts.append(i)
        units.append(tensors[i].nbytes + (tensors[i + 1].nbytes if step == 2 else 0))
        i += step
    starts.append(count)
    cuts = shard_cuts(units, max_shard_size) + [len(units)]
    total = len(cuts) - 1
    shards = []
    for number in range(total):
        members = tensors[starts[cuts[number]] : starts[cuts[number + 1]]]
        for tensor in members:
            tensor.shard = number
        shards.append(ShardPlan(SHARD_NAME.format(number + 1, total), members))
    return tensors, shards


def shard_cuts(units: list[int], max_shard_size: int) -> list[int]:
    """Where each shard begins, as indices into `units` (the bytes of each unit, in write order):
    a shard takes units while they fit within the limit, and at least one. [0] when there is
    nothing to write (one empty shard)."""
    ends = list(itertools.accumulate(units, initial=0))  # ends[j]: bytes of units[:j]
    cuts, at = [0], 0
    while True:
        # the last unit that still fits: ends nondecreasing, so one search (at least one unit)
        at = max(at + 1, bisect.bisect_right(ends, ends[at] + max_shard_size) - 1)
        if at >= len(units):
            return cuts
        cuts.append(at)


def shard_contents(units: list[tuple[int, int, int]], max_shard_size: int) -> list[tuple[int, int]]:
    """(tensors, bytes) of each shard, cut where shard_cuts cuts the units one by one, from runs of
    equal units ((bytes of one, its tensors, how many), in write order), a run at a time: a shard
    takes units while they fit within the limit, and at least one. One empty shard when there is
    nothing to write."""
    shards = [[0, 0]]
    filled = 0  # units in the last shard
    for nbytes, tensors, count in units:
        while count:
            shard = shards[-1]
            if filled and shard[1] + nbytes > max_shard_size:
                shard = [0, 0]
                shards.append(shard)
                filled = 0
            fit = count if nbytes == 0 else (max_shard_size - shard[1]) // nbytes
            taken = min(count, max(fit, 1))
            shard[0] += taken * tensors
            shard[1] += taken * nbytes
            filled += taken
            count -= taken
    return [(tensors, nbytes) for tensors, nbytes in shards]


def unquantized_members(
    layout: list[tuple], linears: dict[str, SourceLinear], groups: dict[str, list[str]], rules: ModelRules,
    deployment: Deployment,
) -> dict[str, tuple[str, str]]:
    """Each group of source linears with a member the source does not quantize: the first such module
    and why. A `.weight` of no source linear (left float by the release, stored F64 or as integers,
    not 2-D) is copied as stored, FLOAT, and vllm-ascend loads a packed module or a MoE layer in one
    type: the group is written FLOAT with it (verify's packed_groups would refuse it mixed)."""
    found: dict[str, tuple[str, str]] = {}
    for name, entry, prefix, _ in layout:
        if prefix is not None or not name.endswith(".weight"):
            continue
        module = name[: -len(".weight")]
        if module in linears:  # a linear whose weight is stored under another name: the package writes that one
            continue
        group, _ = module_group(module, rules.routed_expert(module), rules, deployment)
        if group != module and group in groups and group not in found:
            found[group] = module, unquantized_reason(entry)
    return found


def expert_biases(linears: dict[str, SourceLinear], facts: dict[str, ModuleFacts]) -> dict[str, str]:
    """Each MoE layer whose routed experts carry biases, and the first such bias, in source order."""
    found: dict[str, str] = {}
    for prefix, linear in linears.items():
        if linear.bias is not None:
            fact = facts[prefix]
            if fact.routed and fact.group not in found:
                found[fact.group] = linear.bias.name
    return found


def unquantized_reason(entry: TensorEntry) -> str:
    """Why a source `.weight` is no linear ascendconv quantizes, in words."""
    stored = f"{entry.dtype} {list(entry.shape)}"
    if len(entry.shape) != 2 or 0 in entry.shape:
        return f"the source stores it {stored}, not a 2-D weight, so it stays FLOAT"
    if entry.dtype in FLOAT_DTYPES:
        return f"the source leaves it unquantized ({stored}), so it stays FLOAT"
    return f"the source stores it {stored}, a dtype ascendconv does not quantize, so it stays FLOAT"


def never_carried(name: str) -> bool:
    """A source file no package carries, and no one misses there: hidden, weights, the source's index."""
    return name.startswith(".") or name.lower().endswith(WEIGHT_FILE_SUFFIXES) or name in SKIPPED_FILES


def files_to_copy(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Top-level source files the package carries (configs, tokenizer, templates, code, docs), and
    the ones it leaves out although they are not weights, with why."""
    keep: list[str] = []
    skipped: dict[str, str] = {}
    for name in sorted(names):
        if never_carried(name):
            continue
        if written_by_package(name):
            skipped[name] = "the package writes a file of this name itself"
            continue
        keep.append(name)
    return keep, skipped


class Planner:
    """Plans for one source and deployment. The model's rules are applied to every source linear once;
    each `plan()` (inspect makes one per scheme) then only decides types, tensors and shards.

    `config` is the source's config.json: its model_type selects the rules in models.py.
    """

    @gc_paused()
    def __init__(
        self,
        tensors: dict[str, TensorEntry],
        linears: dict[str, SourceLinear],
        source_files: list[str],
        bytes_in: int,
        config: dict | None = None,
        deployment: Deployment | None = None,
        unsafe_files: dict[str, str] | None = None,
    ):
        self.tensors = tensors
        self.linears = linears
        self.copied_files, skipped = files_to_copy(source_files)
        unsafe = {name: why for name, why in (unsafe_files or {}).items() if not never_carried(name)}
        self.skipped_files = {**unsafe, **skipped}  # source file -> why it is not copied
        self.bytes_in = bytes_in
        self.rules = rules_for(config, tensors)
        self.deployment = deployment or Deployment()
        self.facts = module_facts(linears, self.rules, self.deployment)
        self.groups = group_members(self.facts)
        self.layout = source_layout(tensors, linears)
        self.unquantized = unquantized_members(self.layout, linears, self.groups, self.rules, self.deployment)
        heads = self.rules.mtp_heads(tensors)
        self.added, self.heads_left_out = (heads, []) if self.deployment.mtp_heads else ([], heads)
        self.heads_lacking = self.rules.mtp_heads_lacking(tensors)
        self.expert_biases = expert_biases(linears, self.facts)

    @classmethod
    def for_source(cls, source: Source, deployment: Deployment) -> Planner:
        """The planner of an opened source checkpoint (its headers, config and the files beside it)."""
        companions, unsafe = source.companion_files()
        shards = {h.path.name for h in source.headers}  # weights whatever their name (an index may omit the suffix)
        companions = [name for name in companions if name not in shards]
        return cls(
            source.tensors, source.linears, companions, source.total_bytes, source.config, deployment, unsafe_files=unsafe
        )

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
        groups = decide_groups(
            scheme, overrides or [], self.facts, self.groups, None if overrides else self.classes, self.unquantized
        )
        plan = Plan(
            scheme=scheme,
            scale_rule=scale_rule,
            resolve_dtype=resolve_dtype,
            max_shard_size=max_shard_size,
            groups=groups,
            figures=self.figures(groups, max_shard_size),
            # bound to `groups`, not to the plan: a plan that refers to itself outlives its last use
            # until a full collection (each one's placed tensors are a hundred MB at full scale)
            place=functools.partial(self.place, groups, max_shard_size),
            count_shards=functools.partial(self.count_shards, groups, max_shard_size),
            copied_files=list(self.copied_files),
            bytes_in=self.bytes_in,
            skipped_files=dict(self.skipped_files),
            rules=self.rules,
            deployment=self.deployment,
            facts=self.facts,
            unmatched_overrides=[
                f"{o.glob}={o.quant_type}" for o in overrides or [] if not any(fnmatch.fnmatchcase(m, o.glob) for m in self.linears)
            ],
            added=list(self.added),
            heads_left_out=list(self.heads_left_out),
            heads_lacking=list(self.heads_lacking),
            expert_biases=self.expert_biases,
        )
        return plan


    @functools.cached_property
    def classes(self) -> dict[str, MemberClasses]:
        """The groups' members by their facts, shared by every plan without overrides."""
        return member_classes(self.facts, self.groups)

    @functools.cached_property
    def _runs(self) -> list[tuple[str | None, dict[str, int], bool, int]]:
        """The layout's items for `figures`, as runs of consecutive items alike: (the group whose type
        decides their bytes (None: none does), {written type -> an item's bytes}, whether each is a
        linear's weight: two tensors, payload and scale, when written MX, how many). The routed
        experts of a MoE layer are one run or a few: per plan, figures work per run, not per item."""
        kinds: dict[tuple, tuple] = {}  # (group, sizes by value, linear) -> that kind, one object
        classes: dict[tuple, tuple] = {}  # what an item's sizes follow from -> its kind
        items = []  # each layout item's kind

        def kind(group: str | None, sizes: dict[str, int], linear: bool) -> tuple:
            # equal sizes are one kind whatever made them (an expert's down_proj and gate_proj)
            return kinds.setdefault((group, tuple(sizes.items()), linear), (group, sizes, linear))

        facts, linears = self.facts, self.linears
        for name, entry, prefix, bias_of in self.layout:
            if prefix is None:
                if bias_of is None:
                    key = ("copy", entry.nbytes)
                    if key not in classes:
                        classes[key] = kind(None, dict.fromkeys(QUANT_TYPES, entry.nbytes), False)
                else:  # an MX layer's bias is written F32
                    key = ("bias", facts[bias_of].group, entry.nbytes, entry.numel)
                    if key not in classes:
                        sizes = dict.fromkeys(QUANT_TYPES, 4 * entry.numel) | {FLOAT: entry.nbytes}
                        classes[key] = kind(key[1], sizes, False)
                items.append(classes[key])
                continue
            # a linear's sizes follow from its facts (shape, native type, group) and whether its FLOAT
            # bytes are the source's (its encoding says): found once per facts object and encoding
            # (the experts of a layer share a few)
            fact, linear = facts[prefix], linears[prefix]
            key = (id(fact), linear.encoding, entry.nbytes)
            found = classes.get(key)
            if found is None:
                n, k = fact.shape
                sizes = {FLOAT: entry.nbytes if linear.copied_when_float else 2 * n * k}
                for quant_type in QUANT_TYPES:
                    if quant_type != FLOAT:
                        made = mx_tensors(quant_type, n, k, fact.native)
                        sizes[quant_type] = made[2] + made[6]
                found = classes[key] = kind(fact.group, sizes, True)
            items.append(found)
        return [(group, sizes, linear, len(list(run))) for (group, sizes, linear), run in itertools.groupby(items)]

    @gc_paused()
    def place(self, groups: dict[str, GroupDecision], max_shard_size: int) -> tuple[list[OutputTensor], list[ShardPlan]]:
        """The package's tensors, in write order, and its shards."""
        written = {prefix: group.written for group in groups.values() for prefix in group.members}
        return assign_shards(output_tensors(self.tensors, self.linears, written, self.layout, self.added), max_shard_size)

    def figures(self, groups: dict[str, GroupDecision], max_shard_size: int) -> PlanFigures:
        """What `place` makes, counted: tensors per label, bytes and shards, from each run of layout
        items' sizes under its group's type (the branches of output_tensors, a unit per MX payload
        and its scale)."""
        units = self._units(groups)
        counts = dict.fromkeys(QUANT_TYPES, 0)
        for group in groups.values():
            if group.written != FLOAT:
                counts[group.written] += 2 * len(group.members)  # each MX linear: payload and scale
        counts[FLOAT] = sum(count for _, _, count in units) - sum(counts.values()) // 2
        shards = len(shard_contents(units, max_shard_size)) if max_shard_size else 1
        return PlanFigures(counts, sum(nbytes * count for nbytes, _, count in units), shards)

    def _units(self, groups: dict[str, GroupDecision]) -> list[tuple[int, int, int]]:
        """The units `assign_shards` places (an item, then each added tensor), as runs of equal ones:
        (bytes of one, its tensors, how many)."""
        written = {name: group.written for name, group in groups.items()}
        written[None] = FLOAT
        units = []
        for group, sizes, linear, count in self._runs:
            quant_type = written[group]
            units.append((sizes[quant_type], 2 if linear and quant_type != FLOAT else 1, count))
        units += [(added_tensor(extra, self.tensors, self.linears).nbytes, 1, 1) for extra in self.added]
        return units

    def count_shards(self, groups: dict[str, GroupDecision], max_shard_size: int) -> list[tuple[str, int, int]]:
        """(file, tensors, bytes) of each shard `place` would make, from the units alone."""
        units = self._units(groups)
        if max_shard_size == 0:
            tensors = sum(each * count for _, each, count in units)
            return [(SINGLE_SHARD_NAME, tensors, sum(nbytes * count for nbytes, _, count in units))]
        shards = shard_contents(units, max_shard_size)
        return [(SHARD_NAME.format(i + 1, len(shards)), tensors, nbytes) for i, (tensors, nbytes) in enumerate(shards)]


def make_plan(
    tensors: dict[str, TensorEntry],
    linears: dict[str, SourceLinear],
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
