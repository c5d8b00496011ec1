"""Structural checks: files, config, description, headers, index, coverage, dtypes, shapes, pairs,
alignment, packed groups and tensor parallelism, from the headers and JSON files alone."""

from __future__ import annotations

from collections import Counter

from ascendconv.ascendv1 import (
    DESCRIPTION_NAME,
    INDEX_NAME,
    PROVENANCE_NAME,
    MX_TYPES,
    QUANT_TYPES,
    RANK,
    SHARD_NAME,
    SHARD_PATTERN,
    SINGLE_SHARD_NAME,
    quant_type_named,
)
from ascendconv.errors import json_kind, plural, shown
from ascendconv.formats.constants import FLOAT
from ascendconv.io.package import field_shown
from ascendconv.io.rules import BLOCK_FP8_SCALE_SUFFIX, moe_coverage_problems
from ascendconv.decide import (
    Deployment,
    alignment_problem,
    packed_group,
    rank_k,
)
from ascendconv.models import ModelRules, config_value, heads_problem, is_embedding
from ascendconv.verify.checks import make_check, skip_check
from ascendconv.verify.layout import FLOAT_DTYPES, _Layout
from ascendconv.verify.report import Check


FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")

# Tensor parallelism: the family's roles (ModelRules.tp_role) say how vLLM splits each linear.
# Row-parallel linears split K (the type's K rule applies to K/T, as the plan checks it);
# column-parallel ones split N (N/T must be whole). Routed experts split like a dense MLP under plain TP, and not at all with --ep.
KV_HEAD_PROJECTIONS = ("k_proj", "v_proj")  # replicated instead of split when kv heads < T


MAX_HOLES_LISTED = 20


def _numbering_holes(have: set[int], total: int, present: set[str]) -> list[str]:
    """The numbers 1..total neither indexed nor present, found gap by gap (the total comes from a
    file name, and may be 10**12): the first MAX_HOLES_LISTED named, the rest counted."""
    indexed = sorted(n for n in have if 1 <= n <= total)
    numbered = (SHARD_PATTERN.match(f) for f in present)
    unindexed_present = sum(1 for m in numbered if m and int(m[2]) == total and 1 <= int(m[1]) <= total and int(m[1]) not in have)
    absent = total - len(indexed) - unindexed_present
    listed: list[str] = []
    previous = 0
    for number in [*indexed, total + 1]:
        for hole in range(previous + 1, number):
            if len(listed) == MAX_HOLES_LISTED:
                break
            if SHARD_NAME.format(hole, total) not in present:
                listed.append(f"shard numbering has a hole: {SHARD_NAME.format(hole, total)} is neither indexed nor present")
        previous = number
    if absent > len(listed):
        listed.append(f"and {plural(absent - len(listed), 'more hole')} in the numbering of {total} shards")
    return listed


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
    users = Counter(lay.pkg.weight_map.values()) if lay.missing else Counter()
    for missing in lay.missing:
        if lay.index is not None:
            problems.append(f"shard {missing} is named by {INDEX_NAME} for {plural(users[missing], 'tensor')} but is missing")
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
            problems += _numbering_holes({number for number, _ in numbers}, total, set(lay.present))
        elif len(totals) > 1:
            problems.append(f"shards disagree on their count: {', '.join(lay.expected)}")
    for other in sorted(p.name for p in lay.root.glob("*.safetensors.index.json") if p.name != INDEX_NAME):
        problems.append(
            f"stray index {other}: vLLM chooses the shards it loads from a *.safetensors.index.json, and this one is "
            "not the package's"
        )
    if not (lay.root / "config.json").is_file():
        problems.append("config.json is missing: vLLM cannot build the model")
    return make_check("files", problems, f"{plural(len(lay.expected), 'shard')}, no stray *.safetensors")


def check_config(lay: _Layout) -> Check:
    config = lay.pkg.config
    if config is None:
        return skip_check("config", "no config.json (reported by files)")
    problems = []
    # vLLM reads the quantization from either key (compression_config is the name it falls back to)
    for key in ("quantization_config", "compression_config"):
        if key in config:
            problems.append(f"config.json keeps {key}: vLLM would take the FP8 path or refuse the model")
        text = config.get("text_config")
        if isinstance(text, dict) and key in text:
            problems.append(f"config.json keeps text_config.{key}: vLLM would take the FP8 path")
    return make_check("config", problems, "config.json has no quantization_config or compression_config")


def check_description(lay: _Layout) -> Check:
    problems = [f"{DESCRIPTION_NAME}: {problem}" for problem in lay.pkg.field_problems()]
    problems += lay.pkg.unknown_types()
    labels = []
    for name, label in sorted(lay.description.items()):
        if quant_type_named(label) is None:
            continue  # among the unknown types
        labels.append(label)
        if label in MX_TYPES and not (name.endswith(".weight") or name.endswith(".weight_scale")):
            problems.append(f"{shown(name)} is labelled {label}, but only P.weight and P.weight_scale carry MX types")
        elif label in MX_TYPES and name.endswith(".weight") and is_embedding(name[: -len(".weight")]):
            problems.append(f"{shown(name)} is labelled {label}: an input embedding, whose rows vLLM looks up, "
                            "and vllm-ascend has no MX embedding lookup (convert writes it FLOAT)")
    for old, package in lay.rules.family.module_renames:
        stale = sorted(name for name in lay.description if old in name)
        if stale:
            named = f"{shown(stale[0])} and {len(stale) - 1} more are" if len(stale) > 1 else f"{shown(stale[0])} is"
            problems.append(
                f"{named} spelled with {old!r}: vllm-ascend looks {lay.rules.family.label} modules up with "
                f"{package!r} in its place, so it finds none of them (convert writes {package!r})"
            )
    expected = max(labels, key=RANK.__getitem__) if labels else FLOAT
    found = lay.pkg.fields.get("model_quant_type")
    if found != expected:
        problems.append(
            f"{DESCRIPTION_NAME}: model_quant_type is {field_shown(lay.pkg.fields, 'model_quant_type')} but the highest type "
            f"present is {shown(expected)}"
        )
    said = found if isinstance(found, str) else field_shown(lay.pkg.fields, "model_quant_type")
    return make_check("description", problems, f"{plural(len(lay.description), 'entry', 'entries')}, model_quant_type {said}")


def check_headers(lay: _Layout) -> Check:
    problems = [why if file in why else f"{file}: {why}" for file, why in sorted(lay.broken.items())]
    problems += [f"tensor {shown(n)} is in both {a} and {b}" for n, a, b in lay.duplicates]
    return make_check("headers", problems, f"{plural(len(lay.headers), 'shard header')} valid, offsets in bounds")


def check_index(lay: _Layout) -> Check:
    if lay.index is None:
        return skip_check("index", f"single file {SINGLE_SHARD_NAME}, no index")
    problems = []
    weight_map = lay.pkg.weight_map
    metadata = lay.index.get("metadata") if isinstance(lay.index.get("metadata"), dict) else {}
    missing = set(lay.missing)
    for name, file in sorted(weight_map.items()):
        entry = lay.tensors.get(name)
        if entry is None:
            if file not in lay.broken and file not in missing:
                problems.append(f"{INDEX_NAME} maps {shown(name)} to {file} but no shard holds it")
        elif entry.path.name != file:
            problems.append(f"{INDEX_NAME} maps {shown(name)} to {file} but it is in {entry.path.name}")
    for name in sorted(set(lay.tensors) - set(weight_map)):
        problems.append(f"{shown(name)} is in {lay.tensors[name].path.name} but not in {INDEX_NAME}")
    total = metadata.get("total_size")
    actual = sum(e.nbytes for e in lay.tensors.values())
    if lay.complete and total != actual:
        problems.append(f"{INDEX_NAME}: metadata.total_size is {shown(total)} but the shards hold {actual} bytes of tensor data")
    return make_check("index", problems, f"{plural(len(weight_map), 'entry', 'entries')}, total_size {total}")


def check_coverage(lay: _Layout) -> Check:
    problems = []
    described, stored = set(lay.description), set(lay.tensors)
    if lay.complete:
        for name in sorted(described - stored):
            problems.append(f"{shown(name)} is described ({lay.description[name]}) but in no shard")
    for name in sorted(stored - described):
        problems.append(f"{shown(name)} is in {lay.tensors[name].path.name} but not described in {DESCRIPTION_NAME}")
    for name in sorted(n for n in stored if n.endswith(BLOCK_FP8_SCALE_SUFFIX)):
        problems.append(f"{shown(name)} ({lay.tensors[name].path.name}) is a block-FP8 scale; an AscendV1 package has none")
    # whole MoE layers: the rule convert applies to its source (io.rules)
    problems += moe_coverage_problems(lay.description, lay.pkg.config, DESCRIPTION_NAME)
    absent, first = lay.rules.missing_layers(lay.description)
    if absent:
        named = ", ".join(map(str, first)) + (f" and {absent - len(first)} more" if absent > len(first) else "")
        problems.append(
            f"config.json's num_hidden_layers is {lay.rules.num_hidden_layers}, but {DESCRIPTION_NAME} holds no tensor "
            f"of {'layer' if absent == 1 else 'layers'} {named}: vLLM builds every layer and runs one it loaded "
            "nothing into on uninitialised weights"
        )
    return make_check("coverage", problems, f"{plural(len(stored), 'tensor')}, each described and stored once")


def check_dtypes(lay: _Layout) -> Check:
    problems = []
    for name, entry in sorted(lay.tensors.items()):
        label = lay.label(name)
        where = f"{shown(name)} ({entry.path.name})"
        if label is None:
            continue
        if label in MX_TYPES and name.endswith(".weight"):
            want = QUANT_TYPES[label].weight_dtype
            if entry.dtype != want:
                problems.append(f"{where} is {entry.dtype}; a {label} weight must be {want}")
        elif label in MX_TYPES and name.endswith(".weight_scale"):
            if entry.dtype != "U8":
                problems.append(f"{where} is {entry.dtype}; a {label} scale must be U8 (E8M0 bytes)")
        elif label == FLOAT:
            if entry.dtype in FP8_DTYPES:
                problems.append(f"{where} is {entry.dtype} but labelled FLOAT: the loader reads it as float by value")
            elif entry.dtype not in FLOAT_DTYPES and name.endswith((".weight", ".bias")):
                # vLLM's parameter of an unquantized weight or bias is float: the loader copies the codes in as numbers
                problems.append(f"{where} is {entry.dtype} but labelled FLOAT: the loader copies it into a float "
                                "weight by value")
            prefix = name[: -len(".bias")] if name.endswith(".bias") else None
            module = lay.modules.get(prefix) if prefix else None
            if module is not None and module.label in MX_TYPES and entry.dtype != "F32":
                problems.append(f"{where} is {entry.dtype}; the bias of a {module.label} layer must be F32")
    for name, label in sorted(lay.description.items()):
        if name.endswith(".bias") and label in MX_TYPES:
            problems.append(f"{shown(name)} is labelled {label}; the bias of an MX layer is labelled FLOAT")
    return make_check("dtypes", problems, "every tensor has its type's dtype")


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
        want = QUANT_TYPES[module.label].scale_shape(n, k)
        if s.shape != want:
            problems.append(
                f"{shown(s.name)} ({s.path.name}) has shape {list(s.shape)}; {module.label} weight {shown(w.name)} "
                f"{list(w.shape)} (N={n}, K={k}) needs {list(want)}"
            )
    return make_check("shapes", problems, "every MX weight and scale has the shape its type implies")


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
    return make_check("pairs", problems, "every MX weight has its scale, of the same type")


def check_alignment(lay: _Layout) -> Check:
    problems = []
    for prefix, module in sorted(lay.modules.items()):
        if module.label not in MX_TYPES or module.k is None:
            continue
        problem = alignment_problem(module.label, module.k, lay.as_expert(prefix))
        if problem:
            problems.append(f"{prefix} ({module.label}): {problem}")
    return make_check("alignment", problems, "K of every MX layer meets its type's rule")


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
    moe = sum(1 for group in groups if group.endswith(".experts"))
    return make_check(
        "packed_groups", problems,
        f"{plural(len(groups) - moe, 'packed group')} and {plural(moe, 'MoE layer')}, each of one type",
    )


def split_problem(
    prefix: str, label: str, n: int, k: int, routed: bool, deployment: Deployment, kv_heads, rules: ModelRules
) -> str | None:
    """Why vLLM cannot split the linear `prefix` (N x K, of type `label`) over deployment.tp ranks,
    by the family's tensor-parallel roles, or None. Shared by verify's `tp` check and by convert,
    which refuses a deployment up front."""
    role = rules.tp_role(prefix)
    tp = deployment.tp
    where = f"{prefix} ({label}, {role}-parallel)"
    if role == "row":
        rank_k_value, k_label = rank_k(prefix, k, routed, deployment, rules)
        problem = k_label if rank_k_value is None else alignment_problem(label, rank_k_value, routed, k_label)
        return f"{where}: {problem}" if problem else None
    last = prefix.rsplit(".", 1)[-1]
    if last in KV_HEAD_PROJECTIONS and isinstance(kv_heads, int) and 0 < kv_heads < tp:
        return f"{where}: {kv_heads} KV heads cannot be replicated evenly over {tp} ranks" if tp % kv_heads else None
    return f"{where}: N={n} does not split over {tp} ranks (N/T = {n / tp:g})" if n % tp else None


def kv_head_count(config: dict | None):
    return config_value(config or {}, "num_key_value_heads")


def check_tp(lay: _Layout, tp: int, ep: bool = False) -> Check:
    kv_heads = kv_head_count(lay.pkg.config)
    heads = heads_problem(lay.pkg.config or {}, tp)
    problems = [heads[0]] if heads else []
    checked = 0
    for prefix, module in sorted(lay.modules.items()):
        if lay.rules.tp_role(prefix) in (None, "replicated") or module.n is None:
            continue
        checked += 1
        routed = lay.as_expert(prefix)
        problem = split_problem(prefix, module.label, module.n, module.k, routed, Deployment(tp, ep), kv_heads, lay.rules)
        if problem:
            problems.append(problem)
    check = make_check("tp", problems, f"{plural(checked, 'split linear')} {'aligns' if checked == 1 else 'align'} under --tp {tp}")
    if heads:  # vLLM refuses the deployment whatever the splits: its fix is the one to give, as convert does
        check.hint = heads[1]
    return check


def check_unknown_tp(recorded: object) -> Check:
    """No --tp given and the one recorded at conversion unreadable: the splits were not checked."""
    return make_check(
        "tp",
        [
            f"{PROVENANCE_NAME}: deployment.tp is {json_kind(recorded)}, not a positive integer: the --tp the package "
            "was converted for is unknown, so its splits were not checked (pass --tp T)"
        ],
        "",
    )


# --- the data scan: scales, payload, checksums in one pass per shard -----------------------------
