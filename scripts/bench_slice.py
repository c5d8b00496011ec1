#!/usr/bin/env python3
"""Convert one real-shape DeepSeek-V3 MoE layer, against `cp -r` of the same source (issue 11).

    python scripts/bench_slice.py [--experts 256] [--cache bench-cache] [--reps 1]

Builds (once, cached) layer 3 of DeepSeek-V3 at its published shapes: 256 routed experts with
gate_proj / up_proj [2048, 7168] and down_proj [7168, 2048] (about 11.3 GB of E4M3 codes, F32 tile
scales of 128x128), the router, and a config with the real dimensions; codes and scales come from
scripts/bench.py's generator. Then times `convert` under w8a8-mxfp8 and w4a8-mxfp-moe, each right
after its own `cp -r` + sync of the source, and prints seconds, GB/s, the ratio to `cp -r` and peak
RSS. It exits 1 when peak RSS reaches 1 GiB (the memory bound of issue 8 at any size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bench import BLOCK, REPO, Command, ascendconv_command, clear, code_table, dir_bytes, tensor_bytes, warm
from ascendconv.io.writer import ShardWriter, TensorSpec

HIDDEN = 7168
MOE_INTERMEDIATE = 2048
LAYER = 3  # DeepSeek-V3's first MoE layer (first_k_dense_replace = 3)
SHARD_BYTES = 4 * 10**9


def slice_tensors(experts: int) -> list[tuple[str, str, tuple[int, ...]]]:
    p = f"model.layers.{LAYER}.mlp"
    out = [(f"{p}.gate.weight", "BF16", (experts, HIDDEN)), (f"{p}.gate.e_score_correction_bias", "F32", (experts,))]
    for e in range(experts):
        for proj, (n, k) in (("gate_proj", (MOE_INTERMEDIATE, HIDDEN)), ("up_proj", (MOE_INTERMEDIATE, HIDDEN)),
                             ("down_proj", (HIDDEN, MOE_INTERMEDIATE))):
            out.append((f"{p}.experts.{e}.{proj}.weight", "F8_E4M3", (n, k)))
            out.append((f"{p}.experts.{e}.{proj}.weight_scale_inv", "F32", (-(-n // BLOCK), -(-k // BLOCK))))
    return out


def config_json(experts: int) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": HIDDEN,
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "n_routed_experts": experts,
        "num_hidden_layers": LAYER + 1,
        "first_k_dense_replace": LAYER,
        "num_nextn_predict_layers": 0,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [BLOCK, BLOCK]},
    }


def build_slice(root: Path, experts: int) -> None:
    tensors = slice_tensors(experts)
    sizes = [int(np.prod(s)) * {"F8_E4M3": 1, "BF16": 2, "F32": 4}[d] for _, d, s in tensors]
    shards, size = [[]], 0
    for tensor, nbytes in zip(tensors, sizes):
        if shards[-1] and size + nbytes > SHARD_BYTES and not tensor[0].endswith("_scale_inv"):
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += nbytes
    partial = root.parent / (root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    rng, table, weight_map = np.random.default_rng(20261201), code_table(), {}
    for number, members in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        writer = ShardWriter(partial / file, [TensorSpec(n, d, s) for n, d, s in members], {"format": "pt"})
        for name, dtype, shape in members:
            writer.write(name, tensor_bytes(rng, table, name, dtype, shape))
            weight_map[name] = file
        writer.close()
        print(f"  {file}: {len(members)} tensors", file=sys.stderr, flush=True)
    (partial / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (partial / "config.json").write_text(json.dumps(config_json(experts), indent=2) + "\n")
    os.sync()
    partial.rename(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--cache", type=Path, default=REPO / "bench-cache")
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    source = args.cache / f"deepseek-v3-layer{LAYER}-{args.experts}-experts"
    if not source.is_dir():
        print(f"building {source} ...", file=sys.stderr)
        build_slice(source, args.experts)
    out = args.cache / "out" / "slice-package"
    source_bytes = dir_bytes(source)
    warm(source)
    copy = ["cp", "-r", str(source), str(out)]
    commands = [
        Command(f"convert {scheme}", ascendconv_command() + ["convert", "--quiet", "--scheme", scheme, str(source), str(out)],
                source_bytes, copy, out)
        for scheme in ("w8a8-mxfp8", "w4a8-mxfp-moe")
    ]
    for _ in range(args.reps):
        for command in commands:
            command.run()
    clear(out)
    print(f"\n{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores, DeepSeek-V3 layer {LAYER}: "
          f"{args.experts} experts, source {source_bytes / 1e9:.2f} GB, median of {args.reps}, sync included")
    ok = True
    for command in commands:
        row = command.row()
        ok &= row["peak_rss_mib"] < 1024
        print(f"{row['command']:28s} {row['median_s']:7.2f} s  {row['mb_per_s'] / 1e3:5.2f} GB/s  "
              f"x{row['ratio']:.2f} cp -r ({row['baseline_s']:.2f} s)  {row['peak_rss_mib']:5.0f} MiB")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
