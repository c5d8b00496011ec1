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

ITEMSIZE = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
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


def fp8(prefix: str, n: int, k: int, scale_dtype: str = "F32") -> list[tuple[str, str, tuple[int, ...]]]:
    """An FP8 linear: E4M3 weight [N, K] and its 128x128 tile scales."""
    return [
        (f"{prefix}.weight", "F8_E4M3", (n, k)),
        (f"{prefix}.weight_scale_inv", scale_dtype, (math.ceil(n / BLOCK), math.ceil(k / BLOCK))),
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
}


# --- writing -----------------------------------------------------------------------------------------


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
    assert all(members), f"{family.name}: an empty shard; fewer shards than {family.shards} would be needed"
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
