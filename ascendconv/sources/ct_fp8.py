"""compressed-tensors FP8 (`quant_method: compressed-tensors`, `format: float-quantized`), as
llm-compressor writes it: each quantized linear's `P.weight` F8_E4M3 [N, K] with `P.weight_scale`, a
multiplier (BF16, F16 or F32) per tile of the group's `weights.strategy`:

- `block`: `block_structure [bn, bk]`, scale [cdiv(N, bn), cdiv(K, bk)] (FP8-block, DeepSeek-style);
- `channel`: scale [N, 1], a tile per output row (1 x K);
- `tensor`: one scale ([] or [1]), a tile of the whole weight.

Each is block FP8's math with its own tile, so the package bytes equal those of the same weights
written as a Hugging Face block-FP8 checkpoint. `ignore` names the modules left unquantized
(`re:` entries are regular expressions); `targets` name module classes, not tensors, so the
pairing goes by tensor names and each scale's shape says which group's tile it has (a shape that
two groups' tiles would read differently is refused)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from ascendconv.errors import (
    ConfigError,
    MissingScaleError,
    ScaleDtypeError,
    ScaleShapeError,
    StaticActivationError,
    UnsupportedSourceError,
    shown,
)
from ascendconv.io.safetensors import TensorEntry
from ascendconv.sources.base import Source, SourceFormat, SourceLinear
from ascendconv.sources.checkpoint import Checkpoint, find_quantization_config
from ascendconv.sources.hf_fp8_block import fp8_weight_prefix, parse_block_tile

QUANT_METHOD = "compressed-tensors"
FLOAT_QUANTIZED = "float-quantized"
CT_MIXED = "mixed-precision"  # the top-level format when the groups name their own
SCALE_SUFFIX = ".weight_scale"
SCALE_DTYPES = ("BF16", "F16", "F32")
STRATEGIES = ("block", "channel", "tensor")
# Other compressed-tensors formats, and why they are not re-quantized from FP8 tiles here.
OTHER_FORMATS = {
    "nvfp4-pack-quantized": "NVFP4 scales are E4M3 values per 16 elements times a global scale: no MX type holds "
    "them exactly, and ascendconv does not re-quantize FP4 silently",
    "pack-quantized": "integer (INT4/INT8) weights are not an FP8 or MX format",
    "int-quantized": "integer (INT8) weights are not an FP8 or MX format",
    "naive-quantized": "integer weights are not an FP8 or MX format",
    "marlin-24": "2:4 sparse integer weights are not an FP8 or MX format",
    "sparse-24-bitmask": "2:4 sparse weights are not a dense FP8 or MX format",
}


@dataclass(frozen=True)
class CtFp8Config:
    """The FP8 weight groups of a compressed-tensors config: the strategies in use and their tiles."""

    strategies: frozenset[str]
    blocks: tuple[tuple[int, int], ...]  # block_structure of each `block` group
    ignore: tuple[str, ...]
    location: str
    dynamic_activations: bool


def _formats(quant: dict) -> set[str]:
    """The top-level `format` and any group's own (newer writers put it per group)."""
    groups = quant.get("config_groups")
    found = {quant.get("format")}
    if isinstance(groups, dict):
        found |= {g.get("format") for g in groups.values() if isinstance(g, dict)}
    return {f for f in found if isinstance(f, str)}


def check_ignore(ignore: object, where: str) -> tuple[str, ...]:
    """`ignore`: module names, or `re:` regular expressions, which must compile."""
    if ignore is None:
        return ()
    if not (isinstance(ignore, list) and all(isinstance(i, str) for i in ignore)):
        raise ConfigError(f"{where}.ignore is {shown(ignore)}, expected a list of module names or 're:' patterns")
    for entry in ignore:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            # the compiler raises the last two for a repetition count past its limit and for deep nesting
            except (re.error, OverflowError, RecursionError) as exc:
                raise ConfigError(
                    f"{where}.ignore entry {shown(entry)} is not a regular expression ({exc})",
                    "fix or remove the entry in config.json's ignore list",
                ) from None
    return tuple(ignore)


def check_symmetric(weights: dict, at: str) -> None:
    """A group's weights symmetric (compressed-tensors' default): an asymmetric group stores a
    `weight_zero_point` per scale, value = (code - zero point) x scale, which no MX type holds and
    vLLM's FP8 and MX schemes do not load."""
    symmetric = weights.get("symmetric")
    if symmetric is not None and symmetric is not True:  # null reads as absent, as every config key here
        raise UnsupportedSourceError(
            f"{at}.weights.symmetric is {shown(symmetric)}: asymmetric weights (a zero point beside each "
            "scale) are not read",
            "ascendconv reads symmetric compressed-tensors weights (symmetric: true, the default); convert a symmetric release",
        )


def parse_ct_fp8_config(config: dict, config_path: Path) -> CtFp8Config:
    quant, location = find_quantization_config(config)
    where = f"{config_path}: {location}"
    assert quant is not None  # accepts() saw it
    formats = _formats(quant) - {CT_MIXED}  # each group's weights are checked below, whatever it is called
    for name in sorted(formats - {FLOAT_QUANTIZED}):
        why = OTHER_FORMATS.get(name, "ascendconv does not read this compressed-tensors format")
        raise UnsupportedSourceError(f"{where}.format is {shown(name)}: {why}")
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{where}.config_groups is {shown(groups)}, expected an object of quantization groups")
    strategies, blocks, dynamic = set(), [], True
    for key, group in groups.items():
        at = f"{where}.config_groups.{key}"
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise ConfigError(f"{at}.weights is {shown(weights)}, expected the weights' quantization arguments")
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise UnsupportedSourceError(
                f"{at}.weights are {shown(weights.get('type'))} with {shown(weights.get('num_bits'))} bits: "
                "ascendconv reads 8-bit float (FP8) compressed-tensors weights"
            )
        strategy = weights.get("strategy")
        if strategy not in STRATEGIES:
            raise UnsupportedSourceError(
                f"{at}.weights.strategy is {shown(strategy)}; FP8 weights are read with strategy "
                f"{', '.join(repr(s) for s in STRATEGIES)}"
            )
        check_symmetric(weights, at)
        strategies.add(strategy)
        if strategy == "block":
            blocks.append(parse_block_tile(weights.get("block_structure"), f"{at}.weights.block_structure"))
        activations = group.get("input_activations")
        if isinstance(activations, dict) and activations.get("dynamic") is False:
            dynamic = False
    if not dynamic:
        raise StaticActivationError(f"{where}: static activation scales (input_activations.dynamic false)")
    return CtFp8Config(frozenset(strategies), tuple(dict.fromkeys(blocks)), check_ignore(quant.get("ignore"), where),
                       location, dynamic)


def tiles_of(weight: TensorEntry, scale: TensorEntry, quant: CtFp8Config) -> dict[tuple[int, int], str]:
    """The tiles a scale's shape stands for among the configured strategies (tile -> what it is),
    one per distinct reading: a tile side past the weight's reads as the weight's (a single row or
    column of tiles either way)."""
    n, k = weight.shape
    fits = [((bn, bk), f"block {bn}x{bk}") for bn, bk in quant.blocks if scale.shape == (math.ceil(n / bn), math.ceil(k / bk))]
    if "channel" in quant.strategies and scale.shape == (n, 1):
        fits.append(((1, k), "channel"))
    if "tensor" in quant.strategies and math.prod(scale.shape) == 1 and len(scale.shape) <= 2:
        fits.append(((n, k), "tensor"))
    readings: dict[tuple[int, int], tuple[tuple[int, int], str]] = {}
    for (bn, bk), what in fits:
        readings.setdefault((min(bn, n), min(bk, k)), ((bn, bk), what))
    return dict(readings.values())


def pair_ct_fp8_linears(tensors: dict[str, TensorEntry], quant: CtFp8Config) -> dict[str, SourceLinear]:
    linears: dict[str, SourceLinear] = {}
    readings: dict[tuple, dict[tuple[int, int], str]] = {}  # (weight shape, scale shape) -> tiles_of (a few dozen)
    for name, entry in tensors.items():
        prefix = fp8_weight_prefix(name, entry)
        if prefix is None:
            continue
        scale = tensors.get(prefix + SCALE_SUFFIX)
        if scale is None:
            raise MissingScaleError(
                f"{entry.path.name}: F8_E4M3 weight {shown(name)} has no {shown(prefix + SCALE_SUFFIX)} in any shard",
                "every compressed-tensors FP8 weight needs its weight_scale; the checkpoint is incomplete",
            )
        if scale.dtype not in SCALE_DTYPES:
            raise ScaleDtypeError(
                f"{scale.path.name}: {shown(scale.name)} is {scale.dtype}, expected one of {', '.join(SCALE_DTYPES)}",
                "a compressed-tensors FP8 weight_scale is a float multiplier",
            )
        tiles = readings.get((entry.shape, scale.shape))
        if tiles is None:
            tiles = readings[(entry.shape, scale.shape)] = tiles_of(entry, scale, quant)
        if len(tiles) > 1:  # groups of different block_structure whose grids coincide for this weight
            raise ScaleShapeError(
                f"{scale.path.name}: {shown(scale.name)} has shape {list(scale.shape)}, the scale grid of "
                f"{' and of '.join(tiles.values())} for weight {list(entry.shape)}: which tile it has cannot be told",
                "ascendconv tells a compressed-tensors group's tile by its scale's shape, not by the group's targets; "
                "these groups' block structures give this weight the same grid",
            )
        if not tiles:
            n, k = entry.shape
            expected = [f"{[math.ceil(n / bn), math.ceil(k / bk)]} (block {bn}x{bk})" for bn, bk in quant.blocks]
            expected += [f"{[n, 1]} (channel)"] if "channel" in quant.strategies else []
            expected += ["[1] (tensor)"] if "tensor" in quant.strategies else []
            raise ScaleShapeError(
                f"{scale.path.name}: {shown(scale.name)} has shape {list(scale.shape)}, expected "
                f"{' or '.join(expected)} for weight {list(entry.shape)}",
                "check config_groups in config.json against the scale tensors",
            )
        linears[prefix] = SourceLinear(prefix, entry, scale, tensors.get(prefix + ".bias"), next(iter(tiles)))
    return linears


class CompressedTensorsFp8(SourceFormat):
    name = "ct-fp8"
    label = "compressed-tensors FP8 (float-quantized)"
    quant_method = QUANT_METHOD

    def accepts(self, quant: dict | None, config: dict) -> bool:
        return quant is not None and quant.get("quant_method") == QUANT_METHOD

    def parse(self, config: dict, config_path: Path) -> CtFp8Config:
        return parse_ct_fp8_config(config, config_path)

    def open(self, checkpoint: Checkpoint, quant: CtFp8Config) -> Source:
        linears = pair_ct_fp8_linears(checkpoint.tensors, quant)
        params = {"strategies": sorted(quant.strategies), "block_structures": [list(b) for b in quant.blocks]}
        shown_config = {
            "format": self.name,
            "label": self.label,
            "location": quant.location,
            "quant_method": QUANT_METHOD,
            "weight_block_size": list(quant.blocks[0]) if len(quant.blocks) == 1 and quant.strategies == {"block"} else None,
            "strategies": sorted(quant.strategies),
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "scale_fmt": None,
            "modules_to_not_convert": list(quant.ignore),
        }
        return Source(checkpoint, self.name, quant, linears, params, shown_config)
