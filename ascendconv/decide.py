"""Pure: which quant type each source linear is written in, and why.

From the user's choices (scheme, --override, the deployment: --tp, --ep, --shared-experts-as-routed)
and the model's rules (models.py), each source linear gets the type it asked for or the first one down
the fallback chain whose K rule it meets; a group decided together (a MoE layer, a packed module)
takes the lowest type any member needs. `plan.py` builds the package's tensors and shards on top.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from ascendconv.ascendv1 import QUANT_TYPES, RANK, SCHEME_ROWS, SCHEME_TABLE
from ascendconv.errors import BadOptionError
from ascendconv.formats.constants import FLOAT
from ascendconv.models import EMBEDDING_REASON, ModelRules, rules_for

if TYPE_CHECKING:  # an annotation only: the CLI imports this module and need not load the source reader
    from ascendconv.sources import SourceLinear


# The --scheme choices, built from the scheme rows (ascendv1.SCHEME_ROWS): a member per row.
Scheme = Enum("Scheme", {row.name.upper().replace("-", "_"): row.name for row in SCHEME_ROWS}, type=str)
Scheme.__doc__ = "What convert writes: one member per row of ascendv1.SCHEME_ROWS."

SCHEMES = tuple(row.name for row in SCHEME_ROWS)
SCHEME_REASONS = {scheme: f"scheme {scheme}" for scheme in SCHEMES}


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
    routed experts' tensor). mtp_heads: the package carries the tensors vllm-ascend's MTP drafter
    looks up and the release lacks (models.ModelRules.mtp_heads), as FLOAT copies.
    """

    tp: int = 1
    ep: bool = False
    shared_experts_as_routed: bool = False
    mtp_heads: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.tp, int) or self.tp < 1:
            raise BadOptionError(f"--tp {self.tp}: the tensor-parallel size must be at least 1")

    def to_dict(self) -> dict:
        return {
            "tp": self.tp,
            "ep": self.ep,
            "shared_experts_as_routed": self.shared_experts_as_routed,
            "mtp_heads": self.mtp_heads,
        }


def packed_group(prefix: str, rules: ModelRules = GENERIC_RULES) -> str:
    """The group a module's type is decided with: a whole MoE layer, a packed set, or itself."""
    return rules.packed_group(prefix)


NUMBERED_SEGMENT = re.compile(r"(?<=\.)\d+(?=\.|$)")


_PATTERN_HEADS: dict[str, str] = {}  # module name -> its pattern and a dot
PATTERN_MEMO_LIMIT = 2**20  # names remembered: past any checkpoint, bounded for a long-lived caller
_PATTERN_DEPTH = 64  # segments read one by one; a deeper (hand-made) name takes the pattern at once


def module_pattern(name: str) -> str:
    """A module name with its layer and expert numbers (every numeric segment) replaced by '*'.
    Segment by segment from the end, each leading part's pattern remembered: the projections of an
    expert, and the experts of a layer, share theirs (a full-scale checkpoint has a hundred
    thousand modules)."""
    base, _, last = name.rpartition(".")
    if not base or "\n" in name or name.count(".") > _PATTERN_DEPTH:  # `$` of the pattern sees a newline apart
        return NUMBERED_SEGMENT.sub("*", name)
    head = _PATTERN_HEADS.get(base)
    if head is None:
        head = module_pattern(base) + "."
        if len(_PATTERN_HEADS) < PATTERN_MEMO_LIMIT:
            _PATTERN_HEADS[base] = head
    return head + ("*" if last.isdecimal() else last)


def requested_type(
    prefix: str, scheme: str, overrides: list[Override], kept_float: str | None = None, routed: bool = False,
    native: str | None = None,
) -> tuple[str, str]:
    """The type the user asked for and where that came from (`kept_float`: why the model's rules
    keep the module FLOAT, if they do; `native`: the type an MX source linear's bytes already are)."""
    if kept_float:
        wanted, why = FLOAT, kept_float
    elif native and SCHEME_TABLE[scheme].native:
        wanted, why = native, f"scheme {scheme}: the source is {native}"
    else:
        wanted, why = SCHEME_TABLE[scheme].requested(routed), SCHEME_REASONS[scheme]
    for override in overrides:
        if fnmatch.fnmatchcase(prefix, override.glob):
            wanted, why = override.quant_type, f"--override {override.glob}={override.quant_type}"
    if QUANT_TYPES[wanted].k_multiple(routed) is None:  # only an override asks for that
        raise BadOptionError(
            f"{why} would write {prefix} as {wanted}: {QUANT_TYPES[wanted].k_problem(0, routed)}",
            "narrow the GLOB to routed experts (e.g. '*.mlp.experts.*'), or choose another TYPE",
        )
    return wanted, why


def alignment_problem(quant_type: str, k: int, routed: bool, k_label: str | None = None) -> str | None:
    """Why a weight with reduction size K (per rank) cannot take `quant_type`, or None if it can."""
    return QUANT_TYPES[quant_type].k_problem(k, routed, k_label)


def rank_k(
    prefix: str, k: int, routed: bool, deployment: Deployment, rules: ModelRules = GENERIC_RULES
) -> tuple[int | None, str]:
    """K as one rank sees it (None if K does not split) and how to say it.

    Row-parallel linears split K over the tensor-parallel ranks; with expert parallelism routed
    experts are placed whole, so they keep their K.
    """
    tp = deployment.tp
    if tp == 1 or rules.tp_role(prefix) != "row" or (routed and deployment.ep):
        return k, f"K={k}"
    if k % tp:
        return None, f"K={k} does not split over --tp {tp} ranks"
    return k // tp, f"K/T = {k}/{tp} = {k // tp}"


@functools.lru_cache(maxsize=4096)  # few distinct (type, K) pairs in a checkpoint, met thousands of times
def best_feasible(requested: str, k: int | None, routed: bool, k_label: str | None = None) -> tuple[str, str | None]:
    """Walk the requested type's fallback chain (e.g. W4A4_MXFP4 -> W4A8_MXFP -> W8A8_MXFP8 -> FLOAT)
    down to the first type that fits; the reason is why the requested type did not."""
    if k is None:
        return FLOAT, None if requested == FLOAT else k_label
    first_reason = None
    for quant_type in QUANT_TYPES[requested].chain():
        problem = alignment_problem(quant_type, k, routed, k_label)
        if problem is None:
            return quant_type, first_reason
        first_reason = first_reason or problem
    raise AssertionError("FLOAT always fits")


def common_type(lowest: str, members: list[tuple[int | None, bool, str | None]]) -> str:
    """The type a group takes: from the lowest type any member fits, down its chain to the first one
    every member (K per rank, routed, K label) fits. Chains differ in their K rules (W4A16_MXFP4
    experts need K % 32, W8A8_MXFP8 experts K % 64), so one member's fit is not everyone's."""
    for quant_type in QUANT_TYPES[lowest].chain():
        if all(best_feasible(quant_type, k, routed, label)[0] == quant_type for k, routed, label in members):
            return quant_type
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
    """What the model's rules and the deployment say about one source linear, whatever the scheme."""

    group: str  # decided together: a MoE layer ('....experts'), a fused module, or itself
    routed: bool  # a routed expert (or a shared one placed with them): the MoE kernels' K rule
    kept_float: str | None  # why the model's rules keep it FLOAT, if they do
    mtp: bool  # in a multi-token-prediction layer
    k: int | None  # K as one rank sees it (None: K does not split over the ranks)
    k_label: str  # how to say K in a reason
    shape: tuple[int, int] = (0, 0)  # [N, K] of the linear's values (SourceLinear.shape)
    native: str | None = None  # the type an MX source linear already is (sources/base.py)


def module_group(
    prefix: str, expert: dict[str, str] | None, rules: ModelRules, deployment: Deployment
) -> tuple[str, bool]:
    """The group a module is decided with, and whether it takes the routed experts' rules
    (`expert`: rules.routed_expert(prefix))."""
    if expert is not None:
        return expert["layer"] + ".experts", True
    if deployment.shared_experts_as_routed:
        shared_in = rules.shared_expert_layer(prefix)
        if shared_in is not None:  # loaded into the routed experts' tensor: one of them
            return shared_in + ".experts", True
    return rules.fused_group(prefix), False


def module_facts(
    linears: dict[str, SourceLinear], rules: ModelRules = GENERIC_RULES, deployment: Deployment = Deployment()
) -> dict[str, ModuleFacts]:
    """Each source linear's facts. Equal facts are one object (the experts of a MoE layer share a few),
    so that decide_modules decides each distinct one once."""
    found: list[ModuleFacts] = []  # each linear's, in order: made into the dict at C speed at the end
    interned: dict[tuple, ModuleFacts] = {}
    # A routed expert's facts are its layer's, projection's and weight's: every rule reads a name's
    # start (roots, MTP layers) or its ending (tp roles, FLOAT rules, none of which holds a number),
    # never the expert number. One lookup, then, for all but the first expert of each.
    routed_facts: dict[tuple, ModuleFacts] = {}
    for (prefix, linear), expert in zip(linears.items(), rules.routed_experts(linears)):
        if expert is not None:
            same = (expert["layer"], expert["proj"], linear.weight.shape, linear.encoding)
            fact = routed_facts.get(same)
            if fact is not None:
                found.append(fact)
                continue
        group, routed = module_group(prefix, expert, rules, deployment)
        shape = linear.shape
        k, k_label = rank_k(prefix, shape[1], routed, deployment, rules)
        mtp = rules.is_mtp(prefix)
        key = (group, routed, rules.default_float(prefix, mtp), mtp, k, k_label, shape, linear.native)
        fact = interned.get(key)
        if fact is None:
            fact = interned[key] = ModuleFacts(*key)
        found.append(fact)
        if expert is not None:  # not a shared expert placed with them: `same` is a routed expert's
            routed_facts[same] = fact
    return dict(zip(linears, found))


def group_members(facts: dict[str, ModuleFacts]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for prefix, fact in facts.items():
        groups.setdefault(fact.group, []).append(prefix)
    return groups


@dataclass(slots=True)
class GroupDecision:
    """A group's decision: its one written type, and each member's (requested type, reason), kept
    once per distinct outcome (`keys[i]` is member i's key into `outcomes`)."""

    written: str
    members: list[str]
    keys: list
    outcomes: dict  # key -> (requested, reason)
    mtp: int = 0  # members in a multi-token-prediction layer

    def counts(self) -> dict:
        """Members per outcome key."""
        if len(self.outcomes) == 1:
            return dict.fromkeys(self.outcomes, len(self.keys))
        return Counter(self.keys)


@dataclass(slots=True)
class MemberClasses:
    """A group's members by their facts, whatever the scheme (inspect decides seven schemes over the
    same groups): member i's key (its facts object's id: equal facts are one object, see
    module_facts), the first member of each key, and the distinct (K per rank, routed, K label)."""

    members: list[str]
    keys: list
    firsts: dict  # key -> index of its first member
    fits: list[tuple]
    mtp: int  # members in a multi-token-prediction layer


def member_classes(
    facts: dict[str, ModuleFacts], groups: dict[str, list[str]], each_alone: bool = False
) -> dict[str, MemberClasses]:
    """Each group's MemberClasses; `each_alone`: every member its own key (its name), as overrides,
    which may single out any member, need."""
    classes = {}
    for group, members in groups.items():
        member_facts = [facts[prefix] for prefix in members]
        keys = members if each_alone else list(map(id, member_facts))
        firsts: dict = {}
        for i, key in enumerate(keys):
            if key not in firsts:
                firsts[key] = i
        fits = list(dict.fromkeys((member_facts[i].k, member_facts[i].routed, member_facts[i].k_label) for i in firsts.values()))
        classes[group] = MemberClasses(members, keys, firsts, fits, sum(fact.mtp for fact in member_facts))
    return classes


def decide_groups(
    scheme: str,
    overrides: list[Override],
    facts: dict[str, ModuleFacts],
    groups: dict[str, list[str]],
    classes: dict[str, MemberClasses] | None = None,
    unquantized: dict[str, tuple[str, str]] | None = None,
) -> dict[str, GroupDecision]:
    """Every group's written type and each member's outcome: what decide_modules spells out per
    module. `classes`: member_classes(facts, groups), when known. `unquantized`: group -> (module,
    why) of a member the source does not quantize (plan.unquantized_members): it is written FLOAT as
    stored, so its group is FLOAT too, and an --override asking otherwise is refused."""
    if scheme not in SCHEMES:
        raise BadOptionError(f"unknown scheme {scheme!r}", f"choose one of {', '.join(SCHEMES)}")
    if overrides or classes is None:
        classes = member_classes(facts, groups, each_alone=bool(overrides))
    decided: dict[str, GroupDecision] = {}
    for group, members in groups.items():
        shape = classes[group]
        # what a linear asks for and fits depends on its facts alone (and on the overrides, which
        # make every member its own key): decided once per key, for its first member
        asked: dict[object, tuple[tuple[str, str], tuple[str, str | None]]] = {}  # key -> (want, fit)
        for key, i in shape.firsts.items():
            fact = facts[members[i]]
            want = requested_type(members[i], scheme, overrides, fact.kept_float, fact.routed, fact.native)
            if want[0] != FLOAT and fact.kept_float == EMBEDDING_REASON:  # only an --override asks it
                raise BadOptionError(
                    f"{want[1]} would write {members[i]} as {want[0]}, but it is an input embedding: vLLM looks "
                    "its rows up, and vllm-ascend has no MX embedding lookup, so the package would not load",
                    "narrow the GLOB to leave the embedding FLOAT",
                )
            asked[key] = want, best_feasible(want[0], fact.k, fact.routed, fact.k_label)
        lowest = min((fit[0] for _, fit in asked.values()), key=RANK.__getitem__)
        group_type = common_type(lowest, shape.fits)
        held = unquantized.get(group) if unquantized else None  # (module, why): the group is FLOAT
        if held is not None:
            refuse_forced_members(group, held, asked, overrides)
            group_type = FLOAT
        at = min((shape.firsts[key] for key, (_, fit) in asked.items() if fit[0] == group_type), default=None)
        if at is None:  # no member fits the group's type on its own: the one that set `lowest` led there
            at = min(shape.firsts[key] for key, (_, fit) in asked.items() if fit[0] == lowest)
        limiting = members[at]
        limiting_want, limiting_fit = asked[shape.keys[at]]
        # vllm-ascend reads a MoE layer's type from its first expert and a fused module's from one
        # member: the whole group takes the lowest type any member needs
        joined = joined_with(group, limiting)
        outcomes = {}
        for key, ((requested, why), (fit_type, fit_reason)) in asked.items():
            if group_type == requested:
                reason = why
            elif fit_type == group_type and fit_reason:
                reason = fit_reason
            elif held is not None:
                reason = f"{joined_with(group, held[0])}: {held[1]}"
            elif limiting_fit[1]:
                reason = f"{joined}: {limiting_fit[1]}"
            else:
                reason = f"{joined} was requested as {limiting_want[0]} ({limiting_want[1]})"
            outcomes[key] = requested, reason
        decided[group] = GroupDecision(group_type, members, shape.keys, outcomes, shape.mtp)
    return decided


def joined_with(group: str, member: str) -> str:
    """How a reason names the member that set its group's type."""
    if group.endswith(".experts"):
        return f"one type per MoE layer; {member[len(group) - len('experts'):]}"
    return f"packed with {member}"


def refuse_forced_members(group: str, held: tuple[str, str], asked: dict, overrides: list[Override]) -> None:
    """An --override that asks an MX type of a member of a group that must stay FLOAT (`held`: the
    member the source does not quantize, and why) is refused: the package it asks for mixes types,
    and vllm-ascend refuses it. With overrides every member is its own key (member_classes)."""
    for member, ((wanted, why), _) in asked.items():
        if wanted != FLOAT and any(fnmatch.fnmatchcase(member, o.glob) for o in overrides):
            kind = "MoE layer" if group.endswith(".experts") else "packed module"
            raise BadOptionError(
                f"{why} would write {member} as {wanted}, but the {kind} {group} holds {held[0]}: {held[1]}; "
                f"vllm-ascend loads a {kind} in one type",
                f"narrow the GLOB to leave {group} FLOAT, or quantize {held[0]} in the source",
            )


def module_decisions(decided: dict[str, GroupDecision], facts: dict[str, ModuleFacts]) -> dict[str, ModuleDecision]:
    """Every member of every group as its ModuleDecision, in group order."""
    decisions: dict[str, ModuleDecision] = {}
    for group, decision in decided.items():
        written, outcomes = decision.written, decision.outcomes
        for prefix, key in zip(decision.members, decision.keys):
            requested, reason = outcomes[key]
            decisions[prefix] = ModuleDecision(prefix, group, facts[prefix].shape, requested, written, reason)
    return decisions


def decide_modules(
    linears: dict[str, SourceLinear],
    scheme: str,
    overrides: list[Override],
    facts: dict[str, ModuleFacts] | None = None,
    groups: dict[str, list[str]] | None = None,
) -> dict[str, ModuleDecision]:
    """Every source linear's written type and why. `facts` and `groups` (module_facts, group_members)
    are computed here unless given."""
    facts = facts if facts is not None else module_facts(linears)
    groups = groups if groups is not None else group_members(facts)
    return module_decisions(decide_groups(scheme, overrides, facts, groups), facts)
