"""MX-native source checkpoints made by the tests from the bundled block-FP8 fixtures: each FP8
weight resolved as vllm-ascend resolves it, quantized to MXFP4 or MXFP8 with our numpy reference
(formats/mx.py), and laid out as compressed-tensors, AMD Quark or NVIDIA ModelOpt store it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ascendconv.formats import elements, mx, resolve
from ascendconv.formats.constants import E2M1, E4M3
from conftest import as_array, load_shard
from test_source_formats import respell

MXFP4, MXFP8 = "mxfp4", "mxfp8"


def mx_codes(entry, scale_entry, block, fmt, rule="rceil"):
    """(payload bytes, E8M0 bytes) of one FP8 weight entry, re-quantized to `fmt` by the reference."""
    values = resolve.resolve_tiles(as_array(entry), as_array(scale_entry).astype(np.float32), block, "bf16")
    codes, scales = mx.quantize_mx(values, fmt, rule)
    return (elements.pack_fp4(codes) if fmt is E2M1 else codes), scales


def source_tensors(src: Path) -> dict:
    return {n: e for shard in sorted(src.glob("*.safetensors")) for n, e in load_shard(shard).items()}


def as_mx(src: Path, dst: Path, layout: str, kind_of=lambda prefix: MXFP4, weight_shape: bool = False,
          quant: dict | None = None) -> Path:
    """`src` (block FP8) as an MX checkpoint in `layout` ('ct', 'quark', 'modelopt'): each FP8
    linear becomes what `kind_of(prefix)` says: MXFP4, MXFP8, or None (kept block FP8; Quark only,
    its scale renamed `weight_scale`)."""
    tensors = source_tensors(src)
    block = tuple(json.loads((src / "config.json").read_text())["quantization_config"]["weight_block_size"])
    kinds: dict[str, str | None] = {}

    def tensor(name, entry):
        if name.endswith(".weight_scale_inv"):
            prefix = name[: -len(".weight_scale_inv")]
            return {prefix + ".weight_scale": entry} if kinds.get(prefix) is None else {}
        if entry[0] != "F8_E4M3":
            return {name: entry}
        prefix = name[: -len(".weight")]
        kind = kinds[prefix] = kind_of(prefix)
        if kind is None:
            return {name: entry}
        fmt = E2M1 if kind == MXFP4 else E4M3
        payload, scales = mx_codes(entry, tensors[prefix + ".weight_scale_inv"], block, fmt)
        packed = layout == "ct" and kind == MXFP4
        out = {
            prefix + (".weight_packed" if packed else ".weight"): ("U8" if fmt is E2M1 else "F8_E4M3", payload.shape, payload.tobytes()),
            prefix + ".weight_scale": ("U8", scales.shape, scales.tobytes()),
        }
        if packed and weight_shape:
            out[prefix + ".weight_shape"] = ("I64", (2,), np.array(entry[1], np.int64).tobytes())
        return out

    def config(cfg):
        ignore = cfg["quantization_config"].get("modules_to_not_convert", [])
        return {**cfg, "quantization_config": quant or CONFIGS[layout](ignore, kinds)}

    return respell(src, dst, tensor, config)


def ct_config(ignore, kinds) -> dict:
    groups, formats = {}, sorted({k for k in kinds.values() if k})
    for i, kind in enumerate(formats):
        groups[f"group_{i}"] = {
            "targets": ["Linear"],
            "weights": {"num_bits": 4 if kind == MXFP4 else 8, "type": "float", "strategy": "group", "group_size": 32,
                        "symmetric": True, "dynamic": False},
            "format": "mxfp4-pack-quantized" if kind == MXFP4 else "mxfp8-quantized",
        }
    return {"quant_method": "compressed-tensors", "format": groups["group_0"]["format"] if len(groups) == 1 else "mixed-precision",
            "config_groups": groups, "ignore": list(ignore)}


def quark_config(ignore, kinds) -> dict:
    fp4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0", "ch_axis": -1, "is_dynamic": False}
    fp8 = {"dtype": "fp8_e4m3", "qscheme": "per_channel", "ch_axis": 0, "is_dynamic": False}
    return {
        "quant_method": "quark",
        "export": {"kv_cache_group": [], "pack_method": "reorder"},
        "global_quant_config": {"weight": fp8, "input_tensors": None, "output_tensors": None, "bias": None},
        "layer_quant_config": {"*.experts.*": {"weight": fp4, "input_tensors": None, "output_tensors": None, "bias": None}},
        "exclude": [*ignore, "lm_head"],
    }


def modelopt_config(ignore, kinds) -> dict:
    return {"quant_method": "modelopt", "quant_algo": "MXFP8", "group_size": 32, "exclude_modules": [*ignore, "lm_head"]}


CONFIGS = {"ct": ct_config, "quark": quark_config, "modelopt": modelopt_config}


def experts_mxfp4(prefix: str) -> str | None:
    """Quark's usual mix: routed experts OCP-MX fp4, the rest block FP8."""
    return MXFP4 if ".experts." in prefix else None


def as_vllm_fused(per_expert: Path, dst: Path, edit=lambda tensors: tensors, config_edit=lambda cfg: cfg) -> Path:
    """A compressed-tensors MXFP4 MoE checkpoint (`as_mx(..., "ct", ...)`, every linear MXFP4) laid
    out as a community `quant_method: mxfp4` upload: each layer's experts fused into
    `experts.w13_weight` [E, 2I, H/2] (each expert's gate rows, then its up rows) and
    `experts.w2_weight` [E, H, I/2] with their E8M0 `_scale`s; every other linear unquantized (its
    decoded values in BF16). `edit` may change one layer's fused tensors, `config_edit` config.json."""
    import ml_dtypes

    from ascendconv.formats import relayout

    tensors = source_tensors(per_expert)

    def stacked(layer, projections, suffix):
        count = len({n.split(".experts.")[1].split(".")[0] for n in tensors if n.startswith(layer + ".experts.")})
        parts = [as_array(tensors[f"{layer}.experts.{e}.{p}.{suffix}"]) for e in range(count) for p in projections]
        width = len(projections)
        fused = np.stack([np.concatenate(parts[i : i + width]) for i in range(0, len(parts), width)])
        return ("U8", fused.shape, fused.tobytes())

    def tensor(name, entry):
        if ".experts." in name:
            layer = name.split(".experts.")[0]
            if name != f"{layer}.experts.0.gate_proj.weight_packed":
                return {}
            out = {}
            for fused, projections in (("w13_weight", ("gate_proj", "up_proj")), ("w2_weight", ("down_proj",))):
                out[f"{layer}.experts.{fused}"] = stacked(layer, projections, "weight_packed")
                out[f"{layer}.experts.{fused}_scale"] = stacked(layer, projections, "weight_scale")
            return edit(out)
        if name.endswith(".weight_packed"):
            prefix = name[: -len(".weight_packed")]
            scale = as_array(tensors[prefix + ".weight_scale"])
            values = relayout.decode(as_array(entry).view(np.uint8), scale, E2M1).astype(ml_dtypes.bfloat16)
            return {prefix + ".weight": ("BF16", values.shape, values.tobytes())}
        if name.endswith((".weight_scale", ".weight_shape")):
            return {}
        return {name: entry}

    def config(cfg):
        return config_edit({**cfg, "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}})

    return respell(per_expert, dst, tensor, config)
