#!/usr/bin/env python3
"""Benchmark `ascendconv convert` against `cp -r` of the same source (issue 5).

    python scripts/bench.py [--size-gb 2.2] [--reps 3] [--cache bench-cache] [--json out.json]
    python scripts/bench.py --size-gb 4.4 --reps 1 --skip-reference     # the memory check

1. Builds (once; cached under --cache, default ./bench-cache/) a synthetic DeepSeek-like block-FP8
   checkpoint of about --size-gb GB with the project's own ShardWriter: hidden 4096, MLA attention
   projections (kv_a_proj_with_mqa [576, 4096] has a ragged last tile row; kv_b_proj stays FLOAT,
   i.e. is resolved to BF16), one dense MLP with intermediate 10944 (85.5 tiles: ragged rows for
   gate/up, a ragged last tile column for down), then MoE layers of 16 routed experts
   [1408, 4096] / [4096, 1408] plus a shared expert, BF16 embeddings, norms and router, F32 tile
   scales; 512 MB shards with an index. E4M3 codes are those of a Gaussian weight whose tile
   maximum (about 4.6 sigma) maps to 448, drawn from a 65536-entry inverse-CDF table (so the build
   runs at numpy speed); tile scales are log-normal float32 around 0.02 * 4.6 / 448. Seeded.
   A "slice" checkpoint hard-links shard(s) from the second on (about --slice-gb GB: decoder
   layers, like the bulk of the checkpoint) for the reference kernel.
2. Reads the source once, so that every run reads it from the page cache.
3. Runs, --reps times and alternating within each repetition (the order rotates): `cp -r SRC OUT`
   (then once more at once, see AGAIN), `convert --kernel reference` on the slice (per scheme),
   and the default `convert` (numba kernels, --workers 0: every core) for w8a8-mxfp8 and
   w4a8-mxfp, all with the mse rule. Each timed region is the command plus `sync -f OUT` (the
   data it wrote reaches the disk); OUT is deleted and the disk synced between runs, outside the
   timed region. Peak resident memory is /usr/bin/time's "maximum resident set size".
4. Prints, per command: median seconds, MB/s of source read, the median over repetitions of the
   ratio to that repetition's `cp -r` (and to its repeated `cp -r`), the speed-up over the
   reference kernel (MB/s of the default convert over MB/s of the reference on the slice), and
   peak RSS; then the issue's targets with PASS/FAIL, judged on the ratio to the first `cp -r` as
   the issue defines it. --json writes it all to a file.

It also checks that the numba and reference kernels write byte-identical shards for the slice.
Numba's cache is warmed by an untimed conversion of the slice first; --compile-time also reports
the kernels' first compilation (an import with an empty cache) and a cached import.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from ascendconv.io.safetensors import ShardWriter, TensorSpec

REPO = Path(__file__).resolve().parent.parent
BUILD_VERSION = 1  # bump when the generator changes: the cache key includes it
BLOCK = 128
HIDDEN = 4096
VOCAB = 8192
DENSE_INTERMEDIATE = 10944  # DeepSeek-V2-Lite's: 85.5 tiles of 128
EXPERTS = 16
MOE_INTERMEDIATE = 1408  # 11 tiles of 128
SHARD_BYTES = 512 * 2**20
SIGMA_CODES = 448.0 / 4.6  # a Gaussian tile whose largest |w| (about 4.6 sigma) maps to 448
SCHEMES = ("w8a8-mxfp8", "w4a8-mxfp")
TARGET_RATIO = {"w8a8-mxfp8": 1.25, "w4a8-mxfp": 1.0}
TARGET_SPEEDUP = 20.0
TARGET_RSS = 2**30


# --- the synthetic checkpoint ------------------------------------------------------------------


def layer_linears(layer: int) -> list[tuple[str, int, int]]:
    """(module prefix, N, K) of one decoder layer; layer 0 is dense, the others MoE."""
    p = f"model.layers.{layer}"
    mods = [
        (f"{p}.self_attn.q_a_proj", 1536, HIDDEN),
        (f"{p}.self_attn.kv_a_proj_with_mqa", 576, HIDDEN),  # ragged: 4.5 tile rows
        (f"{p}.self_attn.q_b_proj", 3072, 1536),
        (f"{p}.self_attn.kv_b_proj", 4096, 512),  # stays FLOAT: resolved to BF16
        (f"{p}.self_attn.o_proj", HIDDEN, HIDDEN),
    ]
    if layer == 0:
        i = DENSE_INTERMEDIATE
        mods += [(f"{p}.mlp.gate_proj", i, HIDDEN), (f"{p}.mlp.up_proj", i, HIDDEN), (f"{p}.mlp.down_proj", HIDDEN, i)]
        return mods
    experts = [f"{p}.mlp.experts.{e}" for e in range(EXPERTS)] + [f"{p}.mlp.shared_experts"]
    for e in experts:
        i = MOE_INTERMEDIATE
        mods += [(f"{e}.gate_proj", i, HIDDEN), (f"{e}.up_proj", i, HIDDEN), (f"{e}.down_proj", HIDDEN, i)]
    return mods


def layer_bytes(layer: int) -> int:
    return sum(n * k for _, n, k in layer_linears(layer))


def layer_count(size_bytes: float) -> int:
    rest = size_bytes - 2 * VOCAB * HIDDEN * 2 - layer_bytes(0)
    return 1 + max(0, round(rest / layer_bytes(1)))


def tensors_of(layers: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) of every tensor, in file order; a weight's scale follows it."""
    out = [("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN))]
    for layer in range(layers):
        p = f"model.layers.{layer}"
        out.append((f"{p}.input_layernorm.weight", "BF16", (HIDDEN,)))
        out.append((f"{p}.post_attention_layernorm.weight", "BF16", (HIDDEN,)))
        out.append((f"{p}.self_attn.q_a_layernorm.weight", "BF16", (1536,)))
        out.append((f"{p}.self_attn.kv_a_layernorm.weight", "BF16", (512,)))
        if layer > 0:
            out.append((f"{p}.mlp.gate.weight", "BF16", (EXPERTS, HIDDEN)))
            out.append((f"{p}.mlp.gate.e_score_correction_bias", "F32", (EXPERTS,)))
        for prefix, n, k in layer_linears(layer):
            out.append((prefix + ".weight", "F8_E4M3", (n, k)))
            out.append((prefix + ".weight_scale_inv", "F32", (math.ceil(n / BLOCK), math.ceil(k / BLOCK))))
    out.append(("model.norm.weight", "BF16", (HIDDEN,)))
    out.append(("lm_head.weight", "BF16", (VOCAB, HIDDEN)))
    return out


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


def config_json(layers: int) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": HIDDEN,
        "intermediate_size": DENSE_INTERMEDIATE,
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "n_routed_experts": EXPERTS,
        "n_shared_experts": 1,
        "num_hidden_layers": layers,
        "first_k_dense_replace": 1,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "vocab_size": VOCAB,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK],
        },
    }


def build_checkpoint(root: Path, size_gb: float) -> None:
    """Write the checkpoint into a temporary sibling, then rename it into place."""
    layers = layer_count(size_gb * 1e9)
    tensors = tensors_of(layers)
    shards: list[list] = [[]]
    size = 0
    i = 0
    while i < len(tensors):
        unit = tensors[i : i + 2] if tensors[i][1] == "F8_E4M3" else tensors[i : i + 1]  # weight + scale together
        unit_size = sum(math.prod(s) * (1 if d == "F8_E4M3" else 2 if d == "BF16" else 4) for _, d, s in unit)
        if shards[-1] and size + unit_size > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].extend(unit)
        size += unit_size
        i += len(unit)
    partial = root.parent / (root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    rng = np.random.default_rng(20260501)
    table = code_table()
    weight_map = {}
    total = 0
    started = time.perf_counter()
    for number, members in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        writer = ShardWriter(partial / file, [TensorSpec(n, d, s) for n, d, s in members], {"format": "pt"})
        for name, dtype, shape in members:
            data = tensor_bytes(rng, table, name, dtype, shape)
            writer.write(name, data)
            weight_map[name] = file
            total += data.nbytes
        writer.close()
        print(f"  {file}: {len(members)} tensors", file=sys.stderr, flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (partial / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (partial / "config.json").write_text(json.dumps(config_json(layers), indent=2) + "\n")
    (partial / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")
    os.sync()
    partial.rename(root)
    print(f"  built {total / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def build_slice(source: Path, root: Path, slice_gb: float) -> None:
    """Shard(s) of the source (hard links) with its config, no index: from the second shard on,
    so that the slice holds what most of the checkpoint holds (decoder layers), not the first
    shard's embedding table, which every converter merely copies."""
    partial = root.parent / (root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    size = 0
    shards = sorted(source.glob("*.safetensors"))
    for shard in shards[1:] or shards:
        if size >= slice_gb * 1e9:
            break
        os.link(shard, partial / shard.name)
        size += shard.stat().st_size
    shutil.copyfile(source / "config.json", partial / "config.json")
    partial.rename(root)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def warm(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(64 * 2**20):
                    pass


# --- timing ----------------------------------------------------------------------------------


def ascendconv_command() -> list[str]:
    script = Path(sys.executable).parent / "ascendconv"
    return [str(script)] if script.exists() else [sys.executable, "-c", "from ascendconv.cli import app; app()"]


TIME = Path("/usr/bin/time")
# `cp -r` timed a second time right after the first one's output was deleted. On virtual machines
# that hand free memory back to the host (virtio-balloon free page reporting), pages the page cache
# takes for cp's writes cost a host fault when they were reported free a few seconds before, and
# almost nothing when they were freed a moment ago: the first cp of a repetition pays that cost
# (as it would after any other work), the second one mostly does not. Both are shown.
AGAIN = "cp -r (again at once)"


def run_timed(command: list[str], out: Path) -> tuple[float, int]:
    """(seconds of command + `sync -f out`, the command's peak RSS in bytes).

    The peak RSS is what `/usr/bin/time -v` reports ("Maximum resident set size"); without it,
    the child's own ru_maxrss from wait4 (which may include this process's size at fork time).
    """
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        wrapped = [str(TIME), "-f", "%M", "-o", report.name, *command] if TIME.exists() else command
        started = time.perf_counter()
        process = subprocess.Popen(wrapped, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(process.pid, 0)
        subprocess.run(["sync", "-f", str(out)], check=True)
        seconds = time.perf_counter() - started
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise SystemExit(f"command failed ({code}): {' '.join(command)}\n{stderr}")
        peak_kib = int(report.read().split()[-1]) if TIME.exists() else usage.ru_maxrss
    return seconds, peak_kib * 1024


def clear(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    os.sync()


def shard_digests(package: Path) -> dict:
    provenance = json.loads((package / "ascendconv_provenance.json").read_text())
    return {name: entry["sha256"] for name, entry in provenance["shards"].items()}


def compile_time() -> tuple[float, float]:
    """Seconds to import ascendconv.formats.kernels in a fresh process with an empty numba cache
    (the first compilation), then again with that cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        lines = ["import time", "t = time.perf_counter()", "import ascendconv.formats.kernels"]
        probe = "\n".join(lines + ["print(time.perf_counter() - t)"])

        def seconds() -> float:
            run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
            return float(run.stdout)

        cold = seconds()
        cached = seconds()
    return cold, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=REPO / "bench-cache", help="where the synthetic checkpoints live")
    parser.add_argument("--size-gb", type=float, default=2.2, help="size of the synthetic checkpoint (GB)")
    parser.add_argument("--slice-gb", type=float, default=0.25, help="size of the slice for the reference kernel")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="convert --workers (0: every core)")
    parser.add_argument("--skip-reference", action="store_true", help="do not time the reference kernel")
    parser.add_argument("--compile-time", action="store_true", help="also time the kernels' first compilation")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args()

    source = args.cache / f"synthetic-v{BUILD_VERSION}-{args.size_gb:g}gb"
    if not source.is_dir():
        print(f"building {source} ...", file=sys.stderr)
        build_checkpoint(source, args.size_gb)
    slice_dir = args.cache / f"{source.name}-slice{args.slice_gb:g}gb-v2"
    if not slice_dir.is_dir():
        build_slice(source, slice_dir, args.slice_gb)
    work = args.cache / "out"
    work.mkdir(parents=True, exist_ok=True)
    out = work / "package"
    source_bytes = dir_bytes(source)
    slice_bytes = dir_bytes(slice_dir)

    convert = ascendconv_command() + ["convert", "--quiet", "--scale-rule", "mse", "--workers", str(args.workers)]
    copy = ["cp", "-r", str(source), str(out)]
    commands: list[tuple[str, list[str], int]] = [("cp -r", copy, source_bytes)]
    if not args.skip_reference:
        for scheme in SCHEMES:
            argv = convert + ["--kernel", "reference", "--scheme", scheme, str(slice_dir), str(out)]
            commands.append((f"reference {scheme} (slice)", argv, slice_bytes))
    for scheme in SCHEMES:
        commands.append((f"convert {scheme}", convert + ["--scheme", scheme, str(source), str(out)], source_bytes))

    compile_seconds = compile_time() if args.compile_time else None

    # untimed: warm numba's cache, and check that both kernels write the same bytes
    print("warming up (untimed) ...", file=sys.stderr)
    identical = {}
    for scheme in SCHEMES:
        digests = []
        for kernel in ("numba", "reference"):
            clear(out)
            subprocess.run(convert + ["--kernel", kernel, "--scheme", scheme, str(slice_dir), str(out)], check=True)
            digests.append(shard_digests(out))
        identical[scheme] = digests[0] == digests[1]
    clear(out)
    warm(source)

    times: dict[str, list[float]] = {name: [] for name, _, _ in commands}
    rss: dict[str, int] = {name: 0 for name, _, _ in commands}
    times[AGAIN], rss[AGAIN] = [], 0
    for rep in range(args.reps):
        order = commands[rep % len(commands) :] + commands[: rep % len(commands)]  # rotate: no fixed position
        for name, command, _ in order:
            runs = [(name, command)]
            if name == "cp -r":  # and again at once: see AGAIN
                runs.append((AGAIN, command))
            for label, argv in runs:
                clear(out)
                seconds, peak = run_timed(argv, out)
                times[label].append(seconds)
                rss[label] = max(rss[label], peak)
                line = f"  rep {rep + 1}: {label:32s} {seconds:7.2f} s  {peak / 2**20:7.0f} MiB"
                print(line, file=sys.stderr, flush=True)
    clear(out)

    results = []
    cp_times, again_times = times["cp -r"], times[AGAIN]
    ref_rate = {}
    rows = commands[:1] + [(AGAIN, copy, source_bytes)] + commands[1:]
    for name, _, nbytes in rows:
        median = statistics.median(times[name])
        rate = nbytes / median / 1e6
        ratio = statistics.median(t / c for t, c in zip(times[name], cp_times))
        ratio_again = statistics.median(t / c for t, c in zip(times[name], again_times))
        row = {
            "command": name,
            "bytes": nbytes,
            "median_s": round(median, 3),
            "mb_per_s": round(rate, 1),
            "ratio_to_cp": round(ratio, 3),
            "ratio_to_cp_again": round(ratio_again, 3),
            "peak_rss_mib": round(rss[name] / 2**20, 1),
            "times_s": [round(t, 3) for t in times[name]],
        }
        if name.startswith("reference"):
            ref_rate[name.split()[1]] = rate
        results.append(row)
    for row in results:
        scheme = row["command"].split()[1] if row["command"].startswith("convert") else None
        if scheme in ref_rate:
            row["speedup_vs_reference"] = round(row["mb_per_s"] / ref_rate[scheme], 1)

    print()
    print(
        f"source {source_bytes / 1e9:.2f} GB ({source.name}), slice {slice_bytes / 1e9:.2f} GB, "
        f"{os.cpu_count()} cores, {args.reps} reps, sync included"
    )
    header = (
        f"{'command':34s} {'median s':>9s} {'MB/s':>8s} {'x cp':>6s} {'x again':>8s} {'speed-up':>9s} {'peak RSS':>10s}"
    )
    print(header)
    print("-" * len(header))
    for row in results:
        speedup = f"{row['speedup_vs_reference']:.1f}x" if "speedup_vs_reference" in row else ""
        print(
            f"{row['command']:34s} {row['median_s']:9.2f} {row['mb_per_s']:8.0f} {row['ratio_to_cp']:6.2f} "
            f"{row['ratio_to_cp_again']:8.2f} {speedup:>9s} {row['peak_rss_mib']:7.0f} MiB"
        )
    print(f"('x again': the ratio to {AGAIN!r}, see the docstring)")
    print()
    checks = []
    for row in results:
        if row["command"].startswith("convert"):
            scheme = row["command"].split()[1]
            checks.append(
                (
                    f"{scheme}: wall <= {TARGET_RATIO[scheme]} x cp -r ({row['ratio_to_cp']:.2f} x; "
                    f"{row['ratio_to_cp_again']:.2f} x the repeated cp -r)",
                    row["ratio_to_cp"] <= TARGET_RATIO[scheme],
                )
            )
            if "speedup_vs_reference" in row:
                checks.append(
                    (
                        f"{scheme}: >= {TARGET_SPEEDUP:g} x the reference kernel ({row['speedup_vs_reference']:.1f} x)",
                        row["speedup_vs_reference"] >= TARGET_SPEEDUP,
                    )
                )
            rss_ok = row["peak_rss_mib"] * 2**20 < TARGET_RSS
            checks.append((f"{scheme}: peak RSS < 1 GiB ({row['peak_rss_mib']:.0f} MiB)", rss_ok))
    for scheme, same in identical.items():
        checks.append((f"{scheme}: numba and reference shards byte-identical (slice)", same))
    for text, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")
    if compile_seconds:
        cold, cached = compile_seconds
        print(f"  kernels' first compilation: {cold:.1f} s (cached import afterwards: {cached:.2f} s)")
    if args.json:
        report = {
            "source": source.name,
            "source_bytes": source_bytes,
            "slice_bytes": slice_bytes,
            "cores": os.cpu_count(),
            "reps": args.reps,
            "results": results,
            "checks": {text: ok for text, ok in checks},
        }
        if compile_seconds:
            report["compile_s"] = {"cold": round(compile_seconds[0], 2), "cached": round(compile_seconds[1], 2)}
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
