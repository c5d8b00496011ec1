"""DeepSeek-V4 native (`model_type: deepseek_v4`): block FP8 as Hugging Face writes it in config.json
(`quant_method: fp8`, `weight_block_size`, `scale_fmt: ue8m0`), but with DeepSeek's own names (no
`model.` prefix: `layers.L.attn.wq_a`, `layers.L.ffn.experts.E.w1`) and each scale named `P.scale`:
F8_E8M0 for attention and shared experts, F32 for the FP8 routed experts of the Base release. The
math is block FP8's (code x tile multiplier); an E8M0 byte b is the multiplier 2**(b-127).

The Flash release stores its routed experts as MXFP4 (I8 packed E2M1 with E8M0 scales per 32,
`expert_dtype: fp4`), which vllm-ascend already serves natively: refused, with that said."""

from __future__ import annotations

from pathlib import Path

from ascendconv.errors import UnsupportedSourceError, shown
from ascendconv.sources.base import Source
from ascendconv.sources.checkpoint import Checkpoint
from ascendconv.sources.hf_fp8_block import BlockFP8Config, HfFp8Block, pair_fp8_linears, parse_block_fp8_config

MODEL_TYPES = ("deepseek_v4",)
SCALE_SUFFIX = ".scale"
SCALE_DTYPES = ("F8_E8M0", "F32")
NATIVE_FP4 = "vllm-ascend serves DeepSeek-V4 with MXFP4 experts as it is (quantization deepseek_v4_fp8): no conversion is needed"


def _expert_dtype(config: dict) -> object:
    text = config.get("text_config")
    return config.get("expert_dtype", text.get("expert_dtype") if isinstance(text, dict) else None)


class DeepSeekV4(HfFp8Block):
    name = "deepseek-v4-fp8"
    label = "DeepSeek-V4 native block FP8"
    quant_method = "fp8"
    model_types = MODEL_TYPES

    def accepts(self, quant: dict | None, config: dict) -> bool:
        return super().accepts(quant, config) and config.get("model_type") in self.model_types

    def parse(self, config: dict, config_path: Path) -> BlockFP8Config:
        if _expert_dtype(config) == "fp4":
            raise UnsupportedSourceError(
                f"{config_path}: expert_dtype is 'fp4': the routed experts are MXFP4 (DeepSeek-V4-Flash)", NATIVE_FP4
            )
        return parse_block_fp8_config(config, config_path)

    def open(self, checkpoint: Checkpoint, quant: BlockFP8Config) -> Source:
        for name, entry in checkpoint.tensors.items():
            if name.endswith(".weight") and entry.dtype == "I8" and name[: -len(".weight")] + SCALE_SUFFIX in checkpoint.tensors:
                raise UnsupportedSourceError(
                    f"{entry.path.name}: {shown(name)} is I8 {list(entry.shape)} with an E8M0 {SCALE_SUFFIX!r}: "
                    "MXFP4 routed experts (DeepSeek-V4-Flash)",
                    NATIVE_FP4,
                )
        if any(name.endswith(SCALE_SUFFIX) for name in checkpoint.tensors):
            linears = pair_fp8_linears(checkpoint.tensors, quant.block, SCALE_SUFFIX, SCALE_DTYPES)
        else:  # re-saved under Hugging Face's scale name
            linears = pair_fp8_linears(checkpoint.tensors, quant.block)
        return self.source(checkpoint, quant, linears)
