"""`quant_method: mxfp4` checkpoints: MoE experts already MXFP4, stored fused per layer.

Two layouts answer to this quant_method, told apart by their tensor names:

- vLLM's FusedMoE parameters (community MXFP4 uploads of Gemma-4, among others): `P.w13_weight` U8
  [E, 2I, H/2] with `P.w13_weight_scale` U8 [E, 2I, H/32], gate rows first and then up, and
  `P.w2_weight` U8 [E, H, I/2] with `P.w2_weight_scale` U8 [E, H, I/32]; packed E2M1, element 2j
  in the low nibble, E8M0 bytes per 32 along K. Each expert's gate, up and down rows are a
  contiguous byte range of the stored tensors, so they become per-expert MX linears
  `P.E.{gate,up,down}_proj` (as vLLM's loader and msModelSlim name experts), re-laid out byte for
  byte. Everything else (attention, norms, routers) is stored unquantized and copied.
- gpt-oss (`model_type: gpt_oss`, `P.gate_up_proj_blocks` / `_scales` / `_bias`, gate and up rows
  interleaved): its bytes would re-lay out exactly too, but the target cannot run it, so it is
  refused (BlockedByTargetError), as is any fused layout carrying expert biases.
"""

from __future__ import annotations

from pathlib import Path

from ascendconv.errors import BlockedByTargetError, StaticActivationError, UnsupportedTensorError, shown
from ascendconv.formats.constants import GROUP_SIZE
from ascendconv.io.safetensors import TensorEntry
from ascendconv.sources.base import WEIGHT_SUFFIX, Encoding, Source, SourceFormat
from ascendconv.sources.checkpoint import Checkpoint, expert_slices, find_quantization_config
from ascendconv.sources.mx_native import SCALE_SUFFIX, ExcludeConfig, MxLayout, module_names, mx_linear, mx_source

MXFP4_METHOD = "mxfp4"
# What the target lacks for gpt-oss, whatever the format its experts come in (MXFP4 or a BF16 re-upload).
GPT_OSS_TARGET = (
    "vllm-ascend's MX MoE schemes pass no expert biases (gate_up_proj_bias / down_proj_bias) and have no "
    "swigluoai MXFP4 path, and vllm-ascend loads no 'mxfp4' quantization nor gpt_oss packed modules"
)
GPT_OSS_WHY = f"gpt-oss is blocked by the target, not by its bytes: its MXFP4 experts would re-lay out exactly, but {GPT_OSS_TARGET}"
GPT_OSS_HINT = (
    "serve a BF16 re-upload of the model with vllm-ascend as it is (unquantized); ascendconv refuses that one too, "
    "since MX experts would lose the expert biases"
)
GPT_OSS_TENSORS = ("_blocks", "_scales")  # gpt-oss's suffixes for payload and scale
# vLLM's FusedMoE parameter names: (stored tensor, the projections its rows hold, in order)
FUSED = {"w13_weight": ("gate_proj", "up_proj"), "w2_weight": ("down_proj",)}
FUSED_BIASES = ("w13_bias", "w2_bias")
FUSED_INPUT_SCALES = ("w13_input_scale", "w2_input_scale")  # FusedMoE's static activation scales
# What a split expert linear is: a packed E2M1 `.weight` with its `.weight_scale` (the package's names).
SPLIT_LAYOUT = MxLayout("vllm-fused-mxfp4", Encoding.MX_E2M1, WEIGHT_SUFFIX, "U8")


def parse_mxfp4_config(config: dict, config_path: Path) -> ExcludeConfig:
    quant, location = find_quantization_config(config)
    where = f"{config_path}: {location}"
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    if "gpt_oss" in (config.get("model_type"), text.get("model_type")):
        raise BlockedByTargetError(f"{where}.quant_method is 'mxfp4' and model_type 'gpt_oss': {GPT_OSS_WHY}", GPT_OSS_HINT)
    return ExcludeConfig(module_names(quant.get("modules_to_not_convert"), f"{where}.modules_to_not_convert"), location)


def split_fused(tensors: dict[str, TensorEntry]) -> dict[str, TensorEntry]:
    """The tensors with each fused `P.w13_weight` / `P.w2_weight` and its `_scale` replaced by
    per-expert `P.E.{proj}.weight` / `.weight_scale` slices, in place; every shape checked."""
    out: dict[str, TensorEntry] = {}
    for name, entry in tensors.items():
        stored = next((f for f in FUSED if name.endswith("." + f) or name.endswith("." + f + "_scale")), None)
        if stored is None:
            out[name] = entry
            continue
        experts, is_scale = name[: name.rindex("." + stored)], name.endswith("_scale")
        weight = tensors.get(f"{experts}.{stored}")
        scale = tensors.get(f"{experts}.{stored}_scale")
        if is_scale and weight is not None:
            continue  # split with its weight
        if weight is None or scale is None:
            raise UnsupportedTensorError(
                f"{entry.path.name}: fused MXFP4 expert tensor {shown(name)} has no "
                f"{shown(f'{experts}.{stored}' + ('' if is_scale else '_scale'))} in any shard",
                "a fused MXFP4 layer needs its payload and its E8M0 scale; the checkpoint is incomplete",
            )
        projections = FUSED[stored]
        check_fused(weight, scale, len(projections))
        rows = weight.shape[1] // len(projections)
        parts = tuple((projection, rows) for projection in projections)
        out.update(expert_slices(weight, experts, parts, WEIGHT_SUFFIX, tensors))
        out.update(expert_slices(scale, experts, parts, SCALE_SUFFIX, tensors))
    return out


def check_fused(weight: TensorEntry, scale: TensorEntry, halves: int) -> None:
    """A fused MXFP4 payload U8 [E, rows, K/2] and its E8M0 scale U8 [E, rows, K/32], rows split
    evenly into `halves` projections."""
    shape = weight.shape
    if weight.dtype != "U8" or len(shape) != 3 or 0 in shape or shape[1] % halves:
        raise UnsupportedTensorError(
            f"{weight.path.name}: fused MXFP4 expert tensor {shown(weight.name)} is {weight.dtype} {list(shape)}, "
            f"expected U8 [E, {'2I' if halves == 2 else 'H'}, K/2] (packed E2M1{', gate rows then up rows' if halves == 2 else ''})",
            "this checkpoint stores its fused experts in a layout ascendconv does not know",
        )
    expected = (shape[0], shape[1], 2 * shape[2] // GROUP_SIZE)
    if scale.dtype not in ("U8", "F8_E8M0") or scale.shape != expected or (2 * shape[2]) % GROUP_SIZE:
        raise UnsupportedTensorError(
            f"{scale.path.name}: {shown(scale.name)} is {scale.dtype} {list(scale.shape)}, expected U8 {list(expected)} "
            f"(one E8M0 byte per {GROUP_SIZE} values along K) for {shown(weight.name)} {list(shape)}",
            "MX groups are 32 values along K; check the checkpoint's tensors",
        )


class VllmFusedMxfp4(SourceFormat):
    name = "mxfp4-fused"
    label = "MXFP4 experts fused as vLLM's FusedMoE stores them (quant_method mxfp4)"
    quant_method = MXFP4_METHOD

    def parse(self, config: dict, config_path: Path) -> ExcludeConfig:
        return parse_mxfp4_config(config, config_path)

    def open(self, checkpoint: Checkpoint, quant: ExcludeConfig) -> Source:
        for name, entry in checkpoint.tensors.items():
            if ".experts." in name and name.endswith(GPT_OSS_TENSORS):
                raise BlockedByTargetError(f"{entry.path.name}: {shown(name)} is gpt-oss's expert layout: {GPT_OSS_WHY}", GPT_OSS_HINT)
            if name.rsplit(".", 1)[-1] in FUSED_BIASES:
                raise BlockedByTargetError(
                    f"{entry.path.name}: {shown(name)} is an expert bias: vllm-ascend's MX MoE schemes pass no expert biases",
                    GPT_OSS_HINT,
                )
            if name.rsplit(".", 1)[-1] in FUSED_INPUT_SCALES:
                raise StaticActivationError(f"{entry.path.name}: {shown(name)} is a static activation scale of fused experts")
        tensors = split_fused(checkpoint.tensors)
        linears = {}
        for name, entry in tensors.items():
            if name not in checkpoint.tensors and name.endswith(WEIGHT_SUFFIX):
                linear = mx_linear(tensors, name, entry, SPLIT_LAYOUT, "fused MXFP4 expert")
                linears[linear.prefix] = linear
        if not linears:
            raise UnsupportedTensorError(
                f"{checkpoint.root}: quant_method is 'mxfp4' but no tensor is a fused MXFP4 expert "
                f"({', '.join('P.' + f for f in FUSED)} with their _scale)",
                "ascendconv reads quant_method 'mxfp4' checkpoints whose experts are stored as vLLM's FusedMoE stores them",
            )
        shown_config = {"location": quant.location, "fmt": "MXFP4", "modules_to_not_convert": list(quant.exclude),
                        "fused_experts_split": sum(1 for n in checkpoint.tensors if n not in tensors)}
        params = {"layout": "vllm-fused", "fused_experts_split": shown_config["fused_experts_split"]}
        return mx_source(self, checkpoint, quant, linears, [SPLIT_LAYOUT], params, shown_config, tensors)
