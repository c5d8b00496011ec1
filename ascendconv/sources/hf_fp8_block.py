"""Hugging Face block-wise FP8 (DeepSeek-V3, Qwen3-*-FP8, MiniMax-M2, Kimi-K2): `quant_method: fp8`
with `weight_block_size`; each F8_E4M3 `P.weight` [N, K] has a `P.weight_scale_inv`, F32 or BF16,
[cdiv(N, bn), cdiv(K, bk)], a multiplier despite its name (docs/sources.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ascendconv.errors import (
    ConfigError,
    MissingScaleError,
    NotBlockFP8Error,
    OrphanScaleError,
    ScaleDtypeError,
    ScaleShapeError,
    StaticActivationError,
    UnsupportedTensorError,
    shown,
)
from ascendconv.io.safetensors import TensorEntry
from ascendconv.sources.base import BIAS_SUFFIX, WEIGHT_SUFFIX, Encoding, Source, SourceFormat, SourceLinear, new_linear
from ascendconv.sources.checkpoint import Checkpoint, find_quantization_config

SCALE_SUFFIX = ".weight_scale_inv"
# A per-tensor FP8 weight among block-FP8 ones (Qwen3.8-Flash-Next's n-gram table): one multiplier
# stored as `P.weight_scale`, a tile of the whole weight.
PER_TENSOR_SUFFIX = ".weight_scale"
SCALE_DTYPES = ("F32", "BF16")
MAX_BLOCK = 2**31 - 1  # tile sides beyond any checkpoint, within the kernels' integer arithmetic
# How configs name the E4M3 format (DeepSeek: "e4m3"; MiniMax-M2: "float8_e4m3fn", torch's name).
# The name only has to mean E4M3: each weight's F8_E4M3 dtype is what pair_fp8_linears checks.
E4M3_SPELLINGS = ("e4m3", "e4m3fn", "float8_e4m3fn", "float8_e4m3", "fp8_e4m3")


@dataclass(frozen=True)
class BlockFP8Config:
    """`quantization_config` of a block-wise FP8 checkpoint."""

    block: tuple[int, int]  # (rows of N, columns of K) per scale tile
    activation_scheme: str
    fmt: str
    scale_fmt: str | None
    modules_to_not_convert: tuple[str, ...]
    location: str  # "quantization_config" or "text_config.quantization_config"


def parse_block_tile(block: object, where: str) -> tuple[int, int]:
    """[bn, bk] of a config, checked: two integers from 1 to MAX_BLOCK."""
    if not (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= MAX_BLOCK for b in block)
    ):
        raise ConfigError(f"{where} is {shown(block)}, expected [bn, bk] (integers from 1 to {MAX_BLOCK})")
    return block[0], block[1]


def parse_block_fp8_config(config: dict, config_path: Path) -> BlockFP8Config:
    """Accept only block-wise FP8 with dynamic activations; name the reason otherwise."""
    quant, location = find_quantization_config(config)
    if quant is None:
        raise NotBlockFP8Error(f"{config_path}: no quantization_config (this is not an FP8 checkpoint)")
    method = quant.get("quant_method")
    if method != "fp8":
        raise NotBlockFP8Error(f"{config_path}: {location}.quant_method is {shown(method)}, expected 'fp8'")
    block = quant.get("weight_block_size")
    if block is None:
        raise NotBlockFP8Error(
            f"{config_path}: {location} has no weight_block_size (per-tensor FP8 is not block-wise FP8)"
        )
    tile = parse_block_tile(block, f"{config_path}: {location}.weight_block_size")
    # a key written null (a config dumped from an object whose field was unset) is the key left out
    scheme = "dynamic" if quant.get("activation_scheme") is None else quant["activation_scheme"]
    spelled = scheme.lower() if isinstance(scheme, str) else scheme
    if spelled == "static":
        raise StaticActivationError(
            f"{config_path}: {location}.activation_scheme is {shown(scheme)}: static activation scales; only 'dynamic' is supported"
        )
    if spelled != "dynamic":  # not a scheme at all (NaN, a number, a misspelling): not told for a static one
        raise ConfigError(
            f"{config_path}: {location}.activation_scheme is {shown(scheme)}, expected 'dynamic' (or 'static', which is not supported)",
            "fix config.json's activation_scheme, or download it again",
        )
    fmt = "e4m3" if quant.get("fmt") is None else quant["fmt"]
    if not (isinstance(fmt, str) and fmt.lower() in E4M3_SPELLINGS):
        raise NotBlockFP8Error(
            f"{config_path}: {location}.fmt is {shown(fmt)}; only E4M3 weights are supported "
            f"({', '.join(repr(s) for s in E4M3_SPELLINGS)})"
        )
    skipped = quant.get("modules_to_not_convert") or quant.get("ignored_layers") or []
    if not (isinstance(skipped, list) and all(isinstance(m, str) for m in skipped)):
        raise ConfigError(
            f"{config_path}: {location}.modules_to_not_convert is {shown(skipped)}, expected a list of module names"
        )
    return BlockFP8Config(
        block=tile,
        activation_scheme=scheme,
        fmt=fmt,
        scale_fmt=quant.get("scale_fmt"),
        modules_to_not_convert=tuple(skipped),
        location=location,
    )


FP8_WEIGHT_DTYPES = ("F8_E4M3", "F8_E5M2")


def fp8_weight_prefix(name: str, entry: TensorEntry) -> str | None:
    """The module prefix of an FP8 weight (a 2-D F8_E4M3 `P.weight`), None for a tensor that is not
    FP8; any other FP8 tensor is refused, in every FP8 spelling."""
    if entry.dtype not in FP8_WEIGHT_DTYPES:
        return None
    if entry.dtype == "F8_E5M2" or not name.endswith(WEIGHT_SUFFIX) or len(entry.shape) != 2:
        raise UnsupportedTensorError(
            f"{entry.path.name}: tensor {shown(name)} is {entry.dtype} {list(entry.shape)}; only 2-D "
            "F8_E4M3 '.weight' tensors are supported",
            "this checkpoint uses an FP8 layout ascendconv does not know",
        )
    return name[: -len(WEIGHT_SUFFIX)]


def pair_fp8_linears(
    tensors: dict[str, TensorEntry],
    block: tuple[int, int],
    scale_suffix: str = SCALE_SUFFIX,
    scale_dtypes: tuple[str, ...] = SCALE_DTYPES,
    tile_key: str = "weight_block_size",
) -> dict[str, SourceLinear]:
    """Pair every F8_E4M3 weight with its tile scale (`P.weight` + `P<scale_suffix>`) and check the
    scale's dtype and shape. The FP8 spellings differ only in the suffix and the scale dtypes."""
    linears = _pair_faultless(tensors, block, scale_suffix, scale_dtypes)
    return linears if linears is not None else _pair_naming_faults(tensors, block, scale_suffix, scale_dtypes, tile_key)


def _pair_faultless(
    tensors: dict[str, TensorEntry], block: tuple[int, int], scale_suffix: str, scale_dtypes: tuple[str, ...]
) -> dict[str, SourceLinear] | None:
    """pair_fp8_linears of a checkpoint without a fault, or None at the first sign of one (then
    `_pair_naming_faults` names the first in source order). It makes no name per scale or per
    bias (a full-scale checkpoint has a hundred thousand linears): scales are counted, each must
    be a linear's, and the few biases are given to their linears at the end (met in the same pass,
    among the tensors that are not FP8: a hundred thousand fewer name tests than a pass of their own)."""
    linears: dict[str, SourceLinear] = {}
    biases: dict[str, TensorEntry] = {}  # module prefix -> its bias
    get, new, tiles = tensors.get, new_linear, Encoding.FP8_TILES
    suffix_len, bias_len = len(WEIGHT_SUFFIX), len(BIAS_SUFFIX)
    grids: dict[tuple[int, int], tuple[int, int]] = {}  # weight shape -> its scale's (a few dozen shapes)
    bn, bk = block
    scales = per_tensor = 0
    for name, entry in tensors.items():
        if name.endswith(scale_suffix):
            scales += 1
            continue
        dtype = entry.dtype
        if dtype not in FP8_WEIGHT_DTYPES:
            if name.endswith(BIAS_SUFFIX):  # an FP8 '.bias' is no '.weight': a fault, returned below
                biases[name[:-bias_len]] = entry
            continue
        shape = entry.shape
        if dtype != "F8_E4M3" or len(shape) != 2 or name[-suffix_len:] != WEIGHT_SUFFIX:
            return None
        prefix = name[:-suffix_len]
        scale = get(prefix + scale_suffix)
        if scale is None:
            scale = get(prefix + PER_TENSOR_SUFFIX)
            if scale is None or scale.numel != 1 or len(scale.shape) > 2 or scale.dtype not in scale_dtypes:
                return None
            linears[prefix] = new(prefix, entry, scale, None, shape, tiles)
            per_tensor += 1
            continue
        expected = grids.get(shape)
        if expected is None:
            expected = grids[shape] = (-(-shape[0] // bn), -(-shape[1] // bk))
        if scale.shape != expected or scale.dtype not in scale_dtypes:
            return None
        linears[prefix] = new(prefix, entry, scale, None, block, tiles)
    # each linear found its own scale by name: as many scales as those linears, and none is an orphan
    if scales != len(linears) - per_tensor:
        return None
    for prefix, bias in biases.items():
        linear = linears.get(prefix)
        if linear is not None:  # in its place: the linears stay in their weights' order
            linears[prefix] = new(prefix, linear.weight, linear.scale, bias, linear.block, tiles)
    return linears


def _scale_dtype_hint(scale_suffix: str, scale_dtypes: tuple[str, ...]) -> str:
    """The hint for a scale of the wrong dtype, in the format's own spelling (DeepSeek-V4: `scale`)."""
    return f"each {scale_suffix[1:]!r} tensor must be {' or '.join(scale_dtypes)}"


def _pair_naming_faults(
    tensors: dict[str, TensorEntry],
    block: tuple[int, int],
    scale_suffix: str,
    scale_dtypes: tuple[str, ...],
    tile_key: str,
) -> dict[str, SourceLinear]:
    """pair_fp8_linears tensor by tensor, in source order: the first fault is the one named."""
    linears: dict[str, SourceLinear] = {}
    get = tensors.get
    grids: dict[tuple[int, int], tuple[int, int]] = {}  # weight shape -> its scale's (a few dozen shapes)
    bn, bk = block
    fp8_dtypes, suffix_len = FP8_WEIGHT_DTYPES, len(WEIGHT_SUFFIX)
    for name, entry in tensors.items():
        if name.endswith(scale_suffix):
            weight_name = name[: -len(scale_suffix)] + WEIGHT_SUFFIX
            weight = get(weight_name)
            if weight is None or weight.dtype != "F8_E4M3":
                found = "is missing" if weight is None else f"is {weight.dtype}"
                raise OrphanScaleError(
                    f"{entry.path.name}: scale {shown(name)} has no F8_E4M3 weight: {shown(weight_name)} {found}",
                    f"a {scale_suffix[1:]} has no F8_E4M3 weight beside it; the checkpoint is incomplete",
                )
            continue
        if entry.dtype not in fp8_dtypes:
            continue
        shape = entry.shape
        if entry.dtype != "F8_E4M3" or len(shape) != 2 or not name.endswith(WEIGHT_SUFFIX):
            fp8_weight_prefix(name, entry)  # raises, naming the layout
        prefix = name[:-suffix_len]
        scale = get(prefix + scale_suffix)
        if scale is None:
            per_tensor = get(prefix + PER_TENSOR_SUFFIX)
            if per_tensor is not None and per_tensor.numel == 1 and len(per_tensor.shape) <= 2:
                if per_tensor.dtype not in scale_dtypes:
                    raise ScaleDtypeError(
                        f"{per_tensor.path.name}: {shown(per_tensor.name)} (a per-tensor scale) is {per_tensor.dtype}, "
                        f"expected one of {', '.join(scale_dtypes)}",
                        _scale_dtype_hint(PER_TENSOR_SUFFIX, scale_dtypes),
                    )
                linears[prefix] = new_linear(prefix, entry, per_tensor, get(prefix + BIAS_SUFFIX), shape, Encoding.FP8_TILES)
                continue
            raise MissingScaleError(
                f"{entry.path.name}: F8_E4M3 weight {shown(name)} has no {shown(prefix + scale_suffix)} in any shard",
                f"every F8_E4M3 weight needs its {scale_suffix[1:]}; the checkpoint is incomplete",
            )
        if scale.dtype not in scale_dtypes:
            raise ScaleDtypeError(
                f"{scale.path.name}: {shown(scale.name)} is {scale.dtype}, expected one of {', '.join(scale_dtypes)}",
                _scale_dtype_hint(scale_suffix, scale_dtypes),
            )
        expected = grids.get(shape)
        if expected is None:
            expected = grids[shape] = (-(-shape[0] // bn), -(-shape[1] // bk))
        if scale.shape != expected:
            raise ScaleShapeError(
                f"{scale.path.name}: {shown(scale.name)} has shape {list(scale.shape)}, expected {list(expected)} "
                f"for weight {list(shape)} with {tile_key} {list(block)}"
            )
        linears[prefix] = new_linear(prefix, entry, scale, get(prefix + BIAS_SUFFIX), block, Encoding.FP8_TILES)
    return linears


class HfFp8Block(SourceFormat):
    name = "hf-fp8-block"
    label = "Hugging Face block FP8"
    quant_method = "fp8"
    model_types: tuple[str, ...] = ()  # every model type but those of a more specific FP8 spelling

    def accepts(self, quant: dict | None, config: dict) -> bool:
        return quant is not None and quant.get("quant_method") == "fp8"

    def parse(self, config: dict, config_path: Path) -> BlockFP8Config:
        return parse_block_fp8_config(config, config_path)

    def open(self, checkpoint: Checkpoint, quant: BlockFP8Config) -> Source:
        linears = pair_fp8_linears(checkpoint.tensors, quant.block)
        return self.source(checkpoint, quant, linears)

    def source(self, checkpoint: Checkpoint, quant: BlockFP8Config, linears: dict[str, SourceLinear]) -> Source:
        quant_config, _ = find_quantization_config(checkpoint.config)
        shown_config = {
            "format": self.name,
            "label": self.label,
            "location": quant.location,
            "quant_method": quant_config.get("quant_method") if quant_config else None,
            "weight_block_size": list(quant.block),
            "activation_scheme": quant.activation_scheme,
            "fmt": quant.fmt,
            "scale_fmt": quant.scale_fmt,
            "modules_to_not_convert": list(quant.modules_to_not_convert),
        }
        return Source(checkpoint, self.name, quant, linears, {"weight_block_size": list(quant.block)}, shown_config)
