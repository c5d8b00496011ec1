"""inspect of a source checkpoint (any format of sources/): what it holds, and what `convert` would write
under each scheme (the pure planner run once per scheme) and what vllm-ascend would run with it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ascendconv.ascendv1 import QUANT_TYPES, RANK
from ascendconv.errors import plural
from ascendconv.formats.constants import FLOAT, W8A8_MXFP8
from ascendconv.inspect.report import CountBytes, Fallback, InspectReport, SchemeEstimate, ShardInfo, source_kind
from ascendconv.inspect.summary import (
    FP8_BLOCK,
    _by_bytes,
    _dtype_tally,
    _model_summary,
    _module_groups,
    _ordered,
    _rows,
    _structure,
    natural_key,
)
from ascendconv.sources import Encoding, Source, open_source
from ascendconv.sources.base import WEIGHT_SUFFIX, SourceLinear
from ascendconv.sources.checkpoint import INDEX_NAME as SOURCE_INDEX_NAME
from ascendconv.models import ModelRules, heads_problem
from ascendconv.decide import SCHEMES, Deployment, ModuleFacts, module_pattern
from ascendconv.plan import Plan, Planner

MX_SOURCE_LABELS = {Encoding.MX_E2M1: "MXFP4", Encoding.MX_E4M3: "MXFP8"}


def inspect_source(root: Path, glob: str | None, deployment: Deployment) -> InspectReport:
    source = open_source(root)  # named errors for every header-level problem
    try:
        estimates: dict[str, SchemeEstimate] = {}
        written: dict[str, dict[str, str]] = {}
        planner = Planner.for_source(source, deployment)
        shared = shared_experts(planner.groups, planner.rules)
        for scheme in SCHEMES:
            plan = planner.plan(scheme)
            written[scheme] = {name: group.written for name, group in plan.groups.items()}
            estimates[scheme] = SchemeEstimate(
                scheme=scheme,
                model_quant_type=plan.model_quant_type,
                modules=plan.type_counts(),
                tensors=plan.tensor_counts(),
                bytes_out=plan.bytes_out,
                shards=plan.figures.shards,
                fallbacks=[
                    Fallback(d.module, module_pattern(d.module), d.requested, d.written, d.reason)
                    for d in sorted(plan.fallbacks, key=lambda d: natural_key(d.module))
                ],
                kept_float=plan.kept_float(),
                runtime=runtime_notes(plan, shared),
            )
        rules = planner.rules  # with the MTP layers the names show
        linears = _linear_kinds(source.linears, rules, planner.facts)
        # a linear's tensors are named after it: the unpaired names and the linears name every module
        structure = _structure(source.unpaired, rules, linears.others, linears.routed_layers)
        index = SOURCE_INDEX_NAME if (root / SOURCE_INDEX_NAME).is_file() else None
        by_dtype = _dtype_tally(source.tensors)
        tensor_bytes = sum(tally.bytes for tally in by_dtype.values())
        heads = heads_problem(source.config, deployment.tp)
        return InspectReport(
            kind=source_kind(source.format),
            path=root,
            model=_model_summary(source.config),
            quantization={**source.quantization, "scale_dtypes": _scale_dtypes(linears.kinds)},
            package=None,
            shards=[ShardInfo(h.path.name, len(h.tensors), h.file_size) for h in source.headers],
            index=index,
            total_bytes=source.total_bytes,
            tensor_bytes=tensor_bytes,
            tensor_count=len(source.tensors),
            by_dtype=by_dtype,
            by_quant_type=_type_tally(linears.kinds, len(source.tensors), tensor_bytes),
            **structure.fields(),
            family=rules.family.label,
            deployment=deployment.to_dict(),
            warnings=[w for w in (rules.warning, heads[0] if heads else None) if w],
            fp8_linears=len(source.linears),
            groups=_module_groups(_source_patterns(linears.kinds, source), written),
            schemes=estimates,
            tensor_filter=glob,
            tensors=_rows(source.tensors, glob, _labels(source).__getitem__) if glob is not None else None,
        )
    finally:
        source.close()


def _labels(source: Source) -> _Labels:
    """Each linear's weight and scale by what they hold: block FP8, or (an MX source) MXFP4 / MXFP8."""
    return _Labels(
        (t.name, MX_SOURCE_LABELS.get(linear.encoding, FP8_BLOCK))
        for linear in source.linears.values() for t in (linear.weight, linear.scale) if t is not None
    )


@dataclass
class _LinearKinds:
    """A source's linears, from one pass over them (a full-scale source has 94,000, nearly all of
    them routed experts): `kinds` holds ((name key, decision group, encoding, weight dtype, scale
    dtype or None), [linears, bytes of their weights and scales, the first one's prefix]) pairs, the
    name key being a routed expert's projection (with its group, a MoE layer's, all of its name but
    the expert number, which its pattern stars) and any other linear's prefix; `routed_layers` holds
    each MoE layer's (a prefix of one of its routed experts, their expert numbers); `others`, the
    prefixes of the other linears."""

    kinds: list[tuple[tuple, list]]
    routed_layers: dict[str, tuple[str, set[str]]]
    others: list[str]


def _linear_kinds(linears: dict[str, SourceLinear], rules: ModelRules, facts: dict[str, ModuleFacts]) -> _LinearKinds:
    routed_kinds: dict[tuple, list] = {}
    other_kinds: dict[tuple, list] = {}
    # a routed expert's numbers by its decision group, its MoE layer's: one string for the layer's
    # every expert, its hash kept, where the layer is a string routed_expert makes for each name
    in_groups: dict[str, tuple[str, set[str]]] = {}
    others = []
    for (prefix, linear), expert in zip(linears.items(), rules.routed_experts(linears)):
        weight, scale = linear.weight, linear.scale
        group = facts[prefix].group
        if expert is None:
            others.append(prefix)
            kinds, name_key = other_kinds, prefix
        else:
            in_group = in_groups.get(group)
            if in_group is None:
                in_group = in_groups[group] = (prefix, set())
            in_group[1].add(expert["expert"])
            kinds, name_key = routed_kinds, expert["proj"]
        nbytes = weight.nbytes if scale is None else weight.nbytes + scale.nbytes
        key = (name_key, group, linear.encoding, weight.dtype, None if scale is None else scale.dtype)
        slot = kinds.get(key)
        if slot is None:
            kinds[key] = [1, nbytes, prefix]
        else:
            slot[0] += 1
            slot[1] += nbytes
    routed_layers: dict[str, tuple[str, set[str]]] = {}
    for prefix, numbers in in_groups.values():
        routed_layers.setdefault(rules.routed_expert(prefix)["layer"], (prefix, set()))[1].update(numbers)
    return _LinearKinds([*routed_kinds.items(), *other_kinds.items()], routed_layers, others)


def _source_patterns(kinds: list[tuple[tuple, list]], source: Source) -> dict[str, dict[tuple, int]]:
    """The source's modules by name pattern, tallied by (decision group, source type, dtype) for
    _module_groups: each linear by its weight (an MX source may store `weight_packed`; the package
    names it `.weight`), then every other module's 2-D-or-more weight, of no decision group."""
    patterns: dict[str, dict[tuple, int]] = {}

    def add(prefix: str, key: tuple, count: int) -> None:
        tally = patterns.setdefault(module_pattern(prefix), {})
        tally[key] = tally.get(key, 0) + count

    for (_, group, encoding, dtype, _), (count, _, prefix) in kinds:
        add(prefix, (group, MX_SOURCE_LABELS.get(encoding, FP8_BLOCK), dtype), count)
    for name in source.unpaired:
        entry = source.tensors[name]
        if name.endswith(WEIGHT_SUFFIX) and len(entry.shape) >= 2:
            prefix = name[: -len(WEIGHT_SUFFIX)]
            if prefix not in source.linears:
                add(prefix, (None, FLOAT, entry.dtype), 1)
    return patterns


def _scale_dtypes(kinds: list[tuple[tuple, list]]) -> dict[str, int]:
    """Linears per dtype of their scale, of those that have one."""
    counts: dict[str, int] = {}
    for (*_, scale_dtype), (count, *_) in kinds:
        if scale_dtype is not None:
            counts[scale_dtype] = counts.get(scale_dtype, 0) + count
    return _ordered(counts)


def _type_tally(kinds: list[tuple[tuple, list]], tensor_count: int, tensor_bytes: int) -> dict[str, CountBytes]:
    """Tensors and bytes per source quant type: each linear's weight and scale under its label
    (_labels), every other tensor FLOAT; counted over the linears, not the tensors."""
    table: dict[str, list[int]] = {}
    for (_, _, encoding, _, scale_dtype), (count, nbytes, _) in kinds:
        label = MX_SOURCE_LABELS.get(encoding, FP8_BLOCK)
        slot = table.get(label)
        if slot is None:
            slot = table[label] = [0, 0]
        slot[0] += count if scale_dtype is None else 2 * count
        slot[1] += nbytes
    labelled = [sum(slot[0] for slot in table.values()), sum(slot[1] for slot in table.values())]
    rest = [tensor_count - labelled[0], tensor_bytes - labelled[1]]
    if rest[0]:
        slot = table.setdefault(FLOAT, [0, 0])
        slot[0] += rest[0]
        slot[1] += rest[1]
    return _by_bytes(table)


class _Labels(dict):
    """Tensor name -> its source quant type; FLOAT for a tensor of no quantized linear."""

    def __missing__(self, name: str) -> str:
        return FLOAT


def runtime_notes(plan: Plan, shared: dict[str, str] | None = None) -> list[str]:
    """What vllm-ascend will run with the package this plan writes, in short sentences (`shared`:
    shared_experts of the plan's groups, when known)."""
    notes = []
    by_group: dict[str, str] = {name: group.written for name, group in plan.groups.items()}
    moe = Counter(t for g, t in by_group.items() if g.endswith(".experts"))
    if moe:
        types = ", ".join(f"{n} {t}" for t, n in sorted(moe.items(), key=lambda kv: -RANK[kv[0]]))
        notes.append(f"MoE layers: {types} (FLOAT experts run the unquantized fused MoE)")
    written: Counter = Counter()
    for group in plan.groups.values():
        written[group.written] += len(group.members)
    for quant_type in sorted(written, key=lambda t: -RANK[t]):
        if quant_type != FLOAT:
            notes.append(f"{quant_type} ({plural(written[quant_type], 'module')}): {QUANT_TYPES[quant_type].runtime}")
    if plan.rules.family.mla:
        # vllm-ascend enables the fused MLA prolog (VLLM_ASCEND_ENABLE_MLAPO) only where the layer's
        # fused_qkv_a_proj (q_a_proj + kv_a_proj_with_mqa) is W8A8 (MXFP8 on Ascend 950); elsewhere it
        # turns it off for that layer with a warning
        qkv_a = Counter(t for g, t in by_group.items() if g.endswith(".fused_qkv_a_proj"))
        off = sum(n for t, n in qkv_a.items() if t != W8A8_MXFP8)
        if qkv_a and off:
            kinds = "/".join(sorted({t for t in qkv_a if t != W8A8_MXFP8}))
            notes.append(
                f"fused MLA prolog (VLLM_ASCEND_ENABLE_MLAPO) off in {off} of {plural(sum(qkv_a.values()), 'layer')}: "
                f"q_a_proj/kv_a_proj_with_mqa are {kinds}, it needs W8A8_MXFP8"
            )
        elif qkv_a:
            notes.append("fused MLA prolog (VLLM_ASCEND_ENABLE_MLAPO) available: q_a_proj/kv_a_proj_with_mqa are W8A8_MXFP8")
    for reason, count in plan.kept_float().items():
        notes.append(f"{plural(count, 'module')} FLOAT: {reason}")
    mtp_quantized = plan.quantized_mtp_modules()
    if mtp_quantized:
        notes.append(f"{plural(mtp_quantized, 'MTP module')} quantized by --override: vllm-ascend expects the MTP layer FLOAT")
    if plan.fallbacks:
        notes.append(f"{plural(len(plan.fallbacks), 'fallback')} (see fallbacks), planned for --tp {plan.deployment.tp}"
                     + (" --ep" if plan.deployment.ep else ""))
    for added in plan.added:
        notes.append(f"adds {added.name}, a FLOAT copy of {added.source}: {added.reason}")
    notes += [w for w in plan.warnings if w != plan.rules.warning]  # drafter heads left out, --tp growth
    notes += plan.rules.family.runtime_notes
    mixed = _shared_vs_routed(plan, by_group, shared_experts({name: g.members for name, g in plan.groups.items()}, plan.rules) if shared is None else shared)
    if mixed:
        notes.append(
            f"{plural(mixed, 'MoE layer')} {'holds' if mixed == 1 else 'hold'} shared experts of another type than their routed experts: do not enable "
            "mix_placement, or convert with --shared-experts-as-routed"
        )
    return notes


def shared_experts(groups: dict[str, list[str]], rules: ModelRules) -> dict[str, str]:
    """Shared-expert modules decided apart from the routed experts -> their MoE block
    ('model.layers.3.mlp'), in the order of a plan's decisions (`groups`: decision group -> its
    members). The same for every scheme: inspect finds them once."""
    shared = {}
    for group, members in groups.items():
        if group.endswith(".experts"):  # a MoE layer's group: 'model.layers.3.mlp.experts'
            continue
        for module in members:
            layer = rules.shared_expert_layer(module)
            if layer is not None:
                shared[module] = layer
    return shared


def _shared_vs_routed(plan: Plan, by_group: dict[str, str], shared_layers: dict[str, str]) -> int:
    """MoE layers whose shared expert is written in another type than their routed experts."""
    routed = {group[: -len(".experts")]: t for group, t in by_group.items() if group.endswith(".experts")}
    shared = {layer: plan.groups[plan.facts[module].group].written for module, layer in shared_layers.items()}
    return sum(1 for layer, t in shared.items() if layer in routed and routed[layer] != t)
