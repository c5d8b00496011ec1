"""Checkpoints already in an MX format: each quantized linear is a payload (packed E2M1, or E4M3
codes) with one E8M0 byte per 32 values along K, the layout of the package's own MX types. Where the
written type is the source's (`--scheme native`, or a scheme asking for it) the package bytes are
the source's, re-laid out by a named exact transform (formats/relayout.py); elsewhere the values are
decoded (code x 2**(b - 127)) and re-quantized.

Three publishers, one LAYOUTS table (how each names and types a linear's tensors):

- compressed-tensors (llm-compressor): `format: mxfp4-pack-quantized`, `P.weight_packed` U8 [N, K/2]
  + `P.weight_scale` U8 [N, K/32] (a `P.weight_shape` companion is dropped), and `mxfp8-quantized`,
  `P.weight` F8_E4M3 + the same scale; `config_groups.*.weights` {type float, strategy group,
  group_size 32, num_bits 4 or 8}.
- AMD Quark OCP-MX (`quant_method: quark`): `P.weight` U8 [N, K/2] + `P.weight_scale` U8 per
  layer whose weight spec (`layer_quant_config` by module pattern, else `global_quant_config`) is
  `dtype: fp4, qscheme: per_group, group_size: 32`; layers whose spec is `fp8_e4m3` keep block FP8
  with its multiplier named `P.weight_scale` and are read as FP8 tiles, layer by layer.
- NVIDIA ModelOpt MXFP8 (`quant_method: modelopt`, `quant_algo: MXFP8`, in config.json or
  hf_quant_config.json): `P.weight` F8_E4M3 + `P.weight_scale` U8 [N, K/32].

Nibble order: every one of them packs element 2j in the low nibble, as the package does; no
safetensors format here declares another (GGUF's split-half blocks are refused as GGUF).
"""

from __future__ import annotations

import fnmatch
import functools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ascendconv.errors import (
    ConfigError,
    InexactSourceError,
    MissingScaleError,
    NotYetSupportedSourceError,
    ScaleDtypeError,
    ScaleShapeError,
    StaticActivationError,
    UnsupportedSourceError,
    UnsupportedTensorError,
    shown,
)
from ascendconv.formats.constants import GROUP_SIZE
from ascendconv.io.files import read_json
from ascendconv.io.safetensors import TensorEntry
from ascendconv.sources.base import WEIGHT_SUFFIX, Encoding, Source, SourceFormat, SourceLinear, biases_by_module, new_linear
from ascendconv.sources.checkpoint import Checkpoint, find_quantization_config
from ascendconv.sources.ct_fp8 import CT_MIXED, OTHER_FORMATS, _formats, check_ignore, check_symmetric

SCALE_SUFFIX = ".weight_scale"
PACKED_SUFFIX = ".weight_packed"  # compressed-tensors' packed MXFP4 weight
E8M0_DTYPES = ("U8", "F8_E8M0")  # E8M0 bytes, whichever tag the writer gave them; the package's are U8
NVFP4_WHY = (
    "NVFP4 scales are E4M3 values per 16 elements times a per-tensor global scale: no MX type holds them "
    "exactly, and ascendconv does not re-quantize FP4 silently"
)
FP6_WHY = "AscendV1 has no FP6 type and vllm-ascend no FP6 scheme"
# The bytes would re-lay out exactly (packed E2M1 [N, K/2] + E8M0 [N, K/32], element 2j low), but no
# published ModelOpt MXFP4 checkpoint pins down its tensor names, and vLLM's ModelOpt loader has no
# MXFP4 either: reading it would be a guess.
MODELOPT_MXFP4_WHY = (
    "ModelOpt MXFP4 is not supported yet: its bytes would re-lay out exactly, but the tensor names of a "
    "published ModelOpt MXFP4 checkpoint are not confirmed, and ascendconv does not guess which tensor is which"
)
MODELOPT_MXFP4_HINT = "convert the model's BF16 (or MXFP8 / block-FP8) release, or report the checkpoint so its layout can be added"


@dataclass(frozen=True)
class MxLayout:
    """How one publisher stores an MX linear: its weight tensor's suffix and dtype, the element
    encoding, and companion tensors of no use to the package (dropped)."""

    name: str
    encoding: Encoding
    weight_suffix: str
    weight_dtype: str
    companions: tuple[str, ...] = ()

    @property
    def k_per_byte(self) -> int:
        return 2 if self.encoding is Encoding.MX_E2M1 else 1


LAYOUTS = {
    "ct-mxfp4": MxLayout("ct-mxfp4", Encoding.MX_E2M1, PACKED_SUFFIX, "U8", (".weight_shape",)),
    "ct-mxfp8": MxLayout("ct-mxfp8", Encoding.MX_E4M3, WEIGHT_SUFFIX, "F8_E4M3"),
    "quark-fp4": MxLayout("quark-fp4", Encoding.MX_E2M1, WEIGHT_SUFFIX, "U8"),
    "modelopt-mxfp8": MxLayout("modelopt-mxfp8", Encoding.MX_E4M3, WEIGHT_SUFFIX, "F8_E4M3"),
}


def mx_linear(tensors: dict[str, TensorEntry], name: str, entry: TensorEntry, layout: MxLayout, what: str) -> SourceLinear:
    """The MX linear whose weight is `entry`, its E8M0 scale checked: present, bytes, [N, K/32]."""
    prefix = name[: -len(layout.weight_suffix)]
    if len(entry.shape) != 2 or 0 in entry.shape:
        raise UnsupportedTensorError(
            f"{entry.path.name}: {what} weight {shown(name)} is {entry.dtype} {list(entry.shape)}, expected a 2-D [N, K"
            + ("/2]" if layout.k_per_byte == 2 else "]"),
            "this checkpoint stores its MX weights in a layout ascendconv does not know",
        )
    n, k = entry.shape[0], entry.shape[1] * layout.k_per_byte
    scale = tensors.get(prefix + SCALE_SUFFIX)
    if scale is None:
        raise MissingScaleError(
            f"{entry.path.name}: {what} weight {shown(name)} has no {shown(prefix + SCALE_SUFFIX)} in any shard",
            "every MX weight needs its E8M0 weight_scale; the checkpoint is incomplete",
        )
    if scale.dtype not in E8M0_DTYPES:
        raise ScaleDtypeError(
            f"{scale.path.name}: {shown(scale.name)} is {scale.dtype}, expected E8M0 bytes ({' or '.join(E8M0_DTYPES)}) "
            f"for the {what} weight {shown(name)}",
            "an MX scale is one E8M0 byte per 32 values; a float multiplier belongs to an FP8 format",
        )
    expected = (n, k // GROUP_SIZE)
    if k % GROUP_SIZE or scale.shape != expected:
        raise ScaleShapeError(
            f"{scale.path.name}: {shown(scale.name)} has shape {list(scale.shape)}, expected {list(expected)} "
            f"(one byte per {GROUP_SIZE} values along K) for weight {shown(name)} {list(entry.shape)} (K = {k})",
            "MX groups are 32 values along K; check the checkpoint's quantization config against its tensors",
        )
    return SourceLinear(prefix, entry, scale, tensors.get(prefix + ".bias"), None, layout.encoding)


def without_companions(tensors: dict[str, TensorEntry], linears: dict[str, SourceLinear], layouts) -> dict[str, TensorEntry] | None:
    """The tensors less the companions of the MX linears (None when there is none to drop)."""
    drop = {prefix + suffix for prefix in linears for layout in layouts for suffix in layout.companions}
    drop &= set(tensors)
    return {n: e for n, e in tensors.items() if n not in drop} if drop else None


def mx_source(
    fmt: SourceFormat, checkpoint: Checkpoint, quant, linears, layouts, params: dict, shown_config: dict,
    split: dict[str, TensorEntry] | None = None,
) -> Source:
    """The Source of an MX format's linears; `split`: the tensors as the format splits stored ones
    (fused experts), else the checkpoint's own."""
    base = checkpoint.tensors if split is None else split
    kept = without_companions(base, linears, layouts)
    logical = split if kept is None else kept
    encodings = sorted({linear.encoding.value for linear in linears.values()})
    shown_config = {
        "format": fmt.name, "label": fmt.label, "quant_method": fmt.quant_method, "weight_block_size": None,
        "activation_scheme": "dynamic", "scale_fmt": "e8m0", "encodings": encodings,
        "companions_dropped": 0 if kept is None else len(base) - len(kept), **shown_config,
    }
    return Source(checkpoint, fmt.name, quant, linears, {**params, "encodings": encodings}, shown_config, logical)


# --- compressed-tensors ------------------------------------------------------------------------

CT_METHOD = "compressed-tensors"
CT_MX_FORMATS = {"mxfp4-pack-quantized": (4, "ct-mxfp4"), "mxfp8-quantized": (8, "ct-mxfp8")}


@dataclass(frozen=True)
class CtMxConfig:
    formats: tuple[str, ...]
    ignore: tuple[str, ...]
    location: str


def parse_ct_mx_config(config: dict, config_path: Path) -> CtMxConfig:
    quant, location = find_quantization_config(config)
    where = f"{config_path}: {location}"
    formats = _formats(quant) - {CT_MIXED}
    for name in sorted(formats - set(CT_MX_FORMATS)):
        why = OTHER_FORMATS.get(name, "ascendconv reads an MX compressed-tensors checkpoint in MX formats only")
        error = InexactSourceError if name.startswith("nvfp4") else UnsupportedSourceError
        raise error(f"{where}.format is {shown(name)} beside {', '.join(sorted(formats & set(CT_MX_FORMATS)))}: {why}")
    bits = {CT_MX_FORMATS[f][0] for f in formats}
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{where}.config_groups is {shown(groups)}, expected an object of quantization groups")
    for key, group in groups.items():
        at = f"{where}.config_groups.{key}"
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise ConfigError(f"{at}.weights is {shown(weights)}, expected the weights' quantization arguments")
        if weights.get("type") != "float" or weights.get("num_bits") not in bits:
            raise UnsupportedSourceError(
                f"{at}.weights are {shown(weights.get('type'))} with {shown(weights.get('num_bits'))} bits, but "
                f"format {', '.join(sorted(formats))} stores float weights of {' or '.join(map(str, sorted(bits)))} bits"
            )
        strategy = weights.get("strategy")
        if strategy != "group":
            raise UnsupportedSourceError(
                f"{at}.weights.strategy is {shown(strategy)}; MX weights are quantized with strategy 'group' "
                f"(one E8M0 scale per {GROUP_SIZE} values)"
            )
        if weights.get("group_size") != GROUP_SIZE:
            raise UnsupportedSourceError(
                f"{at}.weights.group_size is {shown(weights.get('group_size'))}; MX groups are {GROUP_SIZE} values "
                "(another size has no AscendV1 type)"
            )
        check_symmetric(weights, at)
        activations = group.get("input_activations")
        if isinstance(activations, dict) and activations.get("dynamic") is False:
            raise StaticActivationError(f"{at}: static activation scales (input_activations.dynamic false)")
    return CtMxConfig(tuple(sorted(formats)), check_ignore(quant.get("ignore"), where), location)


class CompressedTensorsMx(SourceFormat):
    name = "ct-mx"
    label = "compressed-tensors MX (mxfp4-pack-quantized / mxfp8-quantized)"
    quant_method = CT_METHOD

    def accepts(self, quant: dict | None, config: dict) -> bool:
        return quant is not None and quant.get("quant_method") == CT_METHOD and bool(_formats(quant) & set(CT_MX_FORMATS))

    def parse(self, config: dict, config_path: Path) -> CtMxConfig:
        return parse_ct_mx_config(config, config_path)

    def open(self, checkpoint: Checkpoint, quant: CtMxConfig) -> Source:
        layouts = [LAYOUTS[CT_MX_FORMATS[f][1]] for f in quant.formats]
        linears = _pair_mx_faultless(checkpoint.tensors, layouts)
        if linears is None:
            linears = self._pair_naming_faults(checkpoint.tensors, layouts, quant)
        shown_config = {"location": quant.location, "fmt": "/".join(quant.formats), "modules_to_not_convert": list(quant.ignore)}
        return mx_source(self, checkpoint, quant, linears, layouts, {"formats": list(quant.formats)}, shown_config)

    @staticmethod
    def _pair_naming_faults(tensors: dict[str, TensorEntry], layouts: list[MxLayout], quant: CtMxConfig) -> dict[str, SourceLinear]:
        """The linears tensor by tensor, in source order: the first fault is the one named."""
        linears: dict[str, SourceLinear] = {}
        for name, entry in tensors.items():
            for layout in layouts:
                if name.endswith(layout.weight_suffix) and entry.dtype == layout.weight_dtype:
                    linear = mx_linear(tensors, name, entry, layout, layout.name)
                    if linear.prefix in linears:  # MXFP4 and MXFP8 groups: one would be dropped, or collide
                        raise UnsupportedTensorError(
                            f"{entry.path.name}: {shown(name)} and {shown(linears[linear.prefix].weight.name)} are both "
                            f"stored as the weight of linear {shown(linear.prefix)}, which the package writes once",
                            "a linear is stored once, in one MX format; remove one of the two tensors",
                        )
                    linears[linear.prefix] = linear
            if name.endswith(PACKED_SUFFIX) and name[: -len(PACKED_SUFFIX)] not in linears:
                if entry.dtype == "U8":  # a packed MXFP4 weight, of a format config.json does not name
                    raise UnsupportedTensorError(
                        f"{entry.path.name}: {shown(name)} is a packed MXFP4 weight (U8 {list(entry.shape)}), but "
                        f"config.json names no mxfp4-pack-quantized format (only {', '.join(quant.formats)})",
                        "check that config.json's quantization_config describes the checkpoint's tensors",
                    )
                raise UnsupportedTensorError(
                    f"{entry.path.name}: {shown(name)} is {entry.dtype} {list(entry.shape)}, but packed MXFP4 weights are U8"
                    + ("" if "mxfp4-pack-quantized" in quant.formats else " (and config.json names no mxfp4-pack-quantized format)")
                )
        return linears


def _pair_mx_faultless(tensors: dict[str, TensorEntry], layouts: list[MxLayout]) -> dict[str, SourceLinear] | None:
    """The compressed-tensors MX linears of a checkpoint without a fault, in one tight loop (a
    full-scale one has a quarter of a million), or None at the first sign of a fault: then
    `_pair_naming_faults` names the first in source order. It makes the same linears as that one."""
    linears: dict[str, SourceLinear] = {}
    get, new = tensors.get, new_linear
    bias_of = biases_by_module(tensors).get
    kinds = {(layout.weight_suffix, layout.weight_dtype): layout for layout in layouts}
    suffixes = tuple(dict.fromkeys([*(suffix for suffix, _ in kinds), PACKED_SUFFIX]))  # a packed weight always counts
    grids: dict[tuple, tuple[int, int] | None] = {}  # (weight shape, bytes per K) -> its scale's shape
    for name, entry in tensors.items():
        if not name.endswith(suffixes):
            continue
        for suffix in suffixes:
            if not name.endswith(suffix):
                continue
            layout = kinds.get((suffix, entry.dtype))
            if layout is None:
                if suffix == PACKED_SUFFIX:  # in another dtype, or no MXFP4 format: named by the slow path
                    return None
                continue
            prefix = name[: -len(suffix)]
            shape, per_byte = entry.shape, layout.k_per_byte
            grid = grids.get((shape, per_byte), False)
            if grid is False:
                ok = len(shape) == 2 and 0 not in shape and shape[1] * per_byte % GROUP_SIZE == 0
                grid = grids[(shape, per_byte)] = (shape[0], shape[1] * per_byte // GROUP_SIZE) if ok else None
            scale = get(prefix + SCALE_SUFFIX)
            if grid is None or scale is None or scale.shape != grid or scale.dtype not in E8M0_DTYPES or prefix in linears:
                return None
            linears[prefix] = new(prefix, entry, scale, bias_of(prefix), None, layout.encoding)
    return linears


# --- AMD Quark ---------------------------------------------------------------------------------

QUARK_METHOD = "quark"
FP4, FP8 = "fp4", "fp8_e4m3"
QUARK_FP6 = ("fp6_e2m3", "fp6_e3m2")
QUARK_FP8_TILES = ((128, 128),)  # the block-FP8 tile Quark exports beside OCP-MX (besides channel and tensor)


@dataclass(frozen=True)
class QuarkConfig:
    default: str | None  # the global weight dtype (FP4, FP8 or None: unquantized)
    layers: tuple[tuple[str, str | None], ...]  # (module pattern, weight dtype) of layer_quant_config
    exclude: tuple[str, ...]
    location: str

    @functools.cached_property
    def _excluded(self) -> tuple[frozenset[str], "re.Pattern[str] | None"]:
        """`exclude` as a set of its names and one expression of its patterns: a release lists
        hundreds of modules, matched against every linear (tens of thousands), one by one 5.9 s."""
        patterns = [fnmatch.translate(p) for p in self.exclude if any(c in p for c in "*?[")]
        return frozenset(self.exclude), re.compile("|".join(patterns)) if patterns else None

    def dtype_of(self, prefix: str) -> str | None:
        """The weight dtype Quark's config gives a module: excluded, its layer pattern, else global."""
        names, patterns = self._excluded
        if prefix in names or (patterns is not None and patterns.match(prefix)):
            return None
        for pattern, dtype in self.layers:
            if fnmatch.fnmatchcase(prefix, pattern) or prefix == pattern:
                return dtype
        return self.default


def _quark_weight_dtype(spec: object, at: str) -> str | None:
    """The weight dtype of one Quark layer config, checked: fp4 as OCP-MX, fp8_e4m3, or None; its
    activations, if quantized, dynamic."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f"{at} is {shown(spec)}, expected a layer quantization config")
    inputs = spec.get("input_tensors")
    if isinstance(inputs, list) and len(inputs) == 1:
        inputs = inputs[0]
    if isinstance(inputs, dict) and inputs.get("is_dynamic") is False:
        raise StaticActivationError(f"{at}.input_tensors: static activation scales (is_dynamic false)")
    weight = spec.get("weight")
    if isinstance(weight, list) and len(weight) == 1:
        weight = weight[0]
    if weight is None:
        return None
    if not isinstance(weight, dict):
        raise UnsupportedSourceError(f"{at}.weight is {shown(weight)}: a chain of weight quantizers is not an MX format")
    dtype = weight.get("dtype")
    if dtype in QUARK_FP6:
        raise InexactSourceError(f"{at}.weight.dtype is {shown(dtype)} (OCP-MX FP6): {FP6_WHY}")
    if dtype == FP8:
        return FP8
    if dtype != FP4:
        raise UnsupportedSourceError(
            f"{at}.weight.dtype is {shown(dtype)}; ascendconv reads Quark weights in 'fp4' (OCP-MX) or 'fp8_e4m3'"
        )
    if weight.get("qscheme") != "per_group" or weight.get("group_size") != GROUP_SIZE:
        raise UnsupportedSourceError(
            f"{at}.weight is fp4 with qscheme {shown(weight.get('qscheme'))}, group_size {shown(weight.get('group_size'))}; "
            f"OCP-MX fp4 is qscheme 'per_group' with group_size {GROUP_SIZE}"
        )
    scale_format = weight.get("scale_format", "e8m0")
    if scale_format != "e8m0":
        raise UnsupportedSourceError(
            f"{at}.weight.scale_format is {shown(scale_format)}; an MX scale is E8M0 ('e8m0'), the package's only scale format"
        )
    return FP4


def parse_quark_config(config: dict, config_path: Path) -> QuarkConfig:
    quant, location = find_quantization_config(config)
    where = f"{config_path}: {location}"
    default = _quark_weight_dtype(quant.get("global_quant_config"), f"{where}.global_quant_config")
    layer_configs = quant.get("layer_quant_config") or {}
    if not isinstance(layer_configs, dict):
        raise ConfigError(f"{where}.layer_quant_config is {shown(layer_configs)}, expected an object of module patterns")
    layers = tuple(
        (pattern, _quark_weight_dtype(spec, f"{where}.layer_quant_config[{shown(pattern)}]"))
        for pattern, spec in layer_configs.items()
    )
    exclude = quant.get("exclude") or []
    if not (isinstance(exclude, list) and all(isinstance(e, str) for e in exclude)):
        raise ConfigError(f"{where}.exclude is {shown(exclude)}, expected a list of module names or patterns")
    return QuarkConfig(default, layers, tuple(exclude), location)


def quark_fp8_tile(weight: TensorEntry, scale: TensorEntry) -> tuple[int, int] | None:
    n, k = weight.shape
    if math.prod(scale.shape) == 1 and len(scale.shape) <= 2:
        return n, k
    if scale.shape == (n, 1):
        return 1, k
    for bn, bk in QUARK_FP8_TILES:
        if scale.shape == (-(-n // bn), -(-k // bk)):
            return bn, bk
    return None


class QuarkOcpMx(SourceFormat):
    name = "quark-ocp-mx"
    label = "AMD Quark OCP-MX fp4 (block FP8 elsewhere)"
    quant_method = QUARK_METHOD

    def parse(self, config: dict, config_path: Path) -> QuarkConfig:
        return parse_quark_config(config, config_path)

    def open(self, checkpoint: Checkpoint, quant: QuarkConfig) -> Source:
        tensors = checkpoint.tensors
        layout = LAYOUTS["quark-fp4"]
        linears: dict[str, SourceLinear] = {}
        for name, entry in tensors.items():
            if not name.endswith(WEIGHT_SUFFIX) or entry.dtype not in ("U8", "F8_E4M3"):
                continue
            prefix = name[: -len(WEIGHT_SUFFIX)]
            dtype = quant.dtype_of(prefix)
            stored = FP4 if entry.dtype == "U8" else FP8
            if dtype != stored:
                if entry.dtype == "U8" and prefix + SCALE_SUFFIX not in tensors and dtype is None:
                    continue  # a plain byte tensor of an unquantized module, carried as it is
                raise UnsupportedTensorError(
                    f"{entry.path.name}: {shown(name)} is {entry.dtype} {list(entry.shape)} (stored {stored}), but "
                    f"{checkpoint.config_path.name} gives module {shown(prefix)} "
                    + ("no weight quantization (exclude, or no config)" if dtype is None else f"weight dtype {shown(dtype)}"),
                    "check layer_quant_config, global_quant_config and exclude against the tensors",
                )
            if stored == FP4:
                linears[prefix] = mx_linear(tensors, name, entry, layout, "OCP-MX fp4")
                continue
            scale = tensors.get(prefix + SCALE_SUFFIX)
            if scale is None:
                raise MissingScaleError(
                    f"{entry.path.name}: F8_E4M3 weight {shown(name)} has no {shown(prefix + SCALE_SUFFIX)} in any shard",
                    "a Quark FP8 weight needs its weight_scale (a multiplier); the checkpoint is incomplete",
                )
            if scale.dtype not in ("F32", "BF16", "F16"):
                raise ScaleDtypeError(
                    f"{scale.path.name}: {shown(scale.name)} is {scale.dtype}, expected a float multiplier (F32, BF16 or F16)",
                    "a Quark fp8_e4m3 weight_scale is a float multiplier; E8M0 bytes belong to an fp4 layer",
                )
            tile = quark_fp8_tile(entry, scale)
            if tile is None:
                raise ScaleShapeError(
                    f"{scale.path.name}: {shown(scale.name)} has shape {list(scale.shape)} for weight {list(entry.shape)}: "
                    "not one scale, one per row, nor one per 128 x 128 tile"
                )
            linears[prefix] = SourceLinear(prefix, entry, scale, tensors.get(prefix + ".bias"), tile)
        shown_config = {"location": quant.location, "fmt": "fp4/fp8_e4m3", "modules_to_not_convert": list(quant.exclude)}
        return mx_source(self, checkpoint, quant, linears, [layout], {"global": quant.default}, shown_config)


# --- NVIDIA ModelOpt ---------------------------------------------------------------------------

MODELOPT_METHOD = "modelopt"
MODELOPT_CONFIG = "hf_quant_config.json"  # ModelOpt's own description beside config.json


def modelopt_quantization_config(root: Path) -> dict | None:
    """hf_quant_config.json as a quantization_config (`quant_method: modelopt`), or None."""
    path = root / MODELOPT_CONFIG
    if not os.path.lexists(path):  # one that is there but no regular file is named, not taken for none
        return None
    data = read_json(path, ConfigError)
    quantization = data.get("quantization") if isinstance(data, dict) else None
    if not isinstance(quantization, dict):
        raise ConfigError(f"{path}: no 'quantization' object", "ModelOpt writes {'producer': ..., 'quantization': {...}}")
    return {"quant_method": MODELOPT_METHOD, **quantization}


@dataclass(frozen=True)
class ExcludeConfig:
    """What a format with one MX quantization for every linear keeps of its config: the modules the
    release left unquantized, and where the config sits."""

    exclude: tuple[str, ...]
    location: str


def module_names(value: object, at: str) -> tuple[str, ...]:
    """A config's list of module names or patterns (absent: none), checked."""
    value = value or []
    if not (isinstance(value, list) and all(isinstance(e, str) for e in value)):
        raise ConfigError(f"{at} is {shown(value)}, expected a list of module names or patterns")
    return tuple(value)


def parse_modelopt_config(config: dict, config_path: Path) -> ExcludeConfig:
    quant, location = find_quantization_config(config)
    where = f"{config_path}: {location}"
    nested = quant.get("quantization") if isinstance(quant.get("quantization"), dict) else {}
    algo = quant.get("quant_algo", nested.get("quant_algo"))
    if algo == "NVFP4":
        raise InexactSourceError(f"{where}.quant_algo is 'NVFP4': {NVFP4_WHY}")
    if algo == "MXFP4":
        raise NotYetSupportedSourceError(f"{where}.quant_algo is 'MXFP4': {MODELOPT_MXFP4_WHY}", MODELOPT_MXFP4_HINT)
    if algo != "MXFP8":
        raise UnsupportedSourceError(
            f"{where}.quant_algo is {shown(algo)}; ascendconv reads ModelOpt checkpoints quantized as 'MXFP8'"
        )
    group = quant.get("group_size", nested.get("group_size", GROUP_SIZE))
    if group != GROUP_SIZE:
        raise UnsupportedSourceError(f"{where}.group_size is {shown(group)}; MX groups are {GROUP_SIZE} values")
    exclude = quant.get("exclude_modules", quant.get("ignore", nested.get("exclude_modules")))
    return ExcludeConfig(module_names(exclude, f"{where}.exclude_modules"), location)


class ModelOptMxfp8(SourceFormat):
    name = "modelopt-mxfp8"
    label = "NVIDIA ModelOpt MXFP8"
    quant_method = MODELOPT_METHOD

    def parse(self, config: dict, config_path: Path) -> ExcludeConfig:
        return parse_modelopt_config(config, config_path)

    def open(self, checkpoint: Checkpoint, quant: ExcludeConfig) -> Source:
        layout = LAYOUTS["modelopt-mxfp8"]
        linears = {}
        for name, entry in checkpoint.tensors.items():
            if name.endswith(layout.weight_suffix) and entry.dtype == layout.weight_dtype:
                linear = mx_linear(checkpoint.tensors, name, entry, layout, "ModelOpt MXFP8")
                linears[linear.prefix] = linear
        shown_config = {"location": quant.location, "fmt": "MXFP8", "modules_to_not_convert": list(quant.exclude)}
        return mx_source(self, checkpoint, quant, linears, [layout], {"quant_algo": "MXFP8"}, shown_config)
