"""What ascendconv knows about each model family, in one place. Pure: no I/O.

vllm-ascend decides how it loads an AscendV1 package per `model_type` (its modelslim config's
packed-module mapping, its unquantized-layer rules, vLLM's model files). The rules here are that
knowledge, written for the converter: which modules the runtime fuses (and so must share a type),
how routed and shared experts are named, which layers are multi-token-prediction (MTP) layers, which
modules stay FLOAT by default and why, and how tensor parallelism splits each linear. The source of
each rule is the comment next to it.

`rules_for(config)` gives the rules of a config.json; a `model_type` not listed gets the generic
rules (every family's naming at once, any `experts.N.<proj>` is a routed expert) and a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

# Projection names of a routed / shared expert, as (gate, up, down): the down projection is the
# row-parallel one (K is the expert's intermediate size).
GATE_UP_DOWN = ("gate_proj", "up_proj", "down_proj")
W1_W3_W2 = ("w1", "w3", "w2")  # MiniMax (Mixtral naming): w1 gate, w3 up, w2 down

# Modules the runtime fuses into one parameter, as (member names, fused name); vllm-ascend's
# packed_modules_model_mapping lists the same per model_type.
QKV = (("q_proj", "k_proj", "v_proj"), "qkv_proj")
GATE_UP = (("gate_proj", "up_proj"), "gate_up_proj")
MLA_QKV_A = (("q_a_proj", "kv_a_proj_with_mqa"), "fused_qkv_a_proj")  # DeepSeek MLA's down projections

# Why a module stays FLOAT by default (the package then holds its BF16-resolved weight).
# vllm-ascend's MLA splits kv_b_proj into the absorbed W_UK / W_UV matrices at load, from a float
# weight (the AscendV1 contract, section 3).
KV_B_REASON = "kv_b_proj stays FLOAT (vllm-ascend absorbs it into MLA attention)"
# vLLM's DeepSeek-V3.2 indexer fuses wk with the BF16 weights_proj into one projection built without
# a quant config; its loader can only upcast an FP8 wk that has a block scale (weight_scale_inv).
INDEXER_WK_REASON = "indexer.wk stays FLOAT (vLLM fuses it with the BF16 weights_proj, unquantized)"
# vllm-ascend runs the DeepSeek MTP layer unquantized (its MTP support note: the layer stays
# bfloat16 and is described FLOAT; its docs: DeepSeek MTP supports only FLOAT); msModelSlim likewise
# leaves MTP layers unquantized by default. Qwen3-Next's mtp.* gets the same rule (assumed: no public
# source says how vllm-ascend loads a quantized Qwen3-Next MTP layer).
MTP_REASON = "MTP layer stays FLOAT (vllm-ascend runs the MTP draft layer unquantized)"

# How vLLM splits each linear over T tensor-parallel ranks, by the module's last name.
# Row-parallel linears split K (so each type's K rule applies to K/T); column-parallel ones split N.
ROW_PARALLEL = ("o_proj", "down_proj", "w2", "out_proj")
COLUMN_PARALLEL = (
    "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3", "q_b_proj", "kv_b_proj",
    "in_proj_qkvz", "in_proj_ba",
)  # fmt: skip
# Replicated on every rank: MLA's q_a / kv_a projections (fused_qkv_a_proj) and the V3.2 indexer's
# projections (ReplicatedLinear in vLLM).
REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa", "wq_b", "wk")

_LAYER_NUMBER = re.compile(r"^model\.layers\.(\d+)\.")
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")


@dataclass(frozen=True)
class Family:
    """The static knowledge of one model_type."""

    model_types: tuple[str, ...]
    label: str
    expert_projections: tuple[tuple[str, str, str], ...]
    packed: tuple[tuple[tuple[str, ...], str], ...]
    shared_expert_names: tuple[str, ...] = ()  # the shared expert's module name under the MoE block
    float_rules: tuple[tuple[str, str], ...] = ()  # (ending of the module name, reason)
    mtp_prefix: str | None = None  # top-level prefix of MTP modules (Qwen3-Next: "mtp.")
    mla: bool = False


_DEEPSEEK = dict(
    expert_projections=(GATE_UP_DOWN,),
    packed=(GATE_UP, MLA_QKV_A),
    shared_expert_names=("shared_experts",),
    mla=True,
)
FAMILIES = (
    # DeepSeek-V3 / R1 / V3.1: MLA, routed + shared experts, MTP layer(s) after the decoder layers.
    Family(("deepseek_v3",), "DeepSeek-V3 / R1 / V3.1", float_rules=((".kv_b_proj", KV_B_REASON),), **_DEEPSEEK),
    # DeepSeek-V3.2-Exp adds the lightning indexer (self_attn.indexer.{wq_b,wk,k_norm,weights_proj}).
    Family(
        ("deepseek_v32",),
        "DeepSeek-V3.2-Exp",
        float_rules=((".kv_b_proj", KV_B_REASON), (".indexer.wk", INDEXER_WK_REASON)),
        **_DEEPSEEK,
    ),
    # Kimi-K2's config says model_type kimi_k2 and loads as DeepseekV3ForCausalLM (no MTP tensors).
    Family(("kimi_k2",), "Kimi-K2", float_rules=((".kv_b_proj", KV_B_REASON),), **_DEEPSEEK),
    Family(("qwen3",), "Qwen3 (dense)", expert_projections=(), packed=(QKV, GATE_UP)),
    Family(("qwen3_moe",), "Qwen3-MoE", expert_projections=(GATE_UP_DOWN,), packed=(QKV, GATE_UP)),
    # Qwen3-Next: gated DeltaNet linear attention (linear_attn.in_proj_qkvz / in_proj_ba / out_proj),
    # one shared expert per layer (mlp.shared_expert), MTP modules under the top-level "mtp." prefix.
    Family(
        ("qwen3_next",),
        "Qwen3-Next",
        expert_projections=(GATE_UP_DOWN,),
        packed=(QKV, GATE_UP),
        shared_expert_names=("shared_expert",),
        mtp_prefix="mtp.",
    ),
    # MiniMax-M2: routed experts block_sparse_moe.experts.N.{w1,w3,w2}; vllm-ascend maps the "mlp"
    # prefix to "block_sparse_moe" and packs experts as w1/w3/w2.
    Family(("minimax_m2",), "MiniMax-M2", expert_projections=(W1_W3_W2,), packed=(QKV,)),
)
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
# Unknown model types: every naming above at once, so any experts.N.<proj> is a routed expert and
# every known packed set stays packed; MLA's kv_b_proj and the indexer's wk keep their FLOAT rule.
GENERIC = Family(
    (),
    "generic",
    expert_projections=(GATE_UP_DOWN, W1_W3_W2),
    packed=(QKV, GATE_UP, MLA_QKV_A),
    shared_expert_names=("shared_experts", "shared_expert"),
    float_rules=((".kv_b_proj", KV_B_REASON), (".indexer.wk", INDEXER_WK_REASON)),
    mtp_prefix="mtp.",
)


def config_value(config: dict, key: str):
    """A config.json field, from the top level or from text_config (multimodal wrappers)."""
    if key in config:
        return config[key]
    text = config.get("text_config")
    return text.get(key) if isinstance(text, dict) else None


def model_type_of(config: dict) -> str | None:
    value = config_value(config, "model_type")
    return value if isinstance(value, str) else None


def expert_count(config: dict) -> int | None:
    """Routed experts per MoE layer as config.json states it (DeepSeek n_routed_experts, Qwen
    num_experts, Mixtral/MiniMax num_local_experts): the one reading inspect, plan and verify share."""
    for key in EXPERT_COUNT_KEYS:
        value = config_value(config, key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _int(config: dict, key: str) -> int | None:
    value = config_value(config, key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ModelRules:
    """The rules for one checkpoint: its family's knowledge plus what its config says."""

    model_type: str | None
    family: Family
    num_hidden_layers: int | None
    mtp_layer_count: int  # DeepSeek's num_nextn_predict_layers (0 if absent)

    @property
    def known(self) -> bool:
        return self.family is not GENERIC

    @property
    def warning(self) -> str | None:
        if self.known:
            return None
        return (
            f"model_type {self.model_type!r} is not one ascendconv knows; generic rules apply (any "
            "experts.N.<proj> is a routed expert, q/k/v, gate/up and MLA q_a/kv_a stay packed, "
            "kv_b_proj and indexer.wk stay FLOAT); check the plan before deploying"
        )

    @cached_property
    def _routed(self) -> re.Pattern:
        projections = sorted({p for names in self.family.expert_projections for p in names})
        return re.compile(rf"^(?P<layer>.+)\.experts\.(?P<expert>\d+)\.(?P<proj>{'|'.join(projections) or '(?!)'})$")

    @cached_property
    def _shared(self) -> re.Pattern:
        names = "|".join(self.family.shared_expert_names) or "(?!)"
        return re.compile(rf"^(?P<layer>.+)\.(?:{names})\.(?P<proj>[^.]+)$")

    @cached_property
    def _packed(self) -> dict[str, str]:
        return {member: fused for members, fused in self.family.packed for member in members}

    @cached_property
    def _mtp_layer_prefixes(self) -> tuple[str, ...]:
        # DeepSeek numbers its MTP layers after the decoder layers: num_hidden_layers onwards, as many
        # as num_nextn_predict_layers
        if self.num_hidden_layers is None:
            return ()
        first = self.num_hidden_layers
        return tuple(f"model.layers.{i}." for i in range(first, first + self.mtp_layer_count))

    @cached_property
    def _roles(self) -> dict[str, str]:
        return {proj: GATE_UP_DOWN[i] for names in self.family.expert_projections for i, proj in enumerate(names)}

    def expert_role(self, proj: str) -> str:
        """A routed expert's projection as gate_proj / up_proj / down_proj, whatever the family names it."""
        return self._roles[proj]

    def routed_expert(self, prefix: str) -> re.Match | None:
        """The match (groups layer, expert, proj) if `prefix` is a routed expert's projection."""
        return self._routed.match(prefix)

    def shared_expert_layer(self, prefix: str) -> str | None:
        """The MoE block (e.g. 'model.layers.3.mlp') whose shared expert `prefix` belongs to."""
        match = self._shared.match(prefix)
        return match["layer"] if match else None

    def is_mtp(self, prefix: str) -> bool:
        return self.mtp_label(prefix) is not None

    def mtp_label(self, name: str) -> str | None:
        """The MTP layer a tensor or module belongs to ('model.layers.61', 'mtp'), or None."""
        if self.family.mtp_prefix and name.startswith(self.family.mtp_prefix):
            return self.family.mtp_prefix.rstrip(".")
        if self._mtp_layer_prefixes and name.startswith(self._mtp_layer_prefixes):
            return name[: _LAYER_NUMBER.match(name).end() - 1]
        return None

    def packed_group(self, prefix: str) -> str:
        """The group a module's type is decided with: a whole MoE layer, a packed set, or itself."""
        routed = self._routed.match(prefix)
        if routed:
            return routed["layer"] + ".experts"
        base, _, last = prefix.rpartition(".")
        fused = self._packed.get(last)
        return f"{base}.{fused}" if fused else prefix

    def default_float(self, prefix: str) -> str | None:
        """Why the module stays FLOAT unless overridden, or None."""
        if self.is_mtp(prefix):
            return MTP_REASON
        for ending, reason in self.family.float_rules:
            if prefix.endswith(ending):
                return reason
        return None


def tp_role(prefix: str) -> str | None:
    """'row', 'column' or 'replicated': how vLLM splits the linear over tensor-parallel ranks."""
    last = prefix.rpartition(".")[2]
    if last in ROW_PARALLEL:
        return "row"
    if last in COLUMN_PARALLEL:
        return "column"
    if last in REPLICATED:
        return "replicated"
    return None


def rules_for(config: dict | None) -> ModelRules:
    config = config or {}
    model_type = model_type_of(config)
    return ModelRules(
        model_type=model_type,
        family=_BY_TYPE.get(model_type, GENERIC),
        num_hidden_layers=_int(config, "num_hidden_layers"),
        mtp_layer_count=_int(config, "num_nextn_predict_layers") or 0,
    )
