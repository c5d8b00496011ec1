"""What every kind of directory is summarised by, from tensor headers and config.json alone: the
model, tensors and bytes per dtype and per quant type, the layer structure, module groups, rows."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from ascendconv.ascendv1 import RANK
from ascendconv.formats.constants import FLOAT
from ascendconv.inspect.report import CountBytes, ModuleGroup, TensorRow
from ascendconv.io.safetensors import TensorEntry
from ascendconv.sources.base import WEIGHT_SUFFIX
from ascendconv.models import ModelRules, expert_count, model_type_of
from ascendconv.decide import module_pattern

# Quant type of a source tensor: an F8_E4M3 weight and its weight_scale_inv are "FP8_BLOCK" (the
# package labels an MX weight and its scale alike), everything else is FLOAT.
FP8_BLOCK = "FP8_BLOCK"
UNDESCRIBED = "(undescribed)"  # a package tensor without an entry in the description

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def natural_key(text: str) -> tuple:
    """Sort key that puts layers.2 before layers.10."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text) if p)


def _model_summary(config: dict | None) -> dict:
    config = config or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    architectures = config.get("architectures")

    def pick(*keys):
        for source in (config, text):
            for key in keys:
                if isinstance(source.get(key), int):
                    return source[key]
        return None

    return {
        "model_type": model_type_of(config),
        "architectures": [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else [],
        "num_hidden_layers": pick("num_hidden_layers"),
        "num_experts": expert_count(config),
    }


def _tally(tensors: dict[str, TensorEntry], quant_type_of) -> tuple[dict[str, CountBytes], dict[str, CountBytes]]:
    by_type: dict[str, list[int]] = {}
    for name, entry in tensors.items():
        key = quant_type_of(name) or UNDESCRIBED
        slot = by_type.get(key)
        if slot is None:
            slot = by_type[key] = [0, 0]
        slot[0] += 1
        slot[1] += entry.nbytes
    return _dtype_tally(tensors), _by_bytes(by_type)


def _dtype_tally(tensors: dict[str, TensorEntry]) -> dict[str, CountBytes]:
    """Tensors and bytes per dtype."""
    by_dtype: dict[str, list[int]] = {}
    for entry in tensors.values():
        slot = by_dtype.get(entry.dtype)
        if slot is None:
            slot = by_dtype[entry.dtype] = [0, 0]
        slot[0] += 1
        slot[1] += entry.nbytes
    return _by_bytes(by_dtype)


def _by_bytes(table: dict[str, list[int]]) -> dict[str, CountBytes]:
    """[count, bytes] per key as CountBytes, most bytes first."""
    return {k: CountBytes(*table[k]) for k in sorted(table, key=lambda k: (-table[k][1], k))}


@dataclass
class _Structure:
    layers: int = 0
    moe_layers: int = 0
    routed_experts: int = 0
    shared_expert_layers: int = 0
    mtp_layers: list[str] = field(default_factory=list)
    indexer_layers: int = 0

    def fields(self) -> dict:
        return dict(self.__dict__)


def _structure(names, rules: ModelRules, modules=(), routed_layers=None) -> _Structure:
    """Layers, MoE layers, experts, MTP layers and indexers from tensor names, by the model's rules,
    and the prefixes of `modules` (whose tensors `names` may leave out). `routed_layers`: MoE layer ->
    (a routed expert's prefix in it, the expert numbers), routed experts already counted (a source's
    linears: inspect_source counts them in its one pass over them), which `modules` leaves out."""
    layers: set[str] = set()
    mtp: dict[str, None] = {}
    experts: dict[str, set[str]] = {}
    shared: set[str] = set()
    indexers: set[str] = set()

    def place(prefix: str) -> None:  # the MTP layer, or the decoder layer, that `prefix` is in
        mtp_label = rules.mtp_label(prefix)
        if mtp_label is not None:
            mtp[mtp_label] = None
        else:
            layer = _LAYER.search(prefix)
            if layer:
                layers.add(layer[1])

    # the layer and MTP label of `<layer>.experts.N.<proj>` are its layer's: one prefix says them
    for layer, (prefix, numbers) in (routed_layers or {}).items():
        experts[layer] = set(numbers)
        place(prefix)
    prefixes = {name.rpartition(".")[0] for name in names}  # a module's tensors share a prefix
    prefixes.update(modules)
    for prefix in prefixes:
        routed = rules.routed_expert(prefix)
        if routed:
            numbers = experts.get(routed["layer"])
            if numbers is not None:
                numbers.add(routed["expert"])
            else:
                experts[routed["layer"]] = {routed["expert"]}
                place(prefix)
            continue
        place(prefix)
        shared_in = rules.shared_expert_layer(prefix)
        if shared_in is not None:
            shared.add(shared_in)
        elif rules.indexer_of(prefix) is not None:
            indexers.add(rules.indexer_of(prefix))
    return _Structure(
        layers=len(layers),
        moe_layers=len(experts),
        routed_experts=max((len(e) for e in experts.values()), default=0),
        shared_expert_layers=len(shared),
        mtp_layers=sorted(mtp, key=natural_key),
        indexer_layers=len(indexers),
    )


def _module_weights(tensors: dict[str, TensorEntry]) -> dict[str, TensorEntry]:
    """Module prefix -> its weight, for every `.weight` of two or more dimensions."""
    return {
        name[: -len(WEIGHT_SUFFIX)]: entry
        for name, entry in tensors.items()
        if name.endswith(WEIGHT_SUFFIX) and len(entry.shape) >= 2
    }


def _groups(modules: dict[str, TensorEntry], type_of) -> list[ModuleGroup]:
    """Modules by name pattern: counts per type and dtype."""
    patterns: dict[str, dict[tuple, int]] = {}
    for prefix, entry in modules.items():
        pattern = module_pattern(prefix)
        tally = patterns.get(pattern)
        if tally is None:
            tally = patterns[pattern] = {}
        key = (None, type_of(prefix) or UNDESCRIBED, entry.dtype)
        tally[key] = tally.get(key, 0) + 1
    return _module_groups(patterns)


def _module_groups(
    patterns: dict[str, dict[tuple, int]], scheme_types: dict[str, dict[str, str]] | None = None
) -> list[ModuleGroup]:
    """A ModuleGroup per name pattern from its modules tallied by (decision group, type, dtype), and
    with `scheme_types` (scheme -> decision group -> written type) per scheme; a module of no
    decision group (None) is FLOAT under every scheme. 100,000 modules, each of seven schemes, fall
    into a few thousand tallies."""
    groups = []
    for pattern in sorted(patterns, key=natural_key):
        tally = patterns[pattern]
        types: dict[str, int] = {}
        dtypes: dict[str, int] = {}
        decided: dict[str | None, int] = {}
        for (group, quant_type, dtype), count in tally.items():
            types[quant_type] = types.get(quant_type, 0) + count
            dtypes[dtype] = dtypes.get(dtype, 0) + count
            decided[group] = decided.get(group, 0) + count
        schemes = None
        if scheme_types is not None:
            schemes = {}
            for scheme, written in scheme_types.items():
                counts: dict[str, int] = {}
                for group, count in decided.items():
                    quant_type = FLOAT if group is None else written[group]
                    counts[quant_type] = counts.get(quant_type, 0) + count
                schemes[scheme] = _ordered(counts)
        groups.append(ModuleGroup(pattern, sum(types.values()), _ordered(types), _ordered(dtypes), schemes))
    return groups


def _ordered(counts: dict[str, int]) -> dict[str, int]:
    """Counts by type, in the order of the types' ranks."""
    return {k: counts[k] for k in sorted(counts, key=lambda k: (RANK.get(k, -1), k))}


def _rows(tensors: dict[str, TensorEntry], glob: str | None, quant_type_of) -> list[TensorRow] | None:
    if glob is None:
        return None
    names = sorted((n for n in tensors if fnmatch.fnmatchcase(n, glob)), key=natural_key)
    return [
        TensorRow(n, tensors[n].dtype, tensors[n].shape, quant_type_of(n), tensors[n].path.name, tensors[n].nbytes)
        for n in names
    ]
