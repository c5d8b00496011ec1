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
