"""The rules for one checkpoint, from its config.json and its family's entry. Pure: no I/O.

families.py holds what ascendconv knows about each model family (roots, expert spellings, packed
groups, tensor-parallel roles, MTP layout, modules kept FLOAT and why, tensors the runtime needs and
the release lacks); `rules_for(config)` picks the entry by `model_type` and adds what the config says
(layer count, MTP layers, tied embeddings), and the tensor names what config.json leaves out (MTP
layers it does not count). A `model_type` not listed gets the generic rules (every family's naming
at once, any `experts.N.<proj>` is a routed expert) and a warning.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

from ascendconv.errors import ConfigError, plural, shown
from ascendconv.families import (
    EMBEDDING_NAMES,
    EMBEDDING_REASON,
    FAMILIES,
    GATE_UP_DOWN,
    GENERIC,
    INDEXER_WK_REASON,
    KV_B_REASON,
    MTP_REASON,
    VISION_REASON,
    Family,
    HeadCopy,
)

__all__ = [
    "FAMILIES", "GATE_UP_DOWN", "GENERIC", "INDEXER_WK_REASON", "KV_B_REASON", "MTP_REASON", "VISION_REASON",
    "AddedTensor", "Family", "LackingHead", "ModelRules", "config_value", "expert_count", "model_type_of", "odd_expert_count",
    "rules_for",
]  # fmt: skip

ROUTED_MEMO_LIMIT = 2**20  # names remembered by routed_expert: past any checkpoint, bounded for a long-lived caller
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
MAX_LAYER_DIGITS = 9  # layer numbers beyond any model: int() of a huge digit string is never tried
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def config_value(config: dict, key: str):
    """A config.json field, from the top level or from text_config (multimodal wrappers)."""
    if key in config:
        return config[key]
    text = config.get("text_config")
    return text.get(key) if isinstance(text, dict) else None


def is_embedding(prefix: str) -> bool:
    """Whether the module is an input embedding, in any family's spelling (families.EMBEDDING_NAMES)."""
    return prefix.rpartition(".")[2] in EMBEDDING_NAMES


def heads_problem(config: dict, tp: int) -> tuple[str, str] | None:
    """Why vLLM refuses to run the model over `tp` ranks whatever its weights, and the fix, or None:
    its attention heads must divide evenly among them (vLLM's parallel-config check: "Total number of
    attention heads must be divisible by tensor parallel size")."""
    heads = config_value(config, "num_attention_heads")
    counted = type(heads) is int and heads > 0
    if counted and heads % tp:
        return (f"config.json: {plural(heads, 'attention head')} {'does' if heads == 1 else 'do'} not divide over {tp} ranks, "
                "and vLLM refuses such a deployment",
                "choose a --tp that divides the number of attention heads")
    if heads is not None and tp > 1 and not counted:  # absent: nothing to hold it to
        return (f"config.json: num_attention_heads is {shown(heads)}, not a count of heads: vLLM cannot split the model over {tp} ranks",
                "fix num_attention_heads in config.json")
    return None


def model_type_of(config: dict) -> str | None:
    value = config_value(config, "model_type")
    return value if isinstance(value, str) else None


def expert_count(config: dict) -> int | None:
    """Routed experts per MoE layer as config.json states it (DeepSeek n_routed_experts, Qwen
    num_experts, Mixtral/MiniMax num_local_experts): the one reading inspect, plan and verify share."""
    for key in EXPERT_COUNT_KEYS:
        value = config_value(config, key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def odd_expert_count(config: dict) -> str | None:
    """What is wrong with a routed-expert count config.json gives that is no integer ("4", 4.0,
    true), or None. expert_count passes over such a value, so nothing would hold the experts to it,
    while vLLM sizes each MoE layer by it and fails to load the model."""
    for key in EXPERT_COUNT_KEYS:
        value = config_value(config, key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)):
            return f"config.json's {key} is {shown(value)} ({type(value).__name__}), not a count of routed experts"
    return None


@dataclass(frozen=True)
class AddedTensor:
    """A tensor the package adds (families.HeadCopy made concrete): `name` is a copy of the source
    tensor `source`, labelled FLOAT (its bytes, or a quantized weight's values in BF16: plan.added_tensor)."""

    name: str
    source: str
    reason: str

    def to_dict(self) -> dict:
        return {"source": self.source, "reason": self.reason}


@dataclass(frozen=True)
class LackingHead:
    """A tensor the MTP drafter looks up that the source lacks and holds nothing to copy it from:
    none of `sources`; `untied_embedding`: the embedding it holds, not taken as the head because
    config.json does not set tie_word_embeddings."""

    name: str
    sources: tuple[str, ...]
    untied_embedding: str | None = None


@dataclass(frozen=True)
class ModelRules:
    """The rules for one checkpoint: its family's knowledge plus what its config says."""

    model_type: str | None
    family: Family
    num_hidden_layers: int | None
    mtp_layer_count: int | None  # DeepSeek's num_nextn_predict_layers (None if absent)
    # config.json's model_type where it is there but not a string: its value and type, as shown
    odd_model_type: str | None = None
    # layers from num_hidden_layers on holding the family's mtp_markers that mtp_layer_count leaves out
    undeclared_mtp_layers: tuple[int, ...] = ()
    # layers from num_hidden_layers on holding none of the mtp_markers: decoder layers it does not count
    uncounted_layers: tuple[int, ...] = ()
    tied_embeddings: bool = False  # tie_word_embeddings: the output head is the input embedding
    # the first layer number the source lacks between where vLLM numbers MTP layers from and an
    # undeclared one: no num_nextn_predict_layers makes vLLM build that one from the source's tensors
    mtp_gap: int | None = None

    @property
    def known(self) -> bool:
        return self.family is not GENERIC

    @property
    def warning(self) -> str | None:
        if self.known:
            return None
        if self.odd_model_type is not None:
            subject = f"config.json's model_type is {self.odd_model_type}, not a string naming a model family"
        elif self.model_type is None:
            subject = "config.json has no model_type"
        else:
            subject = f"model_type {shown(self.model_type)} is not one ascendconv knows"
        return (
            f"{subject}; generic rules apply (any "
            "experts.N.<proj> is a routed expert, q/k/v, gate/up and MLA q_a/kv_a stay packed, "
            "kv_b_proj and indexer.wk stay FLOAT); check the plan before deploying"
        )

    @property
    def layer_count_warning(self) -> str | None:
        """What to fix in config.json when the checkpoint holds layers it does not count: decoder
        layers past num_hidden_layers, or MTP layers past num_nextn_predict_layers."""
        if self.uncounted_layers:
            return self._uncounted_warning
        if not self.undeclared_mtp_layers:
            return None
        count = self.mtp_layer_count
        numbers = self.undeclared_mtp_layers
        # vLLM's MTP layers run from num_hidden_layers to the last one, a layer the source lacks included
        if self.num_hidden_layers is None:  # num_nextn_predict_layers counts from a layer the config lacks
            first = numbers[0]
            unstated = "config.json has no num_hidden_layers to number them from"
            fixes = [f'"num_hidden_layers": {first}']
            fixes += [f'"num_nextn_predict_layers": {numbers[-1] - first + 1}'] if count != numbers[-1] - first + 1 else []
        else:
            first = self.num_hidden_layers
            unstated = f"config.json does not declare them (num_nextn_predict_layers {'absent' if count is None else count})"
            fixes = [f'"num_nextn_predict_layers": {numbers[-1] - first + 1}']
        gap = "" if self.mtp_gap is None else (
            f"; the source holds no layer {self.mtp_gap}, which vLLM's MTP drafter then builds too (it numbers MTP "
            f"layers from {first} on, without a gap): the model loads, but speculative decoding with MTP will not "
            f"until the source's MTP layers are numbered from {first}"
        )
        return (
            f"{_layers_hold(numbers)} MTP tensors ({' / '.join(self.family.mtp_markers)}) and {unstated}: planned as MTP "
            "layers, FLOAT; vLLM finds MTP layers by num_hidden_layers and num_nextn_predict_layers, "
            f"so set {' and '.join(fixes)} in the package's config.json{gap}"
        )

    @property
    def _uncounted_warning(self) -> str:
        """Layers numbered from num_hidden_layers on with no MTP marker: decoder layers the config
        leaves out, or (numbered as MTP layers) MTP layers without what the drafter needs. The fix is
        num_hidden_layers, not what the MTP warning would ask of num_nextn_predict_layers, and the
        plan changes with it."""
        markers = " / ".join(self.family.mtp_markers)
        numbers = self.uncounted_layers
        as_mtp = tuple(n for n in numbers if n in self.mtp_layer_numbers)
        past = tuple(n for n in numbers if n not in as_mtp)
        said = []
        if as_mtp:
            said.append(
                f"{_layers_hold(as_mtp)} no MTP tensors ({markers}), which vLLM's MTP drafter needs, yet config.json "
                f"numbers {'it' if len(as_mtp) == 1 else 'them'} as MTP (num_hidden_layers {self.num_hidden_layers}, "
                f"num_nextn_predict_layers {self.mtp_layer_count}): planned as MTP, FLOAT, as vLLM reads that config"
            )
        if past:
            said.append(
                f"{_layers_hold(past)} no MTP tensors ({markers}) past config.json's num_hidden_layers "
                f"({self.num_hidden_layers}) and its MTP layers: {'a decoder layer' if len(past) == 1 else 'decoder layers'} "
                "it does not count, which vLLM has no place for (it builds num_hidden_layers decoder layers)"
            )
        decoder = numbers[-1] + 1
        mtp = sum(1 for n in self.mtp_layer_numbers if n >= decoder)
        fixes = [f'"num_hidden_layers": {decoder}']
        fixes += [f'"num_nextn_predict_layers": {mtp}'] if mtp != (self.mtp_layer_count or 0) else []
        return (
            f"{'; '.join(said)}; if {'it is a decoder layer' if len(numbers) == 1 else 'they are decoder layers'}, "
            f"set {' and '.join(fixes)} in the source's config.json and convert again"
        )

    @cached_property
    def _expert_projections(self) -> frozenset[str]:
        return frozenset(p for names in self.family.expert_projections for p in names)

    @cached_property
    def _shared(self) -> re.Pattern:
        names = "|".join(self.family.shared_expert_names) or "(?!)"
        return re.compile(rf"^(?P<layer>.+)\.(?:{names})\.(?P<proj>[^.]+)$")

    @cached_property
    def _packed(self) -> dict[str, str]:
        return {member: fused for members, fused in self.family.packed for member in members}

    @cached_property
    def mtp_layer_numbers(self) -> tuple[int, ...]:
        """The MTP layers numbered after the decoder: num_hidden_layers onwards, as many as
        num_nextn_predict_layers, and those the config leaves out (undeclared_mtp_layers)."""
        first = self.num_hidden_layers
        declared = range(first, first + (self.mtp_layer_count or 0)) if first is not None else ()
        return (*declared, *self.undeclared_mtp_layers)

    @cached_property
    def _mtp_layers(self) -> dict[str, str]:
        """Prefix ('model.layers.61.') -> label ('model.layers.61') of each MTP layer numbered after
        the decoder, under each root."""
        return {f"{root}layers.{i}.": f"{root}layers.{i}" for root in self.family.roots for i in self.mtp_layer_numbers}

    @cached_property
    def _mtp_match(self) -> re.Pattern | None:
        if not self._mtp_layers:
            return None
        return re.compile("|".join(re.escape(p) for p in sorted(self._mtp_layers, key=len, reverse=True)))

    @cached_property
    def expert_roles(self) -> dict[str, str]:
        """A routed expert's projection name -> gate_proj / up_proj / down_proj (expert_role of each)."""
        return {proj: GATE_UP_DOWN[i] for names in self.family.expert_projections for i, proj in enumerate(names)}

    @cached_property
    def _tp(self) -> dict[str, list[tuple[str, str]]]:
        """Last name -> (dotted ending, role), longest ending first."""
        table: dict[str, list[tuple[str, str]]] = {}
        for ending, role in self.family.tp:
            table.setdefault(ending.rpartition(".")[2], []).append(("." + ending, role))
        return {last: sorted(rows, key=lambda row: -len(row[0])) for last, rows in table.items()}

    def expert_role(self, proj: str) -> str:
        """A routed expert's projection as gate_proj / up_proj / down_proj, whatever the family names it."""
        return self.expert_roles[proj]

    @cached_property
    def _routed_memo(self) -> dict:
        return {}

    def routed_expert(self, prefix: str) -> dict[str, str] | None:
        """{'layer', 'expert', 'proj'} if `prefix` is a routed expert's projection
        (`<layer>.experts.<digits>.<proj>`), else None; the same (unchanged) dict for the same name.
        String operations, not a pattern, and remembered: a full-scale checkpoint's checks, planner
        and inspect ask this of each of its linears."""
        memo = self._routed_memo
        found = memo.get(prefix, memo)
        if found is not memo:
            return found
        head, _, proj = prefix.rpartition(".")
        found = None
        if proj in self._expert_projections:
            expert = self._expert_of(head)
            if expert is not None:
                found = {"layer": expert[0], "expert": expert[1], "proj": proj}
        if len(memo) < ROUTED_MEMO_LIMIT:
            memo[prefix] = found
        return found

    def routed_experts(self, prefixes: Iterable[str]) -> list[dict[str, str] | None]:
        """routed_expert of each of `prefixes`, in one loop: an expert's projections are listed
        together and share everything but the last segment, read once for all three. The names
        read are remembered together at the end, at C speed (a name listed twice in one call is
        read twice: equal dicts)."""
        prefixes = prefixes if isinstance(prefixes, (list, tuple, dict)) else list(prefixes)  # read twice
        memo = self._routed_memo
        projections = self._expert_projections
        found_all = []
        read = False  # whether a name was not remembered yet
        last_head = last = None  # the last expert module parsed, and its (layer, expert number) or None
        for prefix in prefixes:
            found = memo.get(prefix, memo)
            if found is memo:
                read = True
                head, _, proj = prefix.rpartition(".")
                found = None
                if proj in projections:
                    if head != last_head:
                        last_head, last = head, self._expert_of(head)
                    if last is not None:
                        found = {"layer": last[0], "expert": last[1], "proj": proj}
            found_all.append(found)
        room = ROUTED_MEMO_LIMIT - len(memo)
        if read and room > 0:  # (names already remembered count against the room: fewer are, no more)
            memo.update(itertools.islice(zip(prefixes, found_all), room))
        return found_all

    @staticmethod
    def _expert_of(head: str) -> tuple[str, str] | None:
        """(layer, expert number) of a routed expert's module (`<layer>.experts.<digits>`), else None."""
        block, _, expert = head.rpartition(".")
        if expert.isdecimal() and block.endswith(".experts") and len(block) > 8 and "\n" not in block:
            return block[:-8], expert
        return None

    def shared_expert_layer(self, prefix: str) -> str | None:
        """The MoE block (e.g. 'model.layers.3.mlp') whose shared expert `prefix` belongs to."""
        match = self._shared.match(prefix)
        return match["layer"] if match else None

    def missing_layers(self, names: Iterable[str], listed: int = 5) -> tuple[int, list[int]]:
        """How many of the decoder layers 0..num_hidden_layers-1 no name is under (by the family's
        roots), and the first `listed` of them. vLLM builds every one of those layers, and one that
        no tensor is loaded into runs on uninitialised weights. None are counted without a count in
        config.json, nor when no name is under the roots at all (layers spelled otherwise: a family
        not known by name, a checkpoint respelled in part). Work is bounded by the names, never by
        the count."""
        count = self.num_hidden_layers
        if not count:
            return 0, []
        roots = "|".join(re.escape(root) for root in self.family.roots)
        pattern = re.compile(rf"(?:{roots})layers\.(\d{{1,{MAX_LAYER_DIGITS}}})\.")
        present = {int(match[1]) for match in map(pattern.match, names) if match}
        if not present:
            return 0, []
        held = sum(1 for number in present if number < count)
        first = [number for number in range(min(count, held + listed)) if number not in present]
        return count - held, first[:listed]

    def is_mtp(self, prefix: str) -> bool:
        return self.mtp_label(prefix) is not None

    def mtp_label(self, name: str) -> str | None:
        """The MTP layer a tensor or module belongs to ('model.layers.61', 'mtp'), or None."""
        if self.family.mtp_prefix and name.startswith(self.family.mtp_prefix):
            return self.family.mtp_prefix.rstrip(".")
        match = self._mtp_match.match(name) if self._mtp_match else None
        return self._mtp_layers[match[0]] if match else None

    def packed_group(self, prefix: str) -> str:
        """The group a module's type is decided with: a whole MoE layer, a packed set, or itself."""
        routed = self.routed_expert(prefix)
        if routed:
            return routed["layer"] + ".experts"
        return self.fused_group(prefix)

    def fused_group(self, prefix: str) -> str:
        """The packed set a module that is no routed expert belongs to ('....qkv_proj'), or itself."""
        base, _, last = prefix.rpartition(".")
        fused = self._packed.get(last)
        return f"{base}.{fused}" if fused else prefix

    def indexer_of(self, prefix: str) -> str | None:
        """The attention module ('model.layers.3.self_attn') whose indexer `prefix` is or belongs to."""
        name = self.family.indexer
        if not name:
            return None
        head, sep, _ = prefix.partition(f".{name}.")
        if sep:
            return head
        return prefix[: -len(name) - 1] if prefix.endswith("." + name) else None

    def tp_role(self, prefix: str) -> str | None:
        """'row', 'column' or 'replicated': how vLLM splits the linear over tensor-parallel ranks."""
        dotted = "." + prefix
        for ending, role in self._tp.get(prefix.rpartition(".")[2], ()):
            if dotted.endswith(ending):
                return role
        return None

    def default_float(self, prefix: str, mtp: bool | None = None) -> str | None:
        """Why the module stays FLOAT unless overridden, or None (`mtp`: is_mtp(prefix), if known)."""
        if self.is_mtp(prefix) if mtp is None else mtp:
            return MTP_REASON
        if self.family.float_roots and prefix.startswith(self.family.float_roots):
            return VISION_REASON
        if is_embedding(prefix):
            return EMBEDDING_REASON
        for ending, reason in self.family.float_rules:
            if prefix.endswith(ending):
                return reason
        return None

    def mtp_heads(self, names) -> list[AddedTensor]:
        """The tensors the package adds for the MTP drafter (families.HeadCopy): each whose own name
        is not among `names`, whose MTP layer the source holds, and whose source tensor (with tied
        embeddings: or the embedding) is among `names`."""
        added = []
        for head, target in self._drafter_tensors_lacking(names):
            if head.source in names:
                added.append(AddedTensor(target, head.source, head.reason))
            elif self.tied_embeddings and head.tied_source in names:
                added.append(AddedTensor(target, head.tied_source, head.tied_reason))
        return added

    def mtp_heads_lacking(self, names) -> list[LackingHead]:
        """The drafter's tensors that the source lacks, in an MTP layer it holds, and that mtp_heads
        cannot add: nothing among `names` to copy them from."""
        lacking = []
        for head, target in self._drafter_tensors_lacking(names):
            tied = self.tied_embeddings and head.tied_source is not None
            if head.source in names or (tied and head.tied_source in names):
                continue
            untied = head.tied_source if not tied and head.tied_source in names else None
            lacking.append(LackingHead(target, (head.source, head.tied_source) if tied else (head.source,), untied))
        return lacking

    def _drafter_tensors_lacking(self, names) -> list[tuple[HeadCopy, str]]:
        """(copy rule, name) of each tensor of the family's mtp_heads the MTP layers of `names` lack."""
        if not self.family.mtp_heads:
            return []
        layers = {self.mtp_label(name) for name in names} - {None}
        found = []
        for head in self.family.mtp_heads:
            targets = [head.target]
            if "{n}" in head.target:
                targets = [head.target.format(n=i) for i in self.mtp_layer_numbers]
            found += [(head, target) for target in targets if target not in names and self.mtp_label(target) in layers]
        return found


def rules_for(config: dict | None, names: Iterable[str] = ()) -> ModelRules:
    """The rules of a checkpoint with this config.json and, when given, these tensor names (they
    show the MTP layers the config does not count)."""
    config = config or {}
    stated = config_value(config, "model_type")
    odd = None if stated is None or isinstance(stated, str) else f"{shown(stated)} ({type(stated).__name__})"
    model_type = model_type_of(config)
    num_hidden_layers = _layer_count(
        config, "num_hidden_layers", "decoder layers", "write it as an integer, the number of decoder layers (vLLM builds that many)"
    )
    mtp_layer_count = _layer_count(
        config, "num_nextn_predict_layers", "MTP layers", 'write it as an integer, e.g. "num_nextn_predict_layers": 1 (vLLM reads it as one)'
    )
    family = _BY_TYPE.get(model_type, GENERIC)
    undeclared, uncounted, gap = _layers_past_count(family, names, num_hidden_layers, mtp_layer_count)
    tied = config_value(config, "tie_word_embeddings") is True
    return _rules(model_type, num_hidden_layers, mtp_layer_count, odd, undeclared, uncounted, tied, gap)


def _layer_count(config: dict, key: str, layers: str, hint: str) -> int | None:
    """num_hidden_layers or num_nextn_predict_layers, None if absent. vLLM builds range(num_hidden_layers)
    decoder layers and its DeepSeek MTP model numbers its layers as range(num_hidden_layers,
    num_hidden_layers + num_nextn_predict_layers), so anything but a count fails there: refused here,
    naming it (passed over, the MTP layers would be numbered from no layer)."""
    value = config_value(config, key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise ConfigError(f"config.json's {key} is {shown(value)} ({type(value).__name__}), not a count of {layers}", hint)


def _layers_hold(numbers: tuple[int, ...]) -> str:
    return f"layer {numbers[0]} holds" if len(numbers) == 1 else f"layers {', '.join(map(str, numbers))} hold"


def _layers_past_count(
    family: Family, names: Iterable[str], first: int | None, declared: int | None
) -> tuple[tuple[int, ...], tuple[int, ...], int | None]:
    """The layers under the family's roots from num_hidden_layers on (any, if the config lacks it):
    those holding one of its mtp_markers past the num_nextn_predict_layers counted ones (undeclared
    MTP layers), and those holding none past the counted MTP layers or below a marked one (decoder
    layers the config does not count), found while layer numbers follow on from num_hidden_layers
    (or, without it, from the first undeclared MTP layer); and where they stop short of the last
    undeclared one, the first number missing (ModelRules.mtp_gap)."""
    names = names if isinstance(names, (list, tuple, dict)) else list(names)
    # most checkpoints have no name past their layers, nor one holding ".<marker>.": told at C speed
    # from their joined names (a third of matching each of Qwen3.5-397B's 189,042)
    joined = "\n" + "\n".join(names)
    marked: set[int] = set()
    if any(f".{marker}." in joined for marker in family.mtp_markers):
        roots = "|".join(re.escape(root) for root in family.roots)
        markers = "|".join(re.escape(marker) for marker in family.mtp_markers)
        pattern = re.compile(rf"(?:{roots})layers\.(\d{{1,{MAX_LAYER_DIGITS}}})\.(?:{markers})\.")
        marked = {int(match[1]) for match in map(pattern.match, names) if match}
    start = 0 if first is None else first + (declared or 0)
    undeclared = tuple(sorted(n for n in marked if n >= start))
    if first is None and not undeclared:
        return undeclared, (), None
    uncounted = []
    number = undeclared[0] if first is None else first
    last_marked = max(marked, default=-1)
    # most checkpoints hold no layer numbered `number`: one search says so for every root
    while f"layers.{number}." in joined and any(f"\n{root}layers.{number}." in joined for root in family.roots):
        # one numbered as MTP is a decoder layer only where an MTP layer follows it: without one it
        # may be an MTP layer stored without its markers
        if first is not None and number not in marked and (number >= start or number < last_marked):
            uncounted.append(number)
        number += 1
    return undeclared, tuple(uncounted), number if undeclared and number < undeclared[-1] else None


@lru_cache(maxsize=4)
def _rules(
    model_type: str | None,
    num_hidden_layers: int | None,
    mtp_layer_count: int | None,
    odd_model_type: str | None,
    undeclared_mtp_layers: tuple[int, ...],
    uncounted_layers: tuple[int, ...],
    tied_embeddings: bool,
    mtp_gap: int | None,
) -> ModelRules:
    """The rules are a function of these values: one object per checkpoint, so that the source's
    checks, the planner and inspect share its memo of names (`routed_expert`)."""
    family = _BY_TYPE.get(model_type, GENERIC)
    return ModelRules(
        model_type, family, num_hidden_layers, mtp_layer_count, odd_model_type, undeclared_mtp_layers, uncounted_layers,
        tied_embeddings, mtp_gap,
    )
