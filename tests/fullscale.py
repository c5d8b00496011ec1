"""Header-only, full-scale copies of real block-FP8 checkpoints, generated for the tests.

Each family is built from published facts (config.json, every tensor's name, dtype and shape, the
shard count and naming): a sparse file per shard holds a real safetensors header, and the data
region is left as a hole (`truncate`), so a 689 GB checkpoint costs a few MB of disk. Nothing here
is committed: the tests generate the copies in a temporary directory once per session.

Where a fact is not published (shard layout, some small tensors' dtypes) the choice is marked
"assumed"; the published totals the tests check are tensor counts and bytes.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ITEMSIZE = {"F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BF16": 2, "F32": 4, "I64": 8}
BLOCK = 128


@dataclass(frozen=True)
class Family:
    name: str
    config: dict
    tensors: list[tuple[str, str, tuple[int, ...]]]  # (name, dtype, shape), in file order
    shards: int
    shard_name: Callable[[int, int], str]  # (1-based number, total) -> file name

    @property
    def tensor_bytes(self) -> int:
        return sum(math.prod(shape) * ITEMSIZE[dtype] for _, dtype, shape in self.tensors)


def hf_shard_name(number: int, total: int) -> str:
    return f"model-{number:05d}-of-{total:05d}.safetensors"


def fp8(prefix: str, n: int, k: int, scale_dtype: str = "F32", scale_name: str = "weight_scale_inv") -> list:
    """An FP8 linear: E4M3 weight [N, K] and its 128x128 tile scales (DeepSeek-native: `.scale`)."""
    return [
        (f"{prefix}.weight", "F8_E4M3", (n, k)),
        (f"{prefix}.{scale_name}", scale_dtype, (math.ceil(n / BLOCK), math.ceil(k / BLOCK))),
    ]


def fp8_mlp(prefix: str, names: tuple[str, str, str], hidden: int, inter: int, scale_dtype: str = "F32") -> list:
    """gate / up [inter, hidden] and down [hidden, inter] (names in that order)."""
    gate, up, down = names
    return (
        fp8(f"{prefix}.{gate}", inter, hidden, scale_dtype)
        + fp8(f"{prefix}.{up}", inter, hidden, scale_dtype)
        + fp8(f"{prefix}.{down}", hidden, inter, scale_dtype)
    )


def quant_config(fmt: str = "e4m3", **extra) -> dict:
    return {"activation_scheme": "dynamic", "fmt": fmt, "quant_method": "fp8", "weight_block_size": [128, 128], **extra}


# --- DeepSeek-V3 / V3.2-Exp / Kimi-K2 (MLA + MoE) ---------------------------------------------------


def _mla_layer(c: dict, i: int, indexer: bool) -> list:
    p = f"model.layers.{i}"
    h, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    out = [(f"{p}.input_layernorm.weight", "BF16", (h,)), (f"{p}.post_attention_layernorm.weight", "BF16", (h,))]
    a = f"{p}.self_attn"
    out += fp8(f"{a}.q_a_proj", c["q_lora_rank"], h)
    out += [(f"{a}.q_a_layernorm.weight", "BF16", (c["q_lora_rank"],))]
    out += fp8(f"{a}.q_b_proj", heads * (nope + rope), c["q_lora_rank"])
    out += fp8(f"{a}.kv_a_proj_with_mqa", c["kv_lora_rank"] + rope, h)
    out += [(f"{a}.kv_a_layernorm.weight", "BF16", (c["kv_lora_rank"],))]
    out += fp8(f"{a}.kv_b_proj", heads * (nope + v), c["kv_lora_rank"])
    out += fp8(f"{a}.o_proj", h, heads * v)
    if c.get("rotary_inv_freq"):  # Kimi-K2 ships the rotary table as a tensor
        out += [(f"{a}.rotary_emb.inv_freq", "BF16", (c["rotary_inv_freq"],))]
    if indexer:  # DeepSeek-V3.2-Exp inference/model.py, class Indexer
        n_heads, dim = c["index_n_heads"], c["index_head_dim"]
        out += fp8(f"{a}.indexer.wq_b", n_heads * dim, c["q_lora_rank"])
        out += fp8(f"{a}.indexer.wk", dim, h)
        out += [(f"{a}.indexer.k_norm.weight", "BF16", (dim,)), (f"{a}.indexer.k_norm.bias", "BF16", (dim,))]
        out += [(f"{a}.indexer.weights_proj.weight", "BF16", (n_heads, h))]
    names = ("gate_proj", "up_proj", "down_proj")
    if i < c["first_k_dense_replace"]:
        out += fp8_mlp(f"{p}.mlp", names, h, c["intermediate_size"])
    else:
        e = c["n_routed_experts"]
        for expert in range(e):
            out += fp8_mlp(f"{p}.mlp.experts.{expert}", names, h, c["moe_intermediate_size"])
        out += fp8_mlp(f"{p}.mlp.shared_experts", names, h, c["moe_intermediate_size"] * c["n_shared_experts"])
        out += [(f"{p}.mlp.gate.weight", "BF16", (e, h)), (f"{p}.mlp.gate.e_score_correction_bias", "F32", (e,))]
    return out


def _deepseek_like(name: str, config: dict, shards: int, shard_name=hf_shard_name, indexer: bool = False) -> Family:
    c = config
    h, vocab, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    tensors = [("model.embed_tokens.weight", "BF16", (vocab, h))]
    for i in range(layers):
        tensors += _mla_layer(c, i, indexer)
    tensors += [("model.norm.weight", "BF16", (h,)), ("lm_head.weight", "BF16", (vocab, h))]
    for i in range(layers, layers + c.get("num_nextn_predict_layers", 0)):
        # the MTP layer: a full MoE decoder layer plus its own embedding, norms, projection and head
        p = f"model.layers.{i}"
        tensors += _mla_layer(c, i, indexer)
        tensors += [
            (f"{p}.embed_tokens.weight", "BF16", (vocab, h)),
            (f"{p}.enorm.weight", "BF16", (h,)),
            (f"{p}.hnorm.weight", "BF16", (h,)),
            (f"{p}.eh_proj.weight", "BF16", (h, 2 * h)),
            (f"{p}.shared_head.norm.weight", "BF16", (h,)),
            (f"{p}.shared_head.head.weight", "BF16", (vocab, h)),
        ]
    return Family(name, config, tensors, shards, shard_name)


DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": quant_config(),
}


def deepseek_v3() -> Family:
    return _deepseek_like("DeepSeek-V3", DEEPSEEK_V3_CONFIG, 163)


def deepseek_v32_exp() -> Family:
    config = {
        **DEEPSEEK_V3_CONFIG,
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 2048,
        "quantization_config": quant_config(scale_fmt="ue8m0"),
    }
    return _deepseek_like("DeepSeek-V3.2-Exp", config, 163, indexer=True)  # shard count assumed


def kimi_k2() -> Family:
    config = {
        **DEEPSEEK_V3_CONFIG,
        "model_type": "kimi_k2",
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_routed_experts": 384,
        "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 0,
        "vocab_size": 163840,
        "rotary_inv_freq": 56,
    }
    return _deepseek_like("Kimi-K2-Instruct", config, 61, lambda n, t: f"model-{n}-of-{t}.safetensors")


# --- Qwen3 dense, Qwen3-MoE, Qwen3-Next, MiniMax-M2 (GQA) -------------------------------------------


def _gqa_attention(p: str, h: int, heads: int, kv_heads: int, head_dim: int, scale_dtype: str, norm: int,
                   gated: bool = False) -> list:
    a = f"{p}.self_attn"
    q_rows = heads * head_dim * (2 if gated else 1)  # Qwen3-Next's gated attention doubles q_proj
    return (
        fp8(f"{a}.q_proj", q_rows, h, scale_dtype)
        + fp8(f"{a}.k_proj", kv_heads * head_dim, h, scale_dtype)
        + fp8(f"{a}.v_proj", kv_heads * head_dim, h, scale_dtype)
        + fp8(f"{a}.o_proj", h, heads * head_dim, scale_dtype)
        + [(f"{a}.q_norm.weight", "BF16", (norm if norm else head_dim,)),
           (f"{a}.k_norm.weight", "BF16", (norm // heads * kv_heads if norm else head_dim,))]
    )


def gqa_config(architecture: str, model_type: str, h: int, layers: int, heads: int, kv_heads: int, head_dim: int,
               vocab: int, **extra) -> dict:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": h,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        **extra,
    }


def _norms(p: str, h: int) -> list:
    return [(f"{p}.input_layernorm.weight", "BF16", (h,)), (f"{p}.post_attention_layernorm.weight", "BF16", (h,))]


def _qwen_ends(h: int, vocab: int, body: list) -> list:
    return [("model.embed_tokens.weight", "BF16", (vocab, h))] + body + [
        ("model.norm.weight", "BF16", (h,)),
        ("lm_head.weight", "BF16", (vocab, h)),
    ]


def _qwen_not_converted(layers: int, gate: bool) -> list[str]:
    names = ["lm_head"]
    for i in range(layers):
        names += [f"model.layers.{i}.input_layernorm", f"model.layers.{i}.post_attention_layernorm"]
        if gate:
            names.append(f"model.layers.{i}.mlp.gate")
    return names


def _qwen3_moe(name: str, h: int, layers: int, heads: int, kv: int, experts: int, inter: int, shards: int) -> Family:
    config = gqa_config(
        "Qwen3MoeForCausalLM", "qwen3_moe", h, layers, heads, kv, 128, 151936,
        num_experts=experts,
        num_experts_per_tok=8,
        moe_intermediate_size=inter,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        quantization_config=quant_config(modules_to_not_convert=_qwen_not_converted(layers, gate=True)),
    )
    body = []
    for i in range(layers):
        p = f"model.layers.{i}"
        body += _norms(p, h) + _gqa_attention(p, h, heads, kv, 128, "BF16", 0)
        for e in range(experts):
            body += fp8_mlp(f"{p}.mlp.experts.{e}", ("gate_proj", "up_proj", "down_proj"), h, inter, "BF16")
        body += [(f"{p}.mlp.gate.weight", "BF16", (experts, h))]
    return Family(name, config, _qwen_ends(h, 151936, body), shards, hf_shard_name)


def qwen3_30b_a3b() -> Family:
    return _qwen3_moe("Qwen3-30B-A3B-FP8", 2048, 48, 32, 4, 128, 768, 4)


def qwen3_235b_a22b() -> Family:
    return _qwen3_moe("Qwen3-235B-A22B-FP8", 4096, 94, 64, 4, 128, 1536, 24)  # shard count assumed


def qwen3_coder_480b() -> Family:
    return _qwen3_moe("Qwen3-Coder-480B-A35B-FP8", 6144, 62, 96, 8, 160, 2560, 49)  # shard count assumed


def qwen3_32b() -> Family:
    h, layers, inter = 5120, 64, 25600
    config = gqa_config(
        "Qwen3ForCausalLM", "qwen3", h, layers, 64, 8, 128, 151936, intermediate_size=inter, quantization_config=quant_config()
    )
    body = []
    for i in range(layers):
        p = f"model.layers.{i}"
        body += _norms(p, h) + _gqa_attention(p, h, 64, 8, 128, "BF16", 0)
        body += fp8_mlp(f"{p}.mlp", ("gate_proj", "up_proj", "down_proj"), h, inter, "BF16")
    return Family("Qwen3-32B-FP8", config, _qwen_ends(h, 151936, body), 7, hf_shard_name)  # shards assumed


def _qwen3_next_moe(p: str, h: int, experts: int, inter: int) -> list:
    out = []
    for e in range(experts):
        out += fp8_mlp(f"{p}.mlp.experts.{e}", ("gate_proj", "up_proj", "down_proj"), h, inter, "BF16")
    out += [(f"{p}.mlp.gate.weight", "BF16", (experts, h))]
    out += fp8_mlp(f"{p}.mlp.shared_expert", ("gate_proj", "up_proj", "down_proj"), h, inter, "BF16")
    out += [(f"{p}.mlp.shared_expert_gate.weight", "BF16", (1, h))]
    return out


def qwen3_next_80b_a3b() -> Family:
    h, layers, experts, inter = 2048, 48, 512, 512
    config = gqa_config(
        "Qwen3NextForCausalLM", "qwen3_next", h, layers, 16, 2, 256, 151936,
        full_attention_interval=4,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=experts,
        num_experts_per_tok=10,
        moe_intermediate_size=inter,
        shared_expert_intermediate_size=inter,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        quantization_config=quant_config(
            modules_to_not_convert=["lm_head"]
            + [f"model.layers.{i}.linear_attn.in_proj_ba" for i in range(layers) if (i + 1) % 4]
            + [f"model.layers.{i}.mlp.{g}" for i in range(layers) for g in ("gate", "shared_expert_gate")]
        ),
    )

    def full_attention(p: str) -> list:
        return _gqa_attention(p, h, 16, 2, 256, "BF16", 0, gated=True)

    body = []
    for i in range(layers):
        p = f"model.layers.{i}"
        body += _norms(p, h)
        if (i + 1) % 4 == 0:
            body += full_attention(p)
        else:
            la = f"{p}.linear_attn"
            body += fp8(f"{la}.in_proj_qkvz", 12288, h, "BF16")
            body += [(f"{la}.in_proj_ba.weight", "BF16", (64, h)), (f"{la}.conv1d.weight", "BF16", (8192, 1, 4))]
            body += [(f"{la}.A_log", "F32", (32,)), (f"{la}.dt_bias", "BF16", (32,))]  # dtypes assumed
            body += [(f"{la}.norm.weight", "BF16", (128,))] + fp8(f"{la}.out_proj", h, 4096, "BF16")
        body += _qwen3_next_moe(p, h, experts, inter)
    tensors = _qwen_ends(h, 151936, body)
    mtp = "mtp.layers.0"  # one full-attention MoE layer (FP8 assumed), its fc kept BF16 (assumed)
    tensors += [("mtp.fc.weight", "BF16", (h, 2 * h)), ("mtp.norm.weight", "BF16", (h,))]
    tensors += [("mtp.pre_fc_norm_embedding.weight", "BF16", (h,)), ("mtp.pre_fc_norm_hidden.weight", "BF16", (h,))]
    tensors += _norms(mtp, h) + full_attention(mtp) + _qwen3_next_moe(mtp, h, experts, inter)
    return Family("Qwen3-Next-80B-A3B-FP8", config, tensors, 9, hf_shard_name)  # shard count assumed


def minimax_m2() -> Family:
    h, layers, experts, inter = 3072, 62, 256, 1536
    config = gqa_config(
        "MiniMaxM2ForCausalLM", "minimax_m2", h, layers, 48, 8, 128, 200064,
        intermediate_size=inter,
        num_local_experts=experts,
        num_experts_per_tok=8,
        use_mtp=True,
        num_mtp_modules=3,
        quantization_config=quant_config(
            fmt="float8_e4m3fn", modules_to_not_convert=["gate", "e_score_correction_bias", "lm_head"]
        ),
    )
    body = []
    for i in range(layers):
        p = f"model.layers.{i}"
        body += _norms(p, h) + _gqa_attention(p, h, 48, 8, 128, "F32", 48 * 128)
        m = f"{p}.block_sparse_moe"
        for e in range(experts):
            body += fp8_mlp(f"{m}.experts.{e}", ("w1", "w3", "w2"), h, inter)
        body += [(f"{m}.gate.weight", "F32", (experts, h)), (f"{m}.e_score_correction_bias", "F32", (experts,))]
    return Family("MiniMax-M2", config, _qwen_ends(h, 200064, body), 130, hf_shard_name)  # shards assumed


# --- 2026: Qwen3.5 / 3.6 / 3.8, GLM-5.1, MiniMax-M3, DeepSeek-V4 ------------------------------------


def _vit_blocks(prefix: str, count: int, h: int, inter: int, fc: tuple[str, str]) -> list:
    """BF16 vision-transformer blocks: two LayerNorms, fused qkv, proj and a two-layer MLP, with biases."""
    out = []
    for i in range(count):
        b = f"{prefix}.blocks.{i}"
        for norm in ("norm1", "norm2"):
            out += [(f"{b}.{norm}.weight", "BF16", (h,)), (f"{b}.{norm}.bias", "BF16", (h,))]
        for name, n, k in (("attn.qkv", 3 * h, h), ("attn.proj", h, h), (fc[0], inter, h), (fc[1], h, inter)):
            out += [(f"{b}.{name}.weight", "BF16", (n, k)), (f"{b}.{name}.bias", "BF16", (n,))]
    return out


def _qwen_vision(out_hidden: int, prefix: str = "model.visual") -> list:
    """The Qwen3.5 vision tower, BF16: 27 blocks of 1152 with a 4304-wide MLP, patch 16 x 16 over 2
    frames, 2304 learned positions, a 2x2 patch merger into the text width (the 333 tensors the
    releases hold; block layout as Qwen3-VL's, dimensions assumed from that config)."""
    h, inter, merged = 1152, 4304, 1152 * 4
    out = [(f"{prefix}.patch_embed.proj.weight", "BF16", (h, 3, 2, 16, 16)), (f"{prefix}.patch_embed.proj.bias", "BF16", (h,))]
    out += [(f"{prefix}.pos_embed.weight", "BF16", (2304, h))]
    out += _vit_blocks(prefix, 27, h, inter, ("mlp.linear_fc1", "mlp.linear_fc2"))
    m = f"{prefix}.merger"
    out += [(f"{m}.norm.weight", "BF16", (h,)), (f"{m}.norm.bias", "BF16", (h,))]
    for name, n, k in (("linear_fc1", merged, merged), ("linear_fc2", out_hidden, merged)):
        out += [(f"{m}.{name}.weight", "BF16", (n, k)), (f"{m}.{name}.bias", "BF16", (n,))]
    return out


def _qwen3_5(name: str, moe: bool, h: int, layers: int, heads: int, kv: int, gdn_k: int, gdn_v: int, shards: int,
             inter: int = 0, experts: int = 0, expert_inter: int = 0) -> Family:
    """Qwen3.5 / 3.6 / 3.8 (model_type qwen3_5 / qwen3_5_moe): the text model under
    model.language_model., three gated-DeltaNet layers then one full-attention layer, MTP under mtp.,
    the vision tower under model.visual.; FP8 linears with BF16 scales."""
    vocab, hd = 248320, 256
    key_dim, value_dim = gdn_k * 128, gdn_v * 128
    text = dict(
        model_type=("qwen3_5_moe_text" if moe else "qwen3_5_text"), hidden_size=h, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, vocab_size=vocab,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
        attn_output_gate=True, linear_num_key_heads=gdn_k, linear_num_value_heads=gdn_v, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, mtp_num_hidden_layers=1,
        mtp_use_dedicated_embeddings=False, tie_word_embeddings=False,
    )  # fmt: skip
    if moe:
        text.update(num_experts=experts, num_experts_per_tok=8 if experts == 256 else 10,
                    moe_intermediate_size=expert_inter, shared_expert_intermediate_size=expert_inter)
    else:
        text.update(intermediate_size=inter)
    root = "model.language_model"
    vision_linears = [f"model.visual.blocks.{i}.{n}" for i in range(27) for n in ("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")]
    not_converted = ["lm_head", f"{root}.embed_tokens", "mtp.fc", "model.visual.patch_embed.proj", "model.visual.pos_embed"]
    not_converted += vision_linears + ["model.visual.merger.linear_fc1", "model.visual.merger.linear_fc2"]
    for i in range(layers):
        if i % 4 != 3:
            not_converted += [f"{root}.layers.{i}.linear_attn.{n}" for n in ("conv1d", "in_proj_a", "in_proj_b")]
        if moe:
            not_converted += [f"{root}.layers.{i}.mlp.gate", f"{root}.layers.{i}.mlp.shared_expert_gate"]
    if moe:
        not_converted += ["mtp.layers.0.mlp.gate", "mtp.layers.0.mlp.shared_expert_gate"]
    config = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": text,
        "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "out_hidden_size": h},
        "tie_word_embeddings": False,
        "quantization_config": quant_config(modules_to_not_convert=not_converted),
    }

    def attention(p: str) -> list:
        return _gqa_attention(p, h, heads, kv, hd, "BF16", 0, gated=True)

    def mlp(p: str) -> list:
        if not moe:
            return fp8_mlp(f"{p}.mlp", GATE_UP_DOWN_NAMES, h, inter, "BF16")
        out = []
        for e in range(experts):
            out += fp8_mlp(f"{p}.mlp.experts.{e}", GATE_UP_DOWN_NAMES, h, expert_inter, "BF16")
        out += [(f"{p}.mlp.gate.weight", "BF16", (experts, h))]
        out += fp8_mlp(f"{p}.mlp.shared_expert", GATE_UP_DOWN_NAMES, h, expert_inter, "BF16")
        return out + [(f"{p}.mlp.shared_expert_gate.weight", "BF16", (1, h))]

    tensors = [(f"{root}.embed_tokens.weight", "BF16", (vocab, h))]
    for i in range(layers):
        p = f"{root}.layers.{i}"
        tensors += _norms(p, h)
        if i % 4 == 3:
            tensors += attention(p)
        else:
            la = f"{p}.linear_attn"
            tensors += fp8(f"{la}.in_proj_qkv", 2 * key_dim + value_dim, h, "BF16") + fp8(f"{la}.in_proj_z", value_dim, h, "BF16")
            tensors += [(f"{la}.in_proj_a.weight", "BF16", (gdn_v, h)), (f"{la}.in_proj_b.weight", "BF16", (gdn_v, h))]
            tensors += [(f"{la}.conv1d.weight", "BF16", (2 * key_dim + value_dim, 1, 4))]
            tensors += [(f"{la}.A_log", "BF16", (gdn_v,)), (f"{la}.dt_bias", "BF16", (gdn_v,))]  # dtypes assumed
            tensors += [(f"{la}.norm.weight", "BF16", (128,))] + fp8(f"{la}.out_proj", h, value_dim, "BF16")
        tensors += mlp(p)
    tensors += [(f"{root}.norm.weight", "BF16", (h,)), ("lm_head.weight", "BF16", (vocab, h))]
    tensors += [("mtp.fc.weight", "BF16", (h, 2 * h)), ("mtp.norm.weight", "BF16", (h,))]
    tensors += [("mtp.pre_fc_norm_embedding.weight", "BF16", (h,)), ("mtp.pre_fc_norm_hidden.weight", "BF16", (h,))]
    tensors += _norms("mtp.layers.0", h) + attention("mtp.layers.0") + mlp("mtp.layers.0")
    tensors += _qwen_vision(h)
    return Family(name, config, tensors, shards, hf_shard_name)


GATE_UP_DOWN_NAMES = ("gate_proj", "up_proj", "down_proj")


def qwen3_8_27b() -> Family:
    return _qwen3_5("Qwen3.8-27B-FP8", False, 5120, 64, 24, 4, 16, 48, 66, inter=17408)


def qwen3_6_35b_a3b() -> Family:
    return _qwen3_5("Qwen3.6-35B-A3B-FP8", True, 2048, 40, 16, 2, 16, 32, 42, experts=256, expert_inter=512)


def qwen3_5_397b_a17b() -> Family:
    return _qwen3_5("Qwen3.5-397B-A17B-FP8", True, 4096, 60, 32, 2, 16, 64, 82, experts=512, expert_inter=1024)  # shards assumed


def glm_5_1() -> Family:
    """GLM-5.1-FP8 (glm_moe_dsa): DeepSeek-V3.2's layout (MLA + DSA indexer) at GLM-5's size; MTP
    layer 78 holds no embed_tokens and no shared_head.head."""
    config = {
        **DEEPSEEK_V3_CONFIG,
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "hidden_size": 6144,
        "intermediate_size": 12288,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 78,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "q_lora_rank": 2048,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "v_head_dim": 256,
        "index_n_heads": 32,
        "index_head_dim": 128,
        "index_topk": 2048,
        "vocab_size": 154880,
        "quantization_config": quant_config(
            modules_to_not_convert=["lm_head", "model.embed_tokens", "model.layers.78.eh_proj", "self_attn.indexers_proj"]
        ),
    }
    family = _deepseek_like("GLM-5.1-FP8", config, 142, indexer=True)  # 5 GB shards assumed
    lacking = ("model.layers.78.embed_tokens.weight", "model.layers.78.shared_head.head.weight")
    return Family(family.name, config, [t for t in family.tensors if t[0] not in lacking], family.shards, hf_shard_name)


def minimax_m3() -> Family:
    """MiniMax-M3 (minimax_m3_vl, text minimax_m3): 60 layers under language_model.model., 3 dense then
    57 MoE layers with sparse attention (index_q_proj / index_k_proj), a BF16 vision tower, projector
    and patch merger (their layout assumed: 42 blocks of 1536), no MTP tensors (assumed, as M2)."""
    h, layers, experts, inter, vocab = 6144, 60, 128, 3072, 200064
    text = gqa_config(
        "MiniMaxM3SparseForCausalLM", "minimax_m3", h, layers, 64, 4, 128, vocab,
        intermediate_size=12288, moe_intermediate_size=inter, num_local_experts=experts, num_experts_per_tok=4,
        n_shared_experts=1, first_k_dense_replace=3, num_index_heads=4, index_head_dim=128,
        hidden_act="swigluoai", num_mtp_modules=7, num_nextn_predict_layers=1,
    )  # fmt: skip
    root = "language_model.model"
    vision = ["vision_tower", "multi_modal_projector", "patch_merge_mlp"]
    config = {
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
        "model_type": "minimax_m3_vl",
        "text_config": text,
        "quantization_config": quant_config(
            fmt="float8_e4m3fn", modules_to_not_convert=["gate", "e_score_correction_bias", "lm_head", *vision]
        ),
    }
    tensors = [(f"{root}.embed_tokens.weight", "BF16", (vocab, h))]
    for i in range(layers):
        p = f"{root}.layers.{i}"
        tensors += _norms(p, h) + _gqa_attention(p, h, 64, 4, 128, "F32", 0)
        if i >= 3:
            a = f"{p}.self_attn"
            tensors += fp8(f"{a}.index_q_proj", 4 * 128, h) + fp8(f"{a}.index_k_proj", 128, h)
            tensors += [(f"{a}.index_q_norm.weight", "BF16", (128,)), (f"{a}.index_k_norm.weight", "BF16", (128,))]
            m = f"{p}.block_sparse_moe"
            for e in range(experts):
                tensors += fp8_mlp(f"{m}.experts.{e}", ("w1", "w3", "w2"), h, inter)
            tensors += [(f"{m}.gate.weight", "F32", (experts, h)), (f"{m}.e_score_correction_bias", "F32", (experts,))]
            tensors += fp8_mlp(f"{m}.shared_experts", GATE_UP_DOWN_NAMES, h, inter)
        else:
            tensors += fp8_mlp(f"{p}.mlp", GATE_UP_DOWN_NAMES, h, 12288)
    tensors += [(f"{root}.norm.weight", "BF16", (h,)), ("language_model.lm_head.weight", "BF16", (vocab, h))]
    v, vi = 1536, 6144  # vision width and MLP width (assumed)
    tensors += [("vision_tower.patch_embed.proj.weight", "BF16", (v, 3, 14, 14)), ("vision_tower.patch_embed.proj.bias", "BF16", (v,))]
    tensors += [("vision_tower.pos_embed.weight", "BF16", (1024, v))]
    tensors += _vit_blocks("vision_tower", 42, v, vi, ("mlp.fc1", "mlp.fc2"))
    for norm in ("vision_tower.pre_layernorm", "vision_tower.post_layernorm", "multi_modal_projector.norm"):
        tensors += [(f"{norm}.weight", "BF16", (v,)), (f"{norm}.bias", "BF16", (v,))]
    for name, n, k in (("multi_modal_projector.linear_1", h, 4 * v), ("multi_modal_projector.linear_2", h, h),
                       ("patch_merge_mlp.mlp.fc1", 4 * v, 4 * v), ("patch_merge_mlp.mlp.fc2", 4 * v, 4 * v)):
        tensors += [(f"{name}.weight", "BF16", (n, k)), (f"{name}.bias", "BF16", (n,))]
    return Family("MiniMax-M3", config, tensors, 88, hf_shard_name)  # shard count assumed


DEEPSEEK_V4_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 64,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1024,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2048,
    "num_experts_per_tok": 6,
    "num_hash_layers": 3,
    "hc_mult": 4,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    # two full-attention layers, then ratio-4 (with indexer) and ratio-128 layers alternating; the
    # last entry is the MTP layer's (layout assumed from the published count: 44 entries)
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4] + [0],
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "quantization_config": quant_config(scale_fmt="ue8m0"),
}


def _ds_v4_layer(c: dict, p: str, ratio: int, hash_layer: bool, fp4_experts: bool) -> list:
    h, heads, hd, q_lora = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    groups, o_lora, e, inter = c["o_groups"], c["o_lora_rank"], c["n_routed_experts"], c["moe_intermediate_size"]
    hc = c["hc_mult"]

    def native(prefix: str, n: int, k: int) -> list:
        return fp8(prefix, n, k, "F8_E8M0", "scale")

    out = [(f"{p}.attn_norm.weight", "BF16", (h,)), (f"{p}.ffn_norm.weight", "BF16", (h,))]
    a = f"{p}.attn"
    out += [(f"{a}.q_norm.weight", "BF16", (q_lora,)), (f"{a}.kv_norm.weight", "BF16", (hd,)), (f"{a}.attn_sink", "F32", (heads,))]
    out += native(f"{a}.wq_a", q_lora, h) + native(f"{a}.wq_b", heads * hd, q_lora) + native(f"{a}.wkv", hd, h)
    out += native(f"{a}.wo_a", groups * o_lora, heads * hd // groups) + native(f"{a}.wo_b", h, groups * o_lora)
    if ratio:
        width = hd * (2 if ratio == 4 else 1)  # ratio-4 compressors overlap their windows
        out += [(f"{a}.compressor.wkv.weight", "BF16", (width, h)), (f"{a}.compressor.wgate.weight", "BF16", (width, h))]
        out += [(f"{a}.compressor.ape", "F32", (ratio, width)), (f"{a}.compressor.norm.weight", "BF16", (hd,))]
    if ratio == 4:
        ih, idim = c["index_n_heads"], c["index_head_dim"]
        ix = f"{a}.indexer"
        out += native(f"{ix}.wq_b", ih * idim, q_lora) + [(f"{ix}.weights_proj.weight", "BF16", (ih, h))]
        out += [(f"{ix}.compressor.wkv.weight", "BF16", (2 * idim, h)), (f"{ix}.compressor.wgate.weight", "BF16", (2 * idim, h))]
        out += [(f"{ix}.compressor.ape", "F32", (4, 2 * idim)), (f"{ix}.compressor.norm.weight", "BF16", (idim,))]
    for site in ("attn", "ffn"):
        mix = (2 + hc) * hc
        out += [(f"{p}.hc_{site}_fn", "F32", (mix, hc * h)), (f"{p}.hc_{site}_base", "F32", (mix,)), (f"{p}.hc_{site}_scale", "F32", (3,))]
    f = f"{p}.ffn"
    out += [(f"{f}.gate.weight", "BF16", (e, h))]
    out += [(f"{f}.gate.tid2eid", "I64", (c["vocab_size"], c["num_experts_per_tok"]))] if hash_layer else [(f"{f}.gate.bias", "F32", (e,))]
    for expert in range(e):
        x = f"{f}.experts.{expert}"
        for name, n, k in (("w1", inter, h), ("w3", inter, h), ("w2", h, inter)):
            if fp4_experts:  # packed E2M1 pairs in I8, one E8M0 scale per 32 values (V4-Flash)
                out += [(f"{x}.{name}.weight", "I8", (n, k // 2)), (f"{x}.{name}.scale", "F8_E8M0", (n, k // 32))]
            else:  # V4-Flash-Base: FP8 experts with F32 tile scales
                out += fp8(f"{x}.{name}", n, k, "F32", "scale")
    for name, n, k in (("w1", inter, h), ("w3", inter, h), ("w2", h, inter)):
        out += native(f"{f}.shared_experts.{name}", n, k)
    return out


def deepseek_v4(name: str = "DeepSeek-V4-Flash-Base", fp4_experts: bool = False, shards: int = 59) -> Family:
    """DeepSeek-V4 in its native layout: no `model.` prefix, `.scale` in F8_E8M0 (F32 for the Base's
    FP8 experts), hyper-connection mixers, compressors and indexers, the MTP layer under mtp.0."""
    c = DEEPSEEK_V4_CONFIG
    h, vocab, hc = c["hidden_size"], c["vocab_size"], c["hc_mult"]
    ratios = c["compress_ratios"]
    tensors = [("embed.weight", "BF16", (vocab, h))]
    for i in range(c["num_hidden_layers"]):
        tensors += _ds_v4_layer(c, f"layers.{i}", ratios[i], i < c["num_hash_layers"], fp4_experts)
    head = [("hc_head_fn", "F32", (hc, hc * h)), ("hc_head_base", "F32", (hc,)), ("hc_head_scale", "F32", (1,))]
    tensors += [("norm.weight", "BF16", (h,)), ("head.weight", "BF16", (vocab, h))] + head
    m = "mtp.0"
    tensors += _ds_v4_layer(c, m, ratios[-1], False, fp4_experts)
    tensors += fp8(f"{m}.e_proj", h, h, "F8_E8M0", "scale") + fp8(f"{m}.h_proj", h, h, "F8_E8M0", "scale")
    tensors += [(f"{m}.enorm.weight", "BF16", (h,)), (f"{m}.hnorm.weight", "BF16", (h,)), (f"{m}.norm.weight", "BF16", (h,))]
    tensors += [(f"{m}.{n}", d, s) for n, d, s in head]
    config = {**c, "expert_dtype": "fp4" if fp4_experts else "fp8"}
    return Family(name, config, tensors, shards, hf_shard_name)


def deepseek_v4_flash() -> Family:
    return deepseek_v4("DeepSeek-V4-Flash", fp4_experts=True, shards=46)  # shard count assumed


# --- Kimi-K3 (compressed-tensors MXFP4 experts) ---------------------------------------------------


def mxfp4(prefix: str, n: int, k: int) -> list:
    """A compressed-tensors mxfp4-pack-quantized linear: packed E2M1 [N, K/2] and E8M0 [N, K/32]."""
    return [(f"{prefix}.weight_packed", "U8", (n, k // 2)), (f"{prefix}.weight_scale", "U8", (n, k // 32))]


def _bf16(prefix: str, n: int, k: int) -> tuple:
    return (f"{prefix}.weight", "BF16", (n, k))


def kimi_k3(layers: int = 93) -> Family:
    """Kimi-K3 (kimi_k3, text model kimi_linear, 2.8T parameters): 93 layers under
    language_model.model. of which 24 gated MLA and 69 KDA linear attention, layer 0 dense and 92
    latent-MoE layers of 896 routed experts (block_sparse_moe.experts.E.w1 / w3 / w2) on a 3584-wide
    latent, with two shared experts (6144 wide) on the full 7168; only the routed experts are
    quantized (MXFP4, QAT: MXFP4A16), everything else BF16; 96 shards. Published: the layer split,
    widths, expert count, KDA and per-layer residual tensors and the w1/w2/w3 weight_packed /
    weight_scale names (public ports of the release); 1.56 TB and 96 shards. Assumed: which layers
    are MLA (every 4th, and the last), the MLA, latent-projection, router and dense-MLP tensors
    (names and dtypes), no weight_shape companions, no MTP and no vision tower tensors.

    `layers` < 93 gives the first layers of the same checkpoint (every layer at full width, with all
    896 experts, and the same shard count), a copy small enough to plan many ways in a test."""
    h, experts, inter, latent, vocab = 7168, 896, 3072, 3584, 163840
    heads, head_dim, q_lora, kv_lora, nope, rope, v_dim = 96, 128, 1536, 512, 128, 64, 128
    mla_layers = [i for i in range(layers) if (i + 1) % 4 == 0 or i == 92]  # 23 every 4th and the last (assumed)
    text = {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_size": h,
        "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": 18432,
        "moe_intermediate_size": inter, "num_experts": experts, "num_experts_per_token": 16,
        "num_shared_experts": 2, "routed_expert_hidden_size": latent, "latent_moe_use_norm": True,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": q_lora, "kv_lora_rank": kv_lora,
        "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": v_dim, "mla_use_nope": True,
        "mla_use_output_gate": True, "hidden_act": "situ", "attn_res_block_size": 12, "vocab_size": vocab,
        "linear_attn_config": {
            "kda_layers": [i + 1 for i in range(layers) if i not in mla_layers],
            "full_attn_layers": [i + 1 for i in mla_layers], "num_heads": heads, "head_dim": head_dim,
            "short_conv_kernel_size": 4, "gate_lower_bound": -5.0, "use_full_rank_gate": True,
        },
    }  # fmt: skip
    quant = {
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"], "format": "mxfp4-pack-quantized",
            "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                        "symmetric": True, "dynamic": False},
        }},
        "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*\\.mlp\\..*", "re:.*latent.*", "re:.*gate$",
                   "language_model.lm_head", "re:vision_tower.*", "re:mm_projector.*"],
    }  # fmt: skip
    config = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "text_config": text,
              "quantization_config": quant}
    root = "language_model.model"
    p_dim = heads * head_dim
    tensors = [(f"{root}.embed_tokens.weight", "BF16", (vocab, h))]
    for i in range(layers):
        p = f"{root}.layers.{i}"
        tensors += [(f"{p}.{n}.weight", "BF16", (h,)) for n in ("input_layernorm", "post_attention_layernorm")]
        for res in ("self_attention_res", "mlp_res"):
            tensors += [(f"{p}.{res}_proj.weight", "BF16", (1, h)), (f"{p}.{res}_norm.weight", "BF16", (h,))]
        a = f"{p}.self_attn"
        if i in mla_layers:
            tensors += [
                _bf16(f"{a}.q_a_proj", q_lora, h), (f"{a}.q_a_layernorm.weight", "BF16", (q_lora,)),
                _bf16(f"{a}.q_b_proj", heads * (nope + rope), q_lora), _bf16(f"{a}.kv_a_proj_with_mqa", kv_lora + rope, h),
                (f"{a}.kv_a_layernorm.weight", "BF16", (kv_lora,)), _bf16(f"{a}.kv_b_proj", heads * (nope + v_dim), kv_lora),
                _bf16(f"{a}.g_proj", heads * v_dim, h), _bf16(f"{a}.o_proj", h, heads * v_dim),
            ]  # fmt: skip
        else:
            tensors += [_bf16(f"{a}.{x}_proj", p_dim, h) for x in "qkv"]
            tensors += [(f"{a}.{x}_conv1d.weight", "F32", (p_dim, 1, 4)) for x in "qkv"]
            tensors += [
                _bf16(f"{a}.f_a_proj", head_dim, h), _bf16(f"{a}.f_b_proj", p_dim, head_dim), _bf16(f"{a}.b_proj", heads, h),
                _bf16(f"{a}.g_proj", p_dim, h), (f"{a}.A_log", "F32", (head_dim,)), (f"{a}.dt_bias", "F32", (p_dim,)),
                (f"{a}.o_norm.weight", "F32", (head_dim,)), _bf16(f"{a}.o_proj", h, p_dim),
            ]  # fmt: skip
        if i == 0:
            m = f"{p}.mlp"
            tensors += [_bf16(f"{m}.gate_proj", 18432, h), _bf16(f"{m}.up_proj", 18432, h), _bf16(f"{m}.down_proj", h, 18432)]
            continue
        m = f"{p}.block_sparse_moe"
        tensors += [_bf16(f"{m}.gate", experts, h), (f"{m}.gate.e_score_correction_bias", "F32", (experts,))]
        tensors += [_bf16(f"{m}.latent_down_proj", latent, h), (f"{m}.routed_expert_norm.weight", "BF16", (latent,)),
                    _bf16(f"{m}.latent_up_proj", h, latent)]  # fmt: skip
        for e in range(experts):
            x = f"{m}.experts.{e}"
            tensors += mxfp4(f"{x}.w1", inter, latent) + mxfp4(f"{x}.w2", latent, inter) + mxfp4(f"{x}.w3", inter, latent)
        s = f"{m}.shared_experts"
        tensors += [_bf16(f"{s}.gate_proj", 2 * inter, h), _bf16(f"{s}.up_proj", 2 * inter, h), _bf16(f"{s}.down_proj", h, 2 * inter)]
    tensors += [(f"{root}.norm.weight", "BF16", (h,)), (f"{root}.output_attn_res_proj.weight", "BF16", (1, h)),
                (f"{root}.output_attn_res_norm.weight", "BF16", (h,)), ("language_model.lm_head.weight", "BF16", (vocab, h))]  # fmt: skip
    return Family("Kimi-K3" if layers == 93 else f"Kimi-K3 (first {layers} layers)", config, tensors, 96, hf_shard_name)


# MX-native full-scale sources: tested on their own (tests/test_families.py, "MX-native families"),
# not by the block-FP8 families' parametrized tests.
MX_FAMILIES: dict[str, Callable[[], Family]] = {"kimi-k3": kimi_k3}


FAMILIES: dict[str, Callable[[], Family]] = {
    "deepseek-v3": deepseek_v3,
    "deepseek-v3.2-exp": deepseek_v32_exp,
    "kimi-k2": kimi_k2,
    "qwen3-30b-a3b": qwen3_30b_a3b,
    "qwen3-235b-a22b": qwen3_235b_a22b,
    "qwen3-coder-480b": qwen3_coder_480b,
    "qwen3-next-80b-a3b": qwen3_next_80b_a3b,
    "qwen3-32b": qwen3_32b,
    "minimax-m2": minimax_m2,
    "qwen3.8-27b": qwen3_8_27b,
    "qwen3.6-35b-a3b": qwen3_6_35b_a3b,
    "qwen3.5-397b-a17b": qwen3_5_397b_a17b,
    "glm-5.1": glm_5_1,
    "minimax-m3": minimax_m3,
    "deepseek-v4-flash-base": deepseek_v4,
}


# --- writing -----------------------------------------------------------------------------------------


def _fill_in_order(family: Family) -> list[list[tuple[str, str, tuple[int, ...]]]]:
    """Shards in tensor order, each closed once it holds its share of the bytes still to place, or
    when every tensor left is needed to give each shard left at least one."""
    members: list[list] = [[]]
    left = family.tensor_bytes
    share, size = left / family.shards, 0
    for i, tensor in enumerate(family.tensors):
        shards_after = family.shards - len(members)
        if members[-1] and shards_after and (size >= share or shards_after >= len(family.tensors) - i):
            members.append([])
            share, size = left / (shards_after), 0
        nbytes = math.prod(tensor[2]) * ITEMSIZE[tensor[1]]
        members[-1].append(tensor)
        size += nbytes
        left -= nbytes
    assert len(members) == family.shards and all(members), f"{family.name}: cannot fill {family.shards} shards"
    return members


def write_sparse_checkpoint(family: Family, root: Path) -> Path:
    """config.json, an index and `family.shards` sparse safetensors files (headers only, data as holes).

    Tensors go to shards in order, each shard taking about the same number of bytes.
    """
    root.mkdir(parents=True, exist_ok=True)
    total = family.tensor_bytes
    members: list[list[tuple[str, str, tuple[int, ...]]]] = [[] for _ in range(family.shards)]
    done = 0
    for tensor in family.tensors:
        nbytes = math.prod(tensor[2]) * ITEMSIZE[tensor[1]]
        members[min(family.shards - 1, (done + nbytes // 2) * family.shards // total)].append(tensor)
        done += nbytes
    if not all(members):  # tensors larger than a shard's share (Qwen3.8-27B's embedding): fill in order
        members = _fill_in_order(family)
    weight_map = {}
    for number, tensors in enumerate(members, 1):
        file = family.shard_name(number, family.shards)
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, shape in tensors:
            nbytes = math.prod(shape) * ITEMSIZE[dtype]
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(root / file, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)
    (root / "config.json").write_text(json.dumps(family.config, indent=2))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root
