"""Plain float checkpoints (BF16 / F16 / F32, no quantization_config): what most models ship.

Nothing is resolved: the MX quantizer takes the values themselves. Which 2-D weights are
quantizable linears is a matter of names: a `.weight` whose module ends in one of the projection
names below (every family's spelling of attention, MLP, expert, MLA, linear-attention and indexer
projections). Embeddings, `lm_head`, norms, routers (`mlp.gate`), convolutions and everything else
are carried as they are, as msModelSlim and vllm-ascend expect; the model's rules then keep some of
the quantizable ones FLOAT too (MTP layers, `kv_b_proj`, vision towers), and those are copied
byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

from ascendconv.errors import BlockedByTargetError, NoQuantizableLinearError, UnrecognizedCheckpointError, UnsupportedTensorError, shown
from ascendconv.io.safetensors import TensorEntry
from ascendconv.sources.base import WEIGHT_SUFFIX, Encoding, Source, SourceFormat, SourceLinear
from ascendconv.sources.checkpoint import Checkpoint, expert_slices
from ascendconv.sources.mx_native import PACKED_SUFFIX
from ascendconv.sources.mxfp4_fused import FUSED, GPT_OSS_HINT, GPT_OSS_TARGET, GPT_OSS_TENSORS

FLOAT_DTYPES = ("BF16", "F16", "F32")
FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")
# MX payloads and E8M0 scales are stored as bytes: a byte tensor is quantized by its name alone;
# a projection's weight stored in any integer type holds codes (packed ones in the wider types)
BYTE_DTYPES = ("U8", "I8")
INTEGER_DTYPES = (*BYTE_DTYPES, "U16", "I16", "U32", "I32", "U64", "I64")
FUSED_MX_TENSORS = frozenset({*FUSED, *(f + "_scale" for f in FUSED)})  # vLLM's fused MXFP4 experts
LINEAR_PROJECTIONS = frozenset({
    # attention
    "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "query_key_value", "dense", "c_attn", "c_proj",
    "out_proj", "wq", "wk", "wv", "wo",
    # MLA (DeepSeek, Kimi, GLM-5) and DeepSeek-V4's native names
    "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "wq_a", "wq_b", "wkv", "wo_a", "wo_b",
    # MLP and experts
    "gate_proj", "up_proj", "down_proj", "gate_up_proj", "w1", "w2", "w3", "fc1", "fc2",
    "dense_h_to_4h", "dense_4h_to_h",
    # gated-DeltaNet linear attention (Qwen3-Next, Qwen3.5) and sparse-attention indexers
    "in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b",
    "index_q_proj", "index_k_proj",
})


def is_quantized_payload(name: str, dtype: str) -> bool:
    """Whether a tensor of a checkpoint without quantization_config holds quantized values: any FP8
    tensor, an integer tensor named as a projection's weight, and a byte tensor named as a packed
    MXFP4 weight or fused MXFP4 experts (vLLM's, gpt-oss's). Copied as FLOAT, such codes would be
    taken for values."""
    if dtype in FP8_DTYPES:
        return True
    if dtype not in INTEGER_DTYPES:
        return False
    module, _, leaf = name.rpartition(".")
    if name.endswith(WEIGHT_SUFFIX):
        return module.rpartition(".")[2] in LINEAR_PROJECTIONS
    if dtype not in BYTE_DTYPES:
        return False
    return leaf in FUSED_MX_TENSORS or name.endswith(PACKED_SUFFIX) or (".experts." in name and leaf.endswith(GPT_OSS_TENSORS))


def is_quantizable(name: str, dtype: str, shape: tuple[int, ...]) -> bool:
    """A 2-D float `.weight` of a module named as a linear projection."""
    if not name.endswith(WEIGHT_SUFFIX) or dtype not in FLOAT_DTYPES or len(shape) != 2:
        return False
    return name[: -len(WEIGHT_SUFFIX)].rsplit(".", 1)[-1] in LINEAR_PROJECTIONS


class PlainFloat(SourceFormat):
    name = "float"
    label = "plain float (BF16 / F16 / F32)"
    quant_method = None

    def accepts(self, quant: dict | None, config: dict) -> bool:
        return quant is None

    def parse(self, config: dict, config_path: Path) -> None:
        # gpt-oss's BF16 re-uploads store their experts fused [E, H, 2I] with gate and up columns
        # interleaved, beside expert biases: refused by the target (as its MXFP4 release is) before a
        # shard is read, rather than as a transposed layout whose fix would split the experts wrongly
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        if "gpt_oss" in (config.get("model_type"), text.get("model_type")):
            raise BlockedByTargetError(
                f"{config_path}: model_type is 'gpt_oss': gpt-oss is blocked by the target, in BF16 as in MXFP4: "
                f"{GPT_OSS_TARGET}",
                GPT_OSS_HINT,
            )
        return None

    def open(self, checkpoint: Checkpoint, quant: None) -> Source:
        logical = split_fused_experts(checkpoint.tensors, checkpoint.config)
        tensors = checkpoint.tensors if logical is None else logical
        quantized = next((n for n, e in tensors.items() if e.dtype not in FLOAT_DTYPES and is_quantized_payload(n, e.dtype)), None)
        if quantized is not None:
            entry = tensors[quantized]
            what = "" if entry.dtype in FP8_DTYPES else ", named as a quantized weight or its scale"
            raise UnrecognizedCheckpointError(
                f"{checkpoint.root}: holds {entry.dtype} tensors (e.g. {shown(quantized)}{what}) but "
                f"{checkpoint.config_path.name} has no quantization_config",
                "a quantized checkpoint must describe its quantization in config.json; fix config.json or "
                "download the checkpoint again",
            )
        linears = {
            name[: -len(WEIGHT_SUFFIX)]: SourceLinear(
                name[: -len(WEIGHT_SUFFIX)], entry, None, tensors.get(name[: -len(WEIGHT_SUFFIX)] + ".bias"),
                None, Encoding.FLOAT,
            )
            for name, entry in tensors.items()
            if is_quantizable(name, entry.dtype, entry.shape) and 0 not in entry.shape
        }
        if not linears:
            raise NoQuantizableLinearError(
                f"{checkpoint.root}: no quantizable float linear (a 2-D BF16 / F16 / F32 '.weight' of a projection) "
                "and no quantization_config",
                "ascendconv converts quantized checkpoints and plain float ones with linear layers",
            )
        dtypes = sorted({linear.weight.dtype for linear in linears.values()})
        fused = sorted(n for n in checkpoint.tensors if logical is not None and n not in logical)
        shown_config = {
            "format": self.name, "label": self.label, "location": None, "quant_method": None,
            "weight_block_size": None, "activation_scheme": None, "fmt": "/".join(dtypes), "scale_fmt": None,
            "modules_to_not_convert": [], "fused_experts_split": len(fused),
        }
        params = {"dtypes": dtypes, "fused_experts_split": len(fused)}
        return Source(checkpoint, self.name, quant, linears, params, shown_config, logical)


# Fused 3-D experts (transformers v5, several BF16 masters): `P.experts.gate_up_proj` [E, 2I, H]
# (gate rows first, then up) and `P.experts.down_proj` [E, H, I], optionally with a `.weight` suffix.
# Each expert's gate, up and down is a contiguous byte range of the stored tensor, so it becomes a
# per-expert tensor of its own, named as msModelSlim and vLLM's FusedMoE loader name experts.
FUSED_EXPERTS = re.compile(r"^(?P<experts>.+\.experts)\.(?P<proj>gate_up_proj|down_proj)(?:\.weight)?$")


def _hidden_size(config: dict) -> int | None:
    text = config.get("text_config")
    value = config.get("hidden_size", text.get("hidden_size") if isinstance(text, dict) else None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def split_fused_experts(tensors: dict[str, TensorEntry], config: dict) -> dict[str, TensorEntry] | None:
    """The tensors with every fused 3-D expert tensor replaced by its per-expert slices (in place,
    so reading stays sequential), or None when there is none."""
    hidden = _hidden_size(config)
    out: dict[str, TensorEntry] = {}
    split = False
    for name, entry in tensors.items():
        match = FUSED_EXPERTS.match(name)
        if match is None or len(entry.shape) != 3:
            out[name] = entry
            continue
        if entry.dtype not in FLOAT_DTYPES:
            raise UnsupportedTensorError(
                f"{entry.path.name}: fused expert tensor {shown(name)} is {entry.dtype} {list(entry.shape)}",
                "ascendconv splits fused 3-D experts of float checkpoints; quantized ones must be stored per expert",
            )
        rows, cols = entry.shape[1:]
        gate_up = match["proj"] == "gate_up_proj"
        if hidden is not None and cols != hidden and (gate_up or rows == hidden):
            raise UnsupportedTensorError(
                f"{entry.path.name}: fused expert tensor {shown(name)} is {list(entry.shape)}, but config.json's "
                f"hidden_size is {hidden}: the layout [E, out, in] is expected ({'[E, 2I, H]' if gate_up else '[E, H, I]'})",
                "a transposed [E, in, out] layout is not read; store the experts as [E, out, in]",
            )
        if gate_up and rows % 2:
            raise UnsupportedTensorError(
                f"{entry.path.name}: fused expert tensor {shown(name)} has {rows} rows: gate and up halves need an even count"
            )
        parts = (("gate_proj", rows // 2), ("up_proj", rows // 2)) if gate_up else (("down_proj", rows),)
        out.update(expert_slices(entry, match["experts"], parts, WEIGHT_SUFFIX, tensors))
        split = True
    return out if split else None
