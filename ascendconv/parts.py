"""Parts: the package's shards split into N groups that separate jobs convert without talking.

The split is a pure function of the plan, so every job computes the same one: shards are taken
largest first (ties by shard number) and each goes to the part holding the fewest bytes so far
(ties by part number). A part directory holds its shards, the package's small files (identical in
every part) and PART_MANIFEST_NAME: the plan's identity, which part it is, its shards' checksums.
"""

from __future__ import annotations

import heapq
import re
from pathlib import Path

from ascendconv.errors import BadOptionError, plural, shown
from ascendconv.io.checksum import CHECKSUM
from ascendconv.ascendv1 import PART_MANIFEST_NAME
from ascendconv.plan import Plan
from ascendconv.resume import fingerprint, write_json_atomic

PART_FORMAT = "ascendconv-part/1"


def parse_part(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    try:  # int() refuses more than 4,300 digits (ValueError): no plan has that many shards either
        number, count = (int(match[1]), int(match[2])) if match else (0, 0)
    except ValueError:
        number = count = 0
    if not 1 <= number <= count:
        raise BadOptionError(f"cannot read --part {shown(text)}", "write --part I/N with 1 <= I <= N, e.g. --part 2/4")
    return number, count


def assign_parts(sizes: list[int], parts: int) -> list[list[int]]:
    """Shard numbers (0-based, ascending) of each of `parts` parts, balanced by bytes (the lightest
    part kept on a heap: shards x log(parts) steps)."""
    members: list[list[int]] = [[] for _ in range(parts)]
    loads = [(0, p) for p in range(parts)]  # a heap of (bytes so far, part): ties by part number
    for shard in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, lightest = loads[0]
        heapq.heapreplace(loads, (load + sizes[shard], lightest))
        members[lightest].append(shard)
    return [sorted(m) for m in members]


def check_part_count(count: int, shards: int, option: str) -> None:
    """A part holds one shard at least: more parts than the plan's shards would be empty work (and
    a count of 10**12 would be a list of 10**12 parts)."""
    if count > shards:
        raise BadOptionError(
            f"{option}: {plural(count, 'part')}, but the plan has {plural(shards, 'shard')} to share out",
            f"choose at most {plural(shards, 'part')}, or a smaller --max-shard-size for more shards",
        )


def part_shards(plan: Plan, part: tuple[int, int] | None) -> list[int]:
    """The shard numbers a run writes: all of them, or part I of N's."""
    if part is None:  # counted, not placed: a dry run never places the tensors it does not show
        return list(range(plan.figures.shards))
    number, count = part
    check_part_count(count, len(plan.shards), f"--part {number}/{count}")
    return assign_parts([s.nbytes for s in plan.shards], count)[number - 1]


def write_part_manifest(
    directory: Path, identity: dict, part: tuple[int, int], digests: dict[str, str], files: dict[str, str],
    reads: dict[str, str],
) -> None:
    """The part's manifest: written last, so a part directory that has one is complete."""
    number, count = part
    write_json_atomic(
        directory / PART_MANIFEST_NAME,
        {
            "format": PART_FORMAT,
            "part": number,
            "parts": count,
            "fingerprint": fingerprint(identity),
            "identity": identity,
            "checksum": CHECKSUM,
            "shards": dict(sorted(digests.items())),
            "files": dict(sorted(files.items())),  # name -> sha256 of the small files, as written
            "reads": dict(sorted(reads.items())),  # shard -> digest of the source bytes it was made from
        },
    )
