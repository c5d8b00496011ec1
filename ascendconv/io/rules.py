"""Rules on a source's tensors that the package written from it must meet, applied up front.

The source seam applies them to every format (ascendconv/sources/), so `convert`, `inspect` and `verify --source`
refuse the same sources with the same named errors, before anything is written: a source convert
accepts gives a package its own `verify` accepts.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Iterable

from ascendconv.ascendv1 import DESCRIPTION_FIELDS
from ascendconv.errors import (
    ConfigError,
    IncompleteMoEError,
    StaticActivationError,
    UnrecognizedCheckpointError,
    UnsupportedTensorError,
    clip,
    shown,
)
from ascendconv.io.safetensors import TensorEntry
from ascendconv.models import GATE_UP_DOWN, expert_count, odd_expert_count, rules_for

# Keys of quant_model_description.json besides the tensor names: a tensor of one of these names
# would be overwritten by (or taken for) the field.
MX_SCALE_SUFFIX = ".weight_scale"  # the name the package gives an MX layer's E8M0 scales
BLOCK_FP8_SCALE_SUFFIX = ".weight_scale_inv"  # a block-FP8 multiplier: verify refuses one in any package
# Scale names a tensor the format did not consume may not carry into the package, and why.
STRAY_SCALE_SUFFIXES = {
    MX_SCALE_SUFFIX: "the name the package gives MX scales",
    BLOCK_FP8_SCALE_SUFFIX: "a block-FP8 scale (an AscendV1 package holds none)",
}
# What the package names a linear's weight and scale, whatever the source called them
# (compressed-tensors MXFP4 stores the weight as `weight_packed`).
PACKAGE_SUFFIXES = {".weight": "weight", MX_SCALE_SUFFIX: "scale"}
INPUT_SCALE_SUFFIX = ".input_scale"  # a linear's static activation scale, in every format that writes one
ZERO_POINT_SUFFIX = ".weight_zero_point"  # an asymmetric weight's offset: value = (code - zero point) x scale
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")
EXPERT_PROJECTIONS = GATE_UP_DOWN  # the roles, whatever a family names them (MiniMax: w1, w3, w2)
EXPERT_COUNT_HINT = "write the count as an integer, as vLLM reads it (it sizes each MoE layer by it)"
MAX_EXPERT_DIGITS = 9  # expert numbers beyond any model; int() of a huge digit string is never tried


def moe_layers(names: Iterable[str], config: dict | None = None) -> dict[str, dict[int, dict[str, str]]]:
    """layer prefix ('model.layers.3.mlp') -> expert -> projection role -> weight name, in layer
    order. Routed experts are named as the model family of config.json names them (models.py)."""
    return _moe_layers([name[: -len(".weight")] for name in names if name.endswith(".weight")], config)


def _moe_layers(
    prefixes: list[str], config: dict | None, weight_suffix: str = ".weight"
) -> dict[str, dict[int, dict[str, str]]]:
    """moe_layers of the modules `prefixes` (the names of their weights less '.weight'), each role
    given as its module's name + `weight_suffix`: '' where only the roles held are read (the
    module's own name then, no new string for each of ~92,000 projections)."""
    rules = rules_for(config if isinstance(config, dict) else None)
    role_of = rules.expert_roles  # a dict, not expert_role: one lookup per projection, not a call
    numbers: dict[str, int] = {}  # a few hundred expert numbers, each spelled by a hundred layers
    layers: dict[str, dict[int, dict[str, str]]] = {}
    last_layer = last_expert = roles_of = None  # the expert met last, and its roles (None: passed over)
    for prefix, match in zip(prefixes, rules.routed_experts(prefixes)):
        if match is None:
            continue
        layer_name, expert = match["layer"], match["expert"]
        # an expert's projections are listed together and their matches share the layer and expert
        # strings (routed_experts parses the module once): its roles are found once for all three
        if expert is not last_expert or layer_name is not last_layer:
            last_layer, last_expert = layer_name, expert
            if len(expert) > MAX_EXPERT_DIGITS:
                roles_of = None
                continue
            layer = layers.get(layer_name)
            if layer is None:
                layer = layers[layer_name] = {}
            number = numbers.get(expert)
            if number is None:
                number = numbers[expert] = int(expert)
            roles_of = layer.get(number)
            if roles_of is None:
                roles_of = layer[number] = {}
        if roles_of is not None:
            roles_of[role_of[match["proj"]]] = prefix + weight_suffix

    def order(layer: str):
        return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", layer)]

    return {layer: layers[layer] for layer in sorted(layers, key=order)}


def moe_coverage_problems(names: Iterable[str], config: dict | None, where: str) -> list[str]:
    """Whole MoE layers: experts 0..E-1, each with its three projections, E as config.json says.
    `where` names what holds the names (for the messages). Work is bounded by the names given,
    never by an expert number read from a file."""
    layers = moe_layers(names, config)
    odd = _odd_count_problem(layers, config)
    return ([odd] if odd else []) + _coverage_problems(layers, config, where)


def _odd_count_problem(layers: dict[str, dict[int, dict[str, str]]], config: dict | None) -> str | None:
    """A routed-expert count config.json gives as no integer, with the count the first MoE layer
    holds; None where the count is sound or there are no MoE layers."""
    odd = odd_expert_count(config) if layers and isinstance(config, dict) else None
    if not odd:
        return None
    layer, experts = next(iter(layers.items()))
    return f"{odd}: {clip(layer)} has {max(experts) + 1} experts"


def _coverage_problems(layers: dict[str, dict[int, dict[str, str]]], config: dict | None, where: str) -> list[str]:
    problems = []
    configured = expert_count(config) if isinstance(config, dict) else None  # models.py: the one reading
    for layer, experts in layers.items():
        count = max(experts) + 1
        absent = count - len(experts)
        if absent:
            first = next(e for e in range(count) if e not in experts)  # at most len(experts) + 1 steps
            problems.append(
                f"{clip(layer)}.experts.{first} is not in {where}" + (f" ({absent} of {count} experts missing)" if absent > 1 else "")
            )
        for e in sorted(e for e, roles in experts.items() if len(roles) < len(EXPERT_PROJECTIONS)):
            missing = [p for p in EXPERT_PROJECTIONS if p not in experts[e]]
            problems.append(f"{clip(layer)}.experts.{e} has no {', '.join(missing)} in {where}")
        if configured is not None and count != configured:
            problems.append(f"{clip(layer)} has {count} experts but config.json says {configured}")
    return problems


def _where(name: str, entry: TensorEntry) -> str:
    return f"{entry.path.name}: tensor {shown(name)}"


def paired_names(linears: dict) -> set[str]:
    """The tensors a source's format paired into its linears (`linears`: module prefix ->
    sources.SourceLinear): each one's weight and scale."""
    paired = {linear.weight.name for linear in linears.values()}
    # a list, not a generator: set.update reads it at C speed (94,000 scales at full scale)
    paired.update([linear.scale.name for linear in linears.values() if linear.scale is not None])
    return paired


def check_source_tensors(root: Path, tensors: dict[str, TensorEntry], linears: dict, config: dict) -> list[str]:
    """Raise a named error for the first source tensor the package could not carry as the loader
    and `verify` expect. `linears`: module prefix -> sources.SourceLinear (weight, scale, bias), as
    the source's format paired them: a tensor the format did not consume is carried as it is.
    Returns those tensors, the unpaired ones, in source order."""
    if not tensors:
        raise UnrecognizedCheckpointError(f"{root}: the weight files hold no tensors", "the checkpoint is empty or damaged")
    paired = paired_names(linears)
    # the few tensors to look at found at C speed first (a full-scale source has a few hundred thousand,
    # nearly all paired), then each in source order, so that the first offending tensor is named
    odd_names = list(itertools.filterfalse(paired.__contains__, tensors))  # the unpaired ones
    if tensors.keys() & DESCRIPTION_FIELDS:
        odd_names = [n for n in tensors if n not in paired or n in DESCRIPTION_FIELDS]
    for name in odd_names:
        entry = tensors[name]
        if name in DESCRIPTION_FIELDS:
            raise UnsupportedTensorError(
                f"{_where(name, entry)} has the name of a field of quant_model_description.json",
                "the package cannot describe a tensor of that name; rename it in the checkpoint",
            )
        if name in paired:
            continue
        prefix, dot, suffix = name.rpartition(".")
        linear = linears.get(prefix)
        if linear is not None and dot + suffix == INPUT_SCALE_SUFFIX:
            raise StaticActivationError(f"{_where(name, entry)} is a static activation scale of linear {shown(prefix)}")
        if linear is not None and dot + suffix == ZERO_POINT_SUFFIX:
            raise UnsupportedTensorError(
                f"{_where(name, entry)} is a zero point of linear {shown(prefix)}: its weights are asymmetric "
                "((code - zero point) x scale), which no MX type holds",
                "ascendconv reads symmetric weights only; convert a symmetric release of the model",
            )
        role = PACKAGE_SUFFIXES.get(dot + suffix) if linear is not None else None
        if role is not None:
            made_from = linear.weight if role == "weight" else linear.scale
            raise UnsupportedTensorError(
                f"{_where(name, entry)} is stored, and the package writes the {role} of linear {shown(prefix)} under "
                "that name" + (f" (from {shown(made_from.name)})" if made_from is not None else "") + ": the two would collide",
                "a linear's weight and scale are stored once each: remove the stray tensor, or check that config.json "
                "names the checkpoint's format",
            )
        stray = next((s for s in STRAY_SCALE_SUFFIXES if name.endswith(s)), None)
        if stray is not None:
            raise UnsupportedTensorError(
                f"{_where(name, entry)} ends in {stray!r}, {STRAY_SCALE_SUFFIXES[stray]}, but is no "
                "scale of a quantized linear of this checkpoint's format",
                "remove or rename the stray tensor, or check that config.json names the checkpoint's format",
            )
        if entry.dtype in FP8_DTYPES:
            raise UnsupportedTensorError(
                f"{_where(name, entry)} is {entry.dtype} but not a weight or scale of a quantized linear",
                "a FLOAT tensor of the package must hold floats the loader can read by value",
            )
    for linear in linears.values():
        if 0 in linear.weight.shape:
            raise UnsupportedTensorError(
                f"{linear.weight.path.name}: quantized weight {shown(linear.weight.name)} has shape "
                f"{list(linear.weight.shape)}: a linear without elements",
                "no model has one; the checkpoint is damaged or hand-made",
            )
        bias = linear.bias
        if bias is not None and bias.dtype not in FLOAT_DTYPES:
            raise UnsupportedTensorError(
                f"{bias.path.name}: bias {shown(bias.name)} of a quantized linear is {bias.dtype}, not a float dtype",
                f"an MX layer's bias is written as F32 from one of {', '.join(FLOAT_DTYPES)}",
            )
    # over the names the package gives them: a linear's weight is `<prefix>.weight` (an MX weight
    # stored as `weight_packed` too), every other tensor keeps its name
    modules = [*linears, *(n[: -len(".weight")] for n in odd_names if n not in paired and n.endswith(".weight"))]
    layers = _moe_layers(modules, config, weight_suffix="")  # the roles held are all it reads
    odd = _odd_count_problem(layers, config)
    if odd:
        raise ConfigError(odd, EXPERT_COUNT_HINT)
    problems = _coverage_problems(layers, config, f"{root}")
    if problems:
        raise IncompleteMoEError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return odd_names  # no description field among them (that raised above): the unpaired tensors
