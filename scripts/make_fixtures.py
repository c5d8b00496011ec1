#!/usr/bin/env python3
"""Generate the synthetic Hugging Face block-FP8 fixture checkpoints in ``fixtures/``.

    python scripts/make_fixtures.py [OUT_DIR]      # default: <repo>/fixtures

Three tiny checkpoints, each in a directory of its own under OUT_DIR:

* ``qwen3-dense-fp8``  Qwen3 dense, BF16 tile scales, one ``model.safetensors``.
* ``qwen3-moe-fp8``    Qwen3-MoE, F32 tile scales, three shards + index, one module
                       left unquantized, a weight and its scale in different shards.
* ``deepseek-v3-fp8``  DeepSeek-V3 (MLA, shared experts, router bias), power-of-two
                       (ue8m0) F32 tile scales, two shards + index.

The output is byte-for-byte reproducible (``tests/test_fixtures.py`` regenerates it and
compares SHA-256 digests), so this script avoids anything whose result may drift between
library versions or machines:

* random numbers come from the raw 64-bit output of numpy's PCG64 bit generator (a stable
  stream), seeded from (fixture seed, CRC-32 of the tensor name), and are shaped with plain
  IEEE arithmetic only (no ``Generator.normal``, whose algorithm numpy does not promise to
  keep, and no transcendental functions, whose last bit may depend on the CPU);
* every rounding is an IEEE float32 operation or an ml_dtypes cast from float32;
* safetensors files are written by the ``safetensors`` library's raw-bytes serializer
  (no torch, and ``safe_open`` cannot handle F8 through numpy anyway), without metadata;
* JSON is written with a fixed layout, index files with sorted keys.

The shapes are tiny (hidden 256, or 128 for the MoE fixture; vocabulary 64; one or two
heads) so that all three fixtures stay under 2 MB together; the edge cases each fixture
carries are listed in its spec table below.
"""

from __future__ import annotations

import base64
import json
import math
import shutil
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np
import safetensors

BLOCK = 128  # weight_block_size [BLOCK, BLOCK]
FP8_MAX = 448.0  # largest finite float8_e4m3fn
NAN_CODES = (0x7F, 0xFF)  # float8_e4m3fn NaN bit patterns: must never appear

# ---------------------------------------------------------------------------------------
# Spec tables
# ---------------------------------------------------------------------------------------

QWEN3_DENSE = {
    "dir": "qwen3-dense-fp8",
    "seed": 1,
    "vocab": 64,
    "hidden": 256,
    "heads": 2,  # q_proj [128, 256], o_proj [256, 128] (both fully aligned tiles)
    "kv_heads": 1,  # k_proj / v_proj [64, 256]: N smaller than one tile, scale [1, 2]
    "head_dim": 64,
    # Per-layer MLP width (config.json can only state layer 0's, 192):
    #  layer 0: gate/up [192, 256], down [256, 192]  K=192: %64 == 0, %128 != 0
    #  layer 1: gate/up [160, 256], down [256, 160]  K=160: %32 == 0, %64 != 0
    #           (W4A8_MXFP cannot take down_proj: it falls back to W8A8_MXFP8 alone)
    "intermediate": (192, 160),
    "attention_bias": True,  # q/k/v_proj.bias in BF16, to exercise bias handling
    "scale_dtype": "BF16",
    "pow2_scales": False,
}

QWEN3_MOE = {
    "dir": "qwen3-moe-fp8",
    "seed": 2,
    "vocab": 64,
    "hidden": 128,  # the size budget: this fixture is about structure, not tile edges
    "heads": 2,  # q_proj / o_proj [128, 128], k_proj / v_proj [64, 128]
    "kv_heads": 1,
    "head_dim": 64,
    "layers": 2,
    "experts": 4,  # experts gate/up/down [128, 128]: the fully aligned case
    "experts_per_tok": 2,
    "moe_intermediate": 128,
    "scale_dtype": "F32",
    "pow2_scales": False,
    # Left in BF16 without a scale; listed in quantization_config.modules_to_not_convert
    # together with lm_head and the routers. The converter must keep it byte-identical.
    "not_converted": ("model.layers.0.self_attn.o_proj",),
    "shards": 3,
    # Deliberate split: this scale is written to shard 2 while its weight is in shard 1.
    "moved_to_other_shard": {"model.layers.0.mlp.experts.3.down_proj.weight_scale_inv": 2},
}

DEEPSEEK_V3 = {
    "dir": "deepseek-v3-fp8",
    "seed": 3,
    "vocab": 64,
    "hidden": 128,
    "heads": 2,
    "q_lora_rank": 128,  # q_a_proj [128, 128], q_b_proj [192, 128]
    "kv_lora_rank": 512,  # kv_a_proj_with_mqa [576, 128] as in DeepSeek-V3: N ragged (4.5 tiles), scale [5, 1]
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 64,
    "v_head_dim": 32,  # kv_b_proj [128, 512], o_proj [128, 64] (K=64: one partial tile)
    "intermediate": 128,  # layer 0 (dense): gate/up [128, 128], down [128, 128]
    "moe_intermediate": 64,  # layer 1 experts and shared expert: [64, 128] / [128, 64]
    "experts": 4,
    "shared_experts": 1,
    "experts_per_tok": 2,
    "scale_dtype": "F32",
    "pow2_scales": True,  # scale_fmt ue8m0
    "shards": 2,
    # Deliberate split, the other way round from the MoE fixture: this scale is written
    # to shard 1 while its weight is in shard 2.
    "moved_to_other_shard": {"model.layers.1.mlp.shared_experts.down_proj.weight_scale_inv": 1},
}

# ---------------------------------------------------------------------------------------
# Deterministic random numbers
# ---------------------------------------------------------------------------------------


def _bitgen(seed: int, name: str) -> np.random.PCG64:
    """One independent, order-free stream per (fixture, tensor name)."""
    return np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


def _uniform(bg: np.random.PCG64, shape: tuple[int, ...]) -> np.ndarray:
    """Float64 in [0, 1) from the top 53 bits of the raw stream (exact conversion)."""
    n = int(np.prod(shape, dtype=np.int64))
    raw = bg.random_raw(n)
    return ((raw >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(shape)


def _normal(bg: np.random.PCG64, shape: tuple[int, ...], std: float) -> np.ndarray:
    """Approximately N(0, std^2) as float32: Irwin-Hall sum of four uniforms."""
    u = _uniform(bg, (4, *shape))
    z = (u[0] + u[1] + u[2] + u[3] - 2.0) * math.sqrt(3.0)
    return (z * std).astype(np.float32)


def make_weight(seed: int, name: str, shape: tuple[int, int], std: float = 0.02) -> np.ndarray:
    """A float32 matrix ~N(0, std) whose 128x128 tiles differ: a gain per tile and a few
    large outliers (as many as there are tiles, at random places)."""
    n, k = shape
    bg = _bitgen(seed, name)
    w = _normal(bg, shape, std)
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    gain = (0.5 + 1.5 * _uniform(bg, (nb, kb))).astype(np.float32)
    w *= np.repeat(np.repeat(gain, BLOCK, 0), BLOCK, 1)[:n, :k]
    pos = bg.random_raw(nb * kb) % np.uint64(n * k)
    mag = 0.08 + 0.25 * _uniform(bg, (nb * kb,))
    sign = np.where(bg.random_raw(nb * kb) & np.uint64(1), -1.0, 1.0)
    flat = w.reshape(-1)
    for p, v in zip(pos.tolist(), (sign * mag).tolist()):
        flat[p] = np.float32(v)
    return w


# ---------------------------------------------------------------------------------------
# Block-wise FP8 quantization
# ---------------------------------------------------------------------------------------


def quantize_blockwise(
    w: np.ndarray, *, scale_dtype: str = "F32", pow2: bool = False, block: int = BLOCK
) -> tuple[np.ndarray, np.ndarray]:
    """Quantize a float32 [N, K] matrix to float8_e4m3fn codes with one scale per tile.

    scale = amax(tile) / 448 in float32, or with ``pow2`` the power of two
    2**ceil(log2(amax / 448)); with ``scale_dtype == "BF16"`` the scale is rounded to
    bfloat16 first and the codes are computed against the rounded scale. Edge tiles are
    cropped. Returns (codes as uint8 [N, K], scale [ceil(N/block), ceil(K/block)] as
    float32 or bfloat16), so that W ~= codes * scale[i // block, j // block].
    """
    assert w.dtype == np.float32 and w.ndim == 2
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    padded = np.zeros((nb * block, kb * block), np.float32)
    padded[:n, :k] = np.abs(w)
    amax = padded.reshape(nb, block, kb, block).max(axis=(1, 3))
    amax = np.where(amax > 0, amax, np.float32(1.0)).astype(np.float32)
    scale = (amax / np.float32(FP8_MAX)).astype(np.float32)
    if pow2:
        mant, exp = np.frexp(scale)  # scale = mant * 2**exp, mant in [0.5, 1)
        exp = np.where(mant == 0.5, exp - 1, exp)  # already a power of two
        scale = np.ldexp(np.float32(1.0), exp).astype(np.float32)
    if scale_dtype == "BF16":
        stored = scale.astype(ml_dtypes.bfloat16)
        scale = stored.astype(np.float32)
    elif scale_dtype == "F32":
        stored = scale
    else:
        raise ValueError(f"unsupported scale dtype {scale_dtype!r}")
    full = np.repeat(np.repeat(scale, block, 0), block, 1)[:n, :k]
    q = np.clip(w / full, -FP8_MAX, FP8_MAX).astype(np.float32)  # clamp before the cast
    codes = q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert not np.isin(codes, NAN_CODES).any(), "NaN code in FP8 payload"
    assert np.isfinite(scale).all() and (scale > 0).all()
    return codes, stored


# ---------------------------------------------------------------------------------------
# Checkpoint writing
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    dtype: str  # safetensors header dtype: "F8_E4M3", "BF16", "F32"
    shape: tuple[int, ...]
    data: bytes


# header dtype -> dtype name understood by safetensors' serializer
_SERIALIZER_DTYPE = {"F8_E4M3": "float8_e4m3fn", "BF16": "bfloat16", "F32": "float32"}


def _serialize_file(tensors: dict[str, Tensor], path: Path) -> None:
    """Write one .safetensors file from raw bytes with the library's own serializer."""
    buffers = {name: np.frombuffer(t.data, np.uint8) for name, t in tensors.items()}  # alive
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
        specs = {
            name: safetensors.TensorSpec(
                dtype=_SERIALIZER_DTYPE[t.dtype],
                shape=list(t.shape),
                data_ptr=buffers[name].ctypes.data,
                data_len=len(t.data),
            )
            for name, t in sorted(tensors.items())
        }
    else:  # older releases take plain dicts ("data", or "data_ptr" + "data_len")
        specs = {
            name: {
                "dtype": _SERIALIZER_DTYPE[t.dtype],
                "shape": list(t.shape),
                "data": t.data,
                "data_ptr": buffers[name].ctypes.data,
                "data_len": len(t.data),
            }
            for name, t in sorted(tensors.items())
        }
    safetensors.serialize_file(specs, str(path))
    del buffers
    path.chmod(0o644)  # the serializer creates files readable by the owner only


def _json_bytes(obj: object, *, sort_keys: bool = False) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n").encode()


def write_checkpoint(
    directory: Path, tensors: dict[str, Tensor], shard_of: dict[str, int] | None, n_shards: int
) -> None:
    """Write ``model.safetensors`` (n_shards == 1) or ``model-0000i-of-0000n.safetensors``
    shards plus ``model.safetensors.index.json``; ``shard_of`` maps names to 1-based shards."""
    if n_shards == 1:
        _serialize_file(tensors, directory / "model.safetensors")
        return
    assert shard_of is not None and set(shard_of) == set(tensors)
    files = {i: f"model-{i:05d}-of-{n_shards:05d}.safetensors" for i in range(1, n_shards + 1)}
    for i, fname in files.items():
        part = {name: t for name, t in tensors.items() if shard_of[name] == i}
        assert part, f"shard {i} would be empty"
        _serialize_file(part, directory / fname)
    index = {
        "metadata": {"total_size": sum(len(t.data) for t in tensors.values())},
        "weight_map": {name: files[shard_of[name]] for name in sorted(tensors)},
    }
    (directory / "model.safetensors.index.json").write_bytes(_json_bytes(index, sort_keys=True))


# ---------------------------------------------------------------------------------------
# Tensor layouts
# ---------------------------------------------------------------------------------------

# A layout is a list of (name, kind, shape):
#   "fp8"  a quantized linear: name is the module, giving name.weight (F8_E4M3) and
#          name.weight_scale_inv (or a BF16 name.weight if the module is not converted)
#   "bf16" a plain BF16 tensor ~N(0, 0.02) (embeddings, lm_head, router, biases)
#   "norm" a BF16 norm weight ~1 + N(0, 0.05)
#   "f32"  a plain F32 tensor ~N(0, 0.1) (DeepSeek router correction bias)
Layout = list[tuple[str, str, tuple[int, ...]]]


def _qwen3_attention(p: str, c: dict) -> Layout:
    h, hd = c["hidden"], c["head_dim"]
    q, kv = c["heads"] * hd, c["kv_heads"] * hd
    out: Layout = [
        (f"{p}.self_attn.q_proj", "fp8", (q, h)),
        (f"{p}.self_attn.k_proj", "fp8", (kv, h)),
        (f"{p}.self_attn.v_proj", "fp8", (kv, h)),
        (f"{p}.self_attn.o_proj", "fp8", (h, q)),
        (f"{p}.self_attn.q_norm.weight", "norm", (hd,)),
        (f"{p}.self_attn.k_norm.weight", "norm", (hd,)),
    ]
    if c.get("attention_bias"):
        out += [(f"{p}.self_attn.{m}_proj.bias", "bf16", (n,)) for m, n in (("q", q), ("k", kv), ("v", kv))]
    return out


def _mlp(p: str, hidden: int, inter: int) -> Layout:
    return [
        (f"{p}.gate_proj", "fp8", (inter, hidden)),
        (f"{p}.up_proj", "fp8", (inter, hidden)),
        (f"{p}.down_proj", "fp8", (hidden, inter)),
    ]


def _layer_norms(p: str, hidden: int) -> Layout:
    return [
        (f"{p}.input_layernorm.weight", "norm", (hidden,)),
        (f"{p}.post_attention_layernorm.weight", "norm", (hidden,)),
    ]


def _embeddings(c: dict) -> Layout:
    v, h = c["vocab"], c["hidden"]
    return [
        ("model.embed_tokens.weight", "bf16", (v, h)),
        ("model.norm.weight", "norm", (h,)),
        ("lm_head.weight", "bf16", (v, h)),
    ]


def qwen3_dense_layout(c: dict) -> Layout:
    out = _embeddings(c)
    for i, inter in enumerate(c["intermediate"]):
        p = f"model.layers.{i}"
        out += _layer_norms(p, c["hidden"]) + _qwen3_attention(p, c) + _mlp(f"{p}.mlp", c["hidden"], inter)
    return out


def qwen3_moe_layout(c: dict) -> Layout:
    out = _embeddings(c)
    for i in range(c["layers"]):
        p = f"model.layers.{i}"
        out += _layer_norms(p, c["hidden"]) + _qwen3_attention(p, c)
        out.append((f"{p}.mlp.gate.weight", "bf16", (c["experts"], c["hidden"])))
        for e in range(c["experts"]):
            out += _mlp(f"{p}.mlp.experts.{e}", c["hidden"], c["moe_intermediate"])
    return out


def deepseek_v3_layout(c: dict) -> Layout:
    h, nh = c["hidden"], c["heads"]
    qk_head = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    out = _embeddings(c)
    for i in range(2):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        out += _layer_norms(p, h) + [
            (f"{a}.q_a_proj", "fp8", (c["q_lora_rank"], h)),
            (f"{a}.q_a_layernorm.weight", "norm", (c["q_lora_rank"],)),
            (f"{a}.q_b_proj", "fp8", (nh * qk_head, c["q_lora_rank"])),
            (f"{a}.kv_a_proj_with_mqa", "fp8", (c["kv_lora_rank"] + c["qk_rope_head_dim"], h)),
            (f"{a}.kv_a_layernorm.weight", "norm", (c["kv_lora_rank"],)),
            (
                f"{a}.kv_b_proj",
                "fp8",
                (nh * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]),
            ),
            (f"{a}.o_proj", "fp8", (h, nh * c["v_head_dim"])),
        ]
        if i == 0:  # first_k_dense_replace = 1
            out += _mlp(f"{p}.mlp", h, c["intermediate"])
        else:
            out += [
                (f"{p}.mlp.gate.weight", "bf16", (c["experts"], h)),
                (f"{p}.mlp.gate.e_score_correction_bias", "f32", (c["experts"],)),
            ]
            for e in range(c["experts"]):
                out += _mlp(f"{p}.mlp.experts.{e}", h, c["moe_intermediate"])
            out += _mlp(f"{p}.mlp.shared_experts", h, c["moe_intermediate"] * c["shared_experts"])
    return out


def materialize(c: dict, layout: Layout) -> dict[str, Tensor]:
    """Draw and encode every tensor of a layout; returns name -> Tensor, sorted by name."""
    seed, not_converted = c["seed"], set(c.get("not_converted", ()))
    out: dict[str, Tensor] = {}

    def bf16(x: np.ndarray) -> bytes:
        return x.astype(np.float32).astype(ml_dtypes.bfloat16).tobytes()

    for name, kind, shape in layout:
        if kind == "fp8":
            w = make_weight(seed, f"{name}.weight", shape)
            if name in not_converted:
                out[f"{name}.weight"] = Tensor("BF16", shape, bf16(w))
                continue
            codes, scale = quantize_blockwise(w, scale_dtype=c["scale_dtype"], pow2=c["pow2_scales"])
            out[f"{name}.weight"] = Tensor("F8_E4M3", shape, codes.tobytes())
            out[f"{name}.weight_scale_inv"] = Tensor(c["scale_dtype"], scale.shape, scale.tobytes())
        elif kind == "bf16":
            out[name] = Tensor("BF16", shape, bf16(_normal(_bitgen(seed, name), shape, 0.02)))
        elif kind == "norm":
            out[name] = Tensor("BF16", shape, bf16(1.0 + _normal(_bitgen(seed, name), shape, 0.05)))
        elif kind == "f32":
            out[name] = Tensor("F32", shape, _normal(_bitgen(seed, name), shape, 0.1).tobytes())
        else:
            raise ValueError(kind)
    assert len(out) == len(set(out)), "duplicate tensor name"
    return dict(sorted(out.items()))


def shard_by_layer(
    c: dict, tensors: dict[str, Tensor], layer_shard: Callable[[int, str], int]
) -> dict[str, int]:
    """Embeddings go to shard 1, a tensor of layer L to layer_shard(L, name), the final norm
    and lm_head to the last shard; then the deliberate moves of the spec table are applied."""
    shard_of = {}
    for name in tensors:
        if name.startswith("model.layers."):
            shard_of[name] = layer_shard(int(name.split(".")[2]), name)
        elif name == "model.embed_tokens.weight":
            shard_of[name] = 1
        else:
            shard_of[name] = c["shards"]
    for name, shard in c.get("moved_to_other_shard", {}).items():
        assert name in shard_of and shard != shard_of[name.replace("_scale_inv", "")]
        shard_of[name] = shard
    return shard_of


# ---------------------------------------------------------------------------------------
# Non-weight files: configs, tokenizers, templates
# ---------------------------------------------------------------------------------------

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)

DEEPSEEK_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{%- else %}{{ '<｜Assistant｜>' + message['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<｜Assistant｜>' }}{%- endif %}"
)

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
DEEPSEEK_SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")

# Byte-level BPE pieces ("Ġ" is the space byte); every merge result is in the vocabulary.
_BASE_TOKENS = ["Ġ"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
_MERGES = [
    "Ġ t", "h e", "i n", "e r", "a n", "o n", "r e", "Ġ a", "e n", "a t", "o r", "e s",
    "Ġ s", "Ġ w", "Ġ c", "i s", "i t", "Ġ b", "Ġ f", "Ġ m", "Ġ p", "Ġ o", "Ġt he", "Ġ d",
    "a l", "a r", "o u", "e d", "i c", "n d", "t h", "l e", "Ġ h", "o m", "in g", "Ġ i",
]


def tokenizer_files(vocab_size: int, specials: tuple[str, ...], tokenizer_class: str) -> dict[str, bytes]:
    """A tiny but self-consistent byte-level BPE tokenizer (tokenizer.json, vocab.json,
    merges.txt) whose ids fill exactly ``vocab_size``, special tokens last."""
    n_merges = vocab_size - len(specials) - len(_BASE_TOKENS)
    assert 0 <= n_merges <= len(_MERGES)
    merges = _MERGES[:n_merges]
    pieces = _BASE_TOKENS + [m.replace(" ", "") for m in merges]
    assert len(set(pieces)) == len(pieces)
    vocab = {tok: i for i, tok in enumerate(pieces)}
    first_special = len(pieces)
    added = [
        {"id": first_special + i, "content": s, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for i, s in enumerate(specials)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": merges,
        },
    }
    eos = specials[1] if tokenizer_class.startswith("Llama") else specials[-1]
    tok_config = {
        "add_bos_token": tokenizer_class.startswith("Llama"),
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for a in added
        },
        "bos_token": specials[0] if tokenizer_class.startswith("Llama") else None,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "model_max_length": 4096,
        "pad_token": specials[0] if not tokenizer_class.startswith("Llama") else eos,
        "tokenizer_class": tokenizer_class,
        "unk_token": None,
    }
    special_map = {"eos_token": eos, "pad_token": tok_config["pad_token"]}
    if tok_config["bos_token"]:
        special_map["bos_token"] = tok_config["bos_token"]
    return {
        "tokenizer.json": _json_bytes(tokenizer),
        "tokenizer_config.json": _json_bytes(tok_config),
        "special_tokens_map.json": _json_bytes(special_map),
        "vocab.json": _json_bytes(vocab),
        "merges.txt": ("#version: 0.2\n" + "".join(m + "\n" for m in merges)).encode(),
    }


def _with_chat_template(files: dict[str, bytes], template: str) -> None:
    """Put the chat template inside tokenizer_config.json (the older layout)."""
    cfg = json.loads(files["tokenizer_config.json"])
    cfg["chat_template"] = template
    files["tokenizer_config.json"] = _json_bytes(cfg)


def _generation_config(bos: int, eos: int) -> bytes:
    return _json_bytes(
        {"bos_token_id": bos, "do_sample": True, "eos_token_id": eos, "temperature": 0.6,
         "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"},
        sort_keys=True,
    )


def _readme(dir_name: str, note: str = "") -> bytes:
    text = f"Synthetic {dir_name} checkpoint (random weights), generated by scripts/make_fixtures.py; do not edit.\n"
    return (text + note).encode()


def _fp8_quant_config(**extra: object) -> dict:
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [BLOCK, BLOCK], **extra}


def _qwen3_common_config(c: dict) -> dict:
    v = c["vocab"]
    return {
        "attention_bias": bool(c.get("attention_bias", False)),
        "attention_dropout": 0.0,
        "bos_token_id": v - 3,
        "eos_token_id": v - 1,
        "head_dim": c["head_dim"],
        "hidden_act": "silu",
        "hidden_size": c["hidden"],
        "initializer_range": 0.02,
        "max_position_embeddings": 4096,
        "num_attention_heads": c["heads"],
        "num_key_value_heads": c["kv_heads"],
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": v,
    }


# ---------------------------------------------------------------------------------------
# The three fixtures
# ---------------------------------------------------------------------------------------


@dataclass
class Fixture:
    dir: str
    tensors: dict[str, Tensor]
    shard_of: dict[str, int] | None
    n_shards: int
    files: dict[str, bytes] = field(default_factory=dict)


def build_qwen3_dense() -> Fixture:
    c = QWEN3_DENSE
    config = _qwen3_common_config(c) | {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "intermediate_size": c["intermediate"][0],
        "num_hidden_layers": len(c["intermediate"]),
        "quantization_config": _fp8_quant_config(),
    }
    files = {
        "config.json": _json_bytes(config, sort_keys=True),
        "generation_config.json": _generation_config(c["vocab"] - 3, c["vocab"] - 1),
        "chat_template.jinja": CHATML_TEMPLATE.encode(),
        "README.md": _readme(
            c["dir"],
            "Layer 1's MLP is deliberately 160 wide (config.json says 192, layer 0's width).\n",
        ),
        **tokenizer_files(c["vocab"], QWEN_SPECIALS, "Qwen2Tokenizer"),
    }
    return Fixture(c["dir"], materialize(c, qwen3_dense_layout(c)), None, 1, files)


def build_qwen3_moe() -> Fixture:
    c = QWEN3_MOE
    not_convert = ["lm_head", *c["not_converted"]] + [f"model.layers.{i}.mlp.gate" for i in range(c["layers"])]
    config = _qwen3_common_config(c) | {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "decoder_sparse_step": 1,
        "intermediate_size": 2 * c["moe_intermediate"],
        "mlp_only_layers": [],
        "moe_intermediate_size": c["moe_intermediate"],
        "norm_topk_prob": True,
        "num_experts": c["experts"],
        "num_experts_per_tok": c["experts_per_tok"],
        "num_hidden_layers": c["layers"],
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "quantization_config": _fp8_quant_config(modules_to_not_convert=not_convert),
    }
    tensors = materialize(c, qwen3_moe_layout(c))
    # shard 1: embeddings + layer 0, shard 2: layer 1, shard 3: final norm + lm_head
    shard_of = shard_by_layer(c, tensors, lambda layer, name: 1 + layer)
    v = c["vocab"]
    tok = tokenizer_files(v, QWEN_SPECIALS, "Qwen2Tokenizer")
    _with_chat_template(tok, CHATML_TEMPLATE)
    files = {
        "config.json": _json_bytes(config, sort_keys=True),
        "generation_config.json": _generation_config(v - 3, v - 1),
        "added_tokens.json": _json_bytes({s: v - len(QWEN_SPECIALS) + i for i, s in enumerate(QWEN_SPECIALS)}),
        # arbitrary bytes: only checks that the converter copies a binary tokenizer file
        "tokenizer.model": _bitgen(c["seed"], "tokenizer.model").random_raw(32).astype("<u8").tobytes(),
        "README.md": _readme(c["dir"]),
        **tok,
    }
    return Fixture(c["dir"], tensors, shard_of, c["shards"], files)


CONFIGURATION_DEEPSEEK_PY = '''\
"""Remote-code stub for the synthetic DeepSeek-V3 fixture (only its presence is tested)."""
from transformers.configuration_utils import PretrainedConfig


class DeepseekV3Config(PretrainedConfig):
    model_type = "deepseek_v3"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
'''


def build_deepseek_v3() -> Fixture:
    c = DEEPSEEK_V3
    v = c["vocab"]
    bos, eos = v - len(DEEPSEEK_SPECIALS), v - len(DEEPSEEK_SPECIALS) + 1
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
        "bos_token_id": bos,
        "eos_token_id": eos,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": c["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": c["intermediate"],
        "kv_lora_rank": c["kv_lora_rank"],
        "max_position_embeddings": 4096,
        "model_type": "deepseek_v3",
        "moe_intermediate_size": c["moe_intermediate"],
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": c["experts"],
        "n_shared_experts": c["shared_experts"],
        "norm_topk_prob": True,
        "num_attention_heads": c["heads"],
        "num_experts_per_tok": c["experts_per_tok"],
        "num_hidden_layers": 2,
        "num_key_value_heads": c["heads"],
        "num_nextn_predict_layers": 0,
        "q_lora_rank": c["q_lora_rank"],
        "qk_nope_head_dim": c["qk_nope_head_dim"],
        "qk_rope_head_dim": c["qk_rope_head_dim"],
        "quantization_config": _fp8_quant_config(scale_fmt="ue8m0"),
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "v_head_dim": c["v_head_dim"],
        "vocab_size": v,
    }
    tensors = materialize(c, deepseek_v3_layout(c))
    # shard 1: embeddings, layer 0 and layer 1's attention; shard 2: layer 1's MLP, norm, lm_head
    shard_of = shard_by_layer(c, tensors, lambda layer, name: 2 if layer == 1 and ".mlp." in name else 1)
    tok = tokenizer_files(v, DEEPSEEK_SPECIALS, "LlamaTokenizerFast")
    _with_chat_template(tok, DEEPSEEK_TEMPLATE)
    pieces = json.loads(tok["vocab.json"])
    tiktoken = "".join(
        f"{base64.b64encode(p.replace('Ġ', ' ').encode()).decode()} {rank}\n" for p, rank in pieces.items()
    )
    files = {
        "config.json": _json_bytes(config, sort_keys=True),
        "generation_config.json": _generation_config(bos, eos),
        "configuration_deepseek.py": CONFIGURATION_DEEPSEEK_PY.encode(),
        "vocab.tiktoken": tiktoken.encode(),
        "README.md": _readme(c["dir"]),
        **tok,
    }
    return Fixture(c["dir"], tensors, shard_of, c["shards"], files)


BUILDERS = (build_qwen3_dense, build_qwen3_moe, build_deepseek_v3)
FIXTURE_DIRS = tuple(spec["dir"] for spec in (QWEN3_DENSE, QWEN3_MOE, DEEPSEEK_V3))


def write_fixture(out_dir: Path, fx: Fixture) -> Path:
    """(Re)create OUT_DIR/<fixture> from scratch: weights, index and the other files."""
    d = out_dir / fx.dir
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    write_checkpoint(d, fx.tensors, fx.shard_of, fx.n_shards)
    for fname, data in sorted(fx.files.items()):
        (d / fname).write_bytes(data)
    return d


def main(out_dir: str | Path | None = None) -> list[Path]:
    """Generate all fixtures under ``out_dir`` (default: fixtures/ next to scripts/)."""
    assert sys.byteorder == "little", "tensor bytes are written in native (little-endian) order"
    out = Path(out_dir) if out_dir is not None else Path(__file__).resolve().parent.parent / "fixtures"
    out.mkdir(parents=True, exist_ok=True)
    return [write_fixture(out, build()) for build in BUILDERS]


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", metavar="OUT_DIR", help="where to write them (default: <repo>/fixtures)")
    for path in main(parser.parse_args().out_dir):
        size = sum(f.stat().st_size for f in path.iterdir())
        print(f"{path}: {size} bytes")
