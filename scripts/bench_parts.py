"""Time a one-process conversion, N parts run one after another plus assemble, and a resumed run.

    python scripts/bench_parts.py [--size-gb 2.2] [--parts 4] [--shard-mb 256] [--reps 2] [--cache bench-cache]

Builds (once, cached) scripts/bench.py's synthetic block-FP8 checkpoint in --shard-mb source shards,
then, per repetition (commands alternate; every timed command ends with `sync`):
1. `convert SRC OUT` in one process;
2. `convert SRC PARTDIR --part I/N` for I = 1..N one after another, then `assemble OUT PARTDIR...`;
3. `convert --resume` stopped by SIGTERM once about half of the shards are finished, then the
   resumed run, which reports the shards it reused.
Every package is compared byte for byte with the one-process package. Prints the medians.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import bench  # noqa: E402  (the synthetic checkpoint builder)

# One date for every run: the provenance records when a package was written (docs/package.md), and
# the packages of one repetition are compared whole, byte for byte.
RUN_ENV = {**os.environ, "SOURCE_DATE_EPOCH": "1764633600"}


def timed(args: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ascendconv", *args], capture_output=True, text=True, env=RUN_ENV)
    subprocess.run(["sync"], check=True)
    if done.returncode != 0:
        raise SystemExit(f"ascendconv {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return time.perf_counter() - started, done.stdout


def same_tree(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def stop_half_way(src: Path, out: Path, options: list[str], shards: int) -> tuple[float, int]:
    """Start a --resume run, SIGTERM it once half the shards are recorded; (seconds, shards kept)."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "ascendconv", "convert", str(src), str(out), "--resume", "--quiet", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=RUN_ENV,
    )
    finished: list[str] = []
    while process.poll() is None and len(finished) < shards // 2:
        for ledger in out.parent.glob(f".{out.name}.ascendconv-staging-*/.ascendconv-resume.json"):
            try:
                finished = list(json.loads(ledger.read_text())["shards"])
            except (OSError, ValueError):
                pass
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate()
    if process.returncode != 128 + signal.SIGTERM:
        raise SystemExit(f"the run to stop ended with {process.returncode}: {stderr}")
    return time.perf_counter() - started, len(finished)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=REPO / "bench-cache")
    parser.add_argument("--size-gb", type=float, default=2.2)
    parser.add_argument("--shard-mb", type=int, default=256, help="source and package shard size (MB)")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()

    bench.SHARD_BYTES = args.shard_mb * 10**6
    src = args.cache / f"synthetic-{args.size_gb}gb-{args.shard_mb}mb"
    if not src.exists():
        bench.build_checkpoint(src, args.size_gb)
    work = args.cache / "parts-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    options = ["--max-shard-size", f"{args.shard_mb}MB"]
    source_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    _, plan = timed(["convert", str(src), str(work / "plan"), "--dry-run", "--json", *options])
    shards = len(json.loads(plan)["shards"])
    print(f"source {source_bytes / 1e9:.2f} GB in {len(list(src.glob('*.safetensors')))} files; "
          f"package in {shards} shards; {args.parts} parts; {args.reps} reps; sync included")

    times: dict[str, list[float]] = {"one process": [], "parts": [], "assemble": [], "parts + assemble": [],
                                     "stopped run (until SIGTERM)": [], "resumed run": []}
    kept: list[int] = []
    for rep in range(args.reps):
        one = work / "one"
        seconds, _ = timed(["convert", str(src), str(one), "--quiet", *options])
        times["one process"].append(seconds)

        part_dirs = [work / f"part-{i}" for i in range(1, args.parts + 1)]
        part_seconds = sum(
            timed(["convert", str(src), str(d), "--part", f"{i}/{args.parts}", "--quiet", *options])[0]
            for i, d in enumerate(part_dirs, 1)
        )
        joined = work / "joined"
        seconds, _ = timed(["assemble", str(joined), *map(str, part_dirs), "--quiet"])
        times["parts"].append(part_seconds)
        times["assemble"].append(seconds)
        times["parts + assemble"].append(part_seconds + seconds)

        resumed = work / "resumed"
        seconds, finished = stop_half_way(src, resumed, options, shards)
        times["stopped run (until SIGTERM)"].append(seconds)
        seconds, out = timed(["convert", str(src), str(resumed), "--resume", "--json", *options])
        times["resumed run"].append(seconds)
        reused = json.loads(out)["reused_shards"]
        assert len(reused) == finished, (reused, finished)
        kept.append(len(reused))

        for package in (joined, resumed):
            assert same_tree(one, package), f"{package} differs from {one}"
        for path in (one, joined, resumed, *part_dirs):
            shutil.rmtree(path)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()) + f"; reused {kept[-1]}/{shards}")

    print(f"{'command':32} {'median s':>9} {'GB/s':>6}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:32} {median:9.2f} {source_bytes / 1e9 / median:6.2f}")
    print(f"shards reused by the resumed run: {kept} of {shards}; every package byte-identical to the one-process one")


if __name__ == "__main__":
    main()
