#!/usr/bin/env python3
"""Write a synthetic DeepSeek-like block-FP8 checkpoint of any size, to try ascendconv at scale.

    python scripts/synthetic_checkpoint.py OUT --size-gb 20          # about 20 GB of weights
    python scripts/synthetic_checkpoint.py OUT --layers 12 --hidden 1024 --experts 8

Layer 0 is dense, the others MoE (routed experts and one shared expert); attention is MLA with
ragged tiles (kv_a_proj_with_mqa has 4.5 tile rows at the default shape) and kv_b_proj, which the
model's rules keep FLOAT. E4M3 codes follow a Gaussian of the width real tiles have, F32 tile
scales vary log-normally; the weights are random, so only the numbers' statistics are realistic.
The output is the same bytes for the same options (a fixed seed). It is written into OUT.partial
and renamed into place when complete. `scripts/bench.py` builds its checkpoint with this module.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ascendconv.io.writer import ShardWriter, TensorSpec

BLOCK = 128
SIGMA_CODES = 448.0 / 4.6  # a Gaussian tile whose largest |w| (about 4.6 sigma) maps to 448
SEED = 20260501


@dataclass(frozen=True)
class Shape:
    """The model's sizes; the defaults are those of scripts/bench.py's checkpoint."""

    hidden: int = 4096
    vocab: int = 8192
    dense_intermediate: int = 10944  # DeepSeek-V2-Lite's: 85.5 tiles of 128
    experts: int = 16
    moe_intermediate: int = 1408  # 11 tiles of 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    shard_bytes: int = 512 * 2**20

    @property
    def heads(self) -> int:
        return max(1, self.hidden // 256)

    def layer_linears(self, layer: int) -> list[tuple[str, int, int]]:
        """(module prefix, N, K) of one decoder layer; layer 0 is dense, the others MoE."""
        p, h = f"model.layers.{layer}", self.hidden
        mods = [
            (f"{p}.self_attn.q_a_proj", self.q_lora_rank, h),
            (f"{p}.self_attn.kv_a_proj_with_mqa", self.kv_lora_rank + 64, h),  # + the rope part: ragged
            (f"{p}.self_attn.q_b_proj", self.heads * 192, self.q_lora_rank),
            (f"{p}.self_attn.kv_b_proj", self.heads * 256, self.kv_lora_rank),  # stays FLOAT: resolved to BF16
            (f"{p}.self_attn.o_proj", h, h),
        ]
        if layer == 0:
            i = self.dense_intermediate
            return mods + [(f"{p}.mlp.gate_proj", i, h), (f"{p}.mlp.up_proj", i, h), (f"{p}.mlp.down_proj", h, i)]
        i = self.moe_intermediate
        for e in [f"{p}.mlp.experts.{n}" for n in range(self.experts)] + [f"{p}.mlp.shared_experts"]:
            mods += [(f"{e}.gate_proj", i, h), (f"{e}.up_proj", i, h), (f"{e}.down_proj", h, i)]
        return mods

    def layer_bytes(self, layer: int) -> int:
        return sum(n * k for _, n, k in self.layer_linears(layer))

    def layer_count(self, size_bytes: float) -> int:
        """Layers that make about `size_bytes` of weights (the dense layer at least)."""
        rest = size_bytes - 2 * self.vocab * self.hidden * 2 - self.layer_bytes(0)
        return 1 + max(0, round(rest / self.layer_bytes(1)))

    def tensors(self, layers: int) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, dtype, shape) of every tensor, in file order; a weight's scale follows it."""
        h = self.hidden
        out = [("model.embed_tokens.weight", "BF16", (self.vocab, h))]
        for layer in range(layers):
            p = f"model.layers.{layer}"
            out.append((f"{p}.input_layernorm.weight", "BF16", (h,)))
            out.append((f"{p}.post_attention_layernorm.weight", "BF16", (h,)))
            out.append((f"{p}.self_attn.q_a_layernorm.weight", "BF16", (self.q_lora_rank,)))
            out.append((f"{p}.self_attn.kv_a_layernorm.weight", "BF16", (self.kv_lora_rank,)))
            if layer > 0:
                out.append((f"{p}.mlp.gate.weight", "BF16", (self.experts, h)))
                out.append((f"{p}.mlp.gate.e_score_correction_bias", "F32", (self.experts,)))
            for prefix, n, k in self.layer_linears(layer):
                out.append((prefix + ".weight", "F8_E4M3", (n, k)))
                out.append((prefix + ".weight_scale_inv", "F32", (math.ceil(n / BLOCK), math.ceil(k / BLOCK))))
        out.append(("model.norm.weight", "BF16", (h,)))
        out.append(("lm_head.weight", "BF16", (self.vocab, h)))
        return out

    def config(self, layers: int) -> dict:
        return {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_size": self.hidden,
            "intermediate_size": self.dense_intermediate,
            "moe_intermediate_size": self.moe_intermediate,
            "n_routed_experts": self.experts,
            "n_shared_experts": 1,
            "num_hidden_layers": layers,
            "first_k_dense_replace": 1,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "vocab_size": self.vocab,
            "torch_dtype": "bfloat16",
            "quantization_config": {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "activation_scheme": "dynamic",
                "weight_block_size": [BLOCK, BLOCK],
            },
        }


def code_table() -> np.ndarray:
    """65536 E4M3 codes: the inverse CDF of N(0, SIGMA_CODES**2) at the midpoints of 65536 bins."""
    from statistics import NormalDist

    p = (np.arange(65536) + 0.5) / 65536
    z = np.array([NormalDist().inv_cdf(float(x)) for x in p[:32768]])
    z = np.concatenate([z, -z[::-1]])
    values = np.clip(z * SIGMA_CODES, -448, 448).astype(np.float32)
    return values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def tensor_bytes(rng, table, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    if dtype == "F8_E4M3":
        return table[rng.integers(0, 65536, count, dtype=np.uint16)]
    if dtype == "F32" and name.endswith("_scale_inv"):  # tile scales of a weight with sigma 0.02
        return (0.02 / SIGMA_CODES * rng.lognormal(0.0, 0.25, count)).astype(np.float32)
    if dtype == "F32":
        return (rng.standard_normal(count) * 0.01).astype(np.float32)
    if name.endswith("norm.weight"):
        return np.ones(count, ml_dtypes.bfloat16)
    return (rng.standard_normal(count) * 0.02).astype(np.float32).astype(ml_dtypes.bfloat16)


def build(root: Path, shape: Shape, layers: int, log=print) -> int:
    """Write the checkpoint into a temporary sibling, then rename it into place; returns its bytes."""
    tensors = shape.tensors(layers)
    itemsize = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
    shards: list[list] = [[]]
    size = 0
    i = 0
    while i < len(tensors):
        unit = tensors[i : i + 2] if tensors[i][1] == "F8_E4M3" else tensors[i : i + 1]  # weight + scale together
        unit_size = sum(math.prod(s) * itemsize[d] for _, d, s in unit)
        if shards[-1] and size + unit_size > shape.shard_bytes:
            shards.append([])
            size = 0
        shards[-1].extend(unit)
        size += unit_size
        i += len(unit)
    partial = root.parent / (root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    table = code_table()
    weight_map = {}
    total = 0
    started = time.perf_counter()
    for number, members in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        writer = ShardWriter(partial / file, [TensorSpec(n, d, s) for n, d, s in members], {"format": "pt"})
        for name, dtype, tensor_shape in members:
            data = tensor_bytes(rng, table, name, dtype, tensor_shape)
            writer.write(name, data)
            weight_map[name] = file
            total += data.nbytes
        writer.close()
        log(f"  {file}: {len(members)} tensors")
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (partial / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (partial / "config.json").write_text(json.dumps(shape.config(layers), indent=2) + "\n")
    (partial / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")
    os.sync()
    partial.rename(root)
    log(f"  built {total / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s")
    return total


def main(argv: list[str] | None = None) -> int:
    defaults = Shape()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Convert it with: ascendconv convert OUT PACKAGE --scheme w4a8-mxfp-moe")
    parser.add_argument("out", type=Path, metavar="OUT", help="the checkpoint directory to create (must not exist)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--size-gb", type=float, help="about this many GB of weights (default: 2.3)")
    size.add_argument("--layers", type=int, help="this many decoder layers (layer 0 dense, the rest MoE)")
    for field_name in ("hidden", "vocab", "dense_intermediate", "experts", "moe_intermediate", "q_lora_rank", "kv_lora_rank"):
        parser.add_argument("--" + field_name.replace("_", "-"), type=int, default=getattr(defaults, field_name),
                            help=f"default {getattr(defaults, field_name)}")
    parser.add_argument("--shard-mb", type=int, default=defaults.shard_bytes // 2**20, help="shard size limit in MiB (default 512)")
    args = parser.parse_args(argv)
    if args.out.exists():
        parser.error(f"{args.out} exists; choose a new directory")
    shape = Shape(args.hidden, args.vocab, args.dense_intermediate, args.experts, args.moe_intermediate,
                  args.q_lora_rank, args.kv_lora_rank, args.shard_mb * 2**20)
    layers = args.layers if args.layers else shape.layer_count((args.size_gb or 2.3) * 1e9)
    if layers < 1 or min(args.hidden, args.experts, args.moe_intermediate, args.dense_intermediate) < 1:
        parser.error("--layers and every size must be at least 1")
    print(f"{args.out}: {layers} layers, hidden {shape.hidden}, {shape.experts} experts", file=sys.stderr)
    build(args.out, shape, layers, log=lambda line: print(line, file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
