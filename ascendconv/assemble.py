"""assemble: join the part directories of one plan into the package, checked first, written atomically.

Every check runs before anything is created: the parts must come from one plan (same identity
fingerprint, same N), each part number must be given exactly once, each part must hold exactly the
shards the plan assigns to it, and every shard must still have the checksum its part recorded. The
package is then built in staging like `convert` builds it: shards hard-linked from the parts (copied
when the parts are on another filesystem; the parts' files are left as they are but for the mode of
a linked shard, which is the package's), the small files from the first part, and the provenance
that a one-process conversion writes.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ascendconv.ascendv1 import package_date, provenance_document
from ascendconv.package_files import dump_json, shard_sizes
from ascendconv.pipeline import Progress
from ascendconv.errors import (
    DuplicatePartError,
    ForeignPartError,
    MissingPartError,
    NotRegularFileError,
    PartError,
    ShardChecksumError,
)
from ascendconv.io.hfcache import local_directory
from ascendconv.io.outdir import StagedOutput, check_output, check_output_early, interruptible
from ascendconv.io.output import check_free_space, existing_ancestor, output_errors, space_needed
from ascendconv.io.checksum import CHECKSUM, hashed_file
from ascendconv.io.threads import threads_started
from ascendconv.io.files import COPY_CHUNK, copy_regular, create_new, created_mode, file_size, is_text, is_within, open_regular, read_json_object
from ascendconv.parts import PART_FORMAT, assign_parts
from ascendconv.ascendv1 import DESCRIPTION_NAME, PART_MANIFEST_NAME, PROVENANCE_NAME
from ascendconv.resume import differences, fingerprint


@dataclass
class Part:
    directory: Path
    manifest: dict

    @property
    def label(self) -> str:
        return f"part {self.manifest['part']}/{self.manifest['parts']} ({self.directory})"


@dataclass
class AssembleResult:
    output: Path
    parts: int
    shards: int
    linked: int  # shards hard-linked from their part; the others were copied
    bytes_written: int
    seconds: float

    def to_dict(self) -> dict:
        return {
            "output": str(self.output),
            "parts": self.parts,
            "shards": self.shards,
            "linked_shards": self.linked,
            "copied_shards": self.shards - self.linked,
            "bytes_out": self.bytes_written,
            "seconds": round(self.seconds, 3),
        }


def read_part(directory: Path) -> Part:
    directory = local_directory(directory, "assemble")  # a file, a dangling link, a mistyped name: each named
    path = directory / PART_MANIFEST_NAME
    manifest = read_json_object(path, PartError) if os.path.lexists(path) else None
    if manifest is None or manifest.get("format") != PART_FORMAT:
        raise PartError(f"{directory}: is not a part directory (no readable {PART_MANIFEST_NAME} of {PART_FORMAT})")
    identity = manifest.get("identity")
    if not isinstance(identity, dict) or fingerprint(identity) != manifest.get("fingerprint"):
        raise PartError(f"{directory / PART_MANIFEST_NAME}: its plan identity does not match its fingerprint (edited?)")
    if not _well_formed(manifest):
        raise PartError(f"{directory / PART_MANIFEST_NAME}: is malformed (fields missing, of the wrong type, or not plain file names)")
    return Part(directory, manifest)


def _plain_names(mapping) -> bool:
    """A dict of file name -> checksum, every name a plain file of the directory (no path, not hidden)."""
    return isinstance(mapping, dict) and all(
        isinstance(k, str) and isinstance(v, str) and k == Path(k).name and not k.startswith(".") and is_text(k)
        for k, v in mapping.items()
    )



def _well_formed(manifest: dict) -> bool:
    identity = manifest["identity"]
    planned = identity.get("plan", {}).get("shards") if isinstance(identity.get("plan"), dict) else None
    number, count = manifest.get("part"), manifest.get("parts")
    return (
        isinstance(number, int) and isinstance(count, int) and 1 <= number <= count
        and identity.get("parts") == count and isinstance(planned, list) and count <= len(planned)
        and isinstance(manifest.get("checksum"), str)
        and _plain_names(manifest.get("shards")) and _plain_names(manifest.get("files"))
        and _plain_names(manifest.get("reads")) and set(manifest["reads"]) == set(manifest["shards"])
        and isinstance(identity.get("provenance"), dict)
        and isinstance(planned, list)
        and all(isinstance(s, list) and len(s) == 2 and isinstance(s[0], str) and isinstance(s[1], int) for s in planned)
    )


def check_parts(parts: list[Part]) -> None:
    """One plan, each part once, each part's shards the ones the plan assigns to it."""
    first = parts[0]
    count = first.manifest["parts"]
    for part in parts[1:]:
        if part.manifest["fingerprint"] != first.manifest["fingerprint"]:
            raise ForeignPartError(
                f"{part.directory}: comes from another plan than {first.directory} "
                f"({'; '.join(differences(part.manifest['identity'], first.manifest['identity']))})"
            )
        if part.manifest["parts"] != count or part.manifest["files"] != first.manifest["files"]:
            raise ForeignPartError(f"{part.label}: does not belong with {first.label}")
    by_number: dict[int, Part] = {}
    for part in parts:
        number = part.manifest["part"]
        if number in by_number:
            raise DuplicatePartError(f"part {number}/{count} is given twice: {by_number[number].directory} and {part.directory}")
        by_number[number] = part
    missing = [str(n) for n in range(1, count + 1) if n not in by_number]
    if missing:
        raise MissingPartError(f"part {', '.join(missing)} of {count} missing (given: {', '.join(str(p.directory) for p in parts)})")
    planned = first.manifest["identity"]["plan"]["shards"]
    assignment = assign_parts([nbytes for _, nbytes in planned], count)
    for number, members in enumerate(assignment, start=1):
        part = by_number[number]
        if part.manifest["checksum"] != CHECKSUM:
            raise ForeignPartError(f"{part.label}: records {part.manifest['checksum']} checksums, this version {CHECKSUM}")
        expected = sorted(planned[i][0] for i in members)
        if sorted(part.manifest["shards"]) != expected:
            raise PartError(f"{part.label}: holds shards {sorted(part.manifest['shards'])}, the plan gives it {expected}")


def check_files(
    parts: list[Part], workers: int, progress: Progress | None, on_shard: Callable[[int, int], None] | None = None
) -> dict[Path, tuple[int, int]]:
    """Every shard and small file of every part still has the checksum its manifest records; a shard
    must be a regular file itself (a symlink would be linked into the package as a symlink). Returns
    the (device, inode) of each shard hashed, which the link made of it must be. `on_shard(checked,
    count)` is told as each shard is checked (a CI heartbeat)."""
    jobs = [(part, name, digest) for part in parts for name, digest in part.manifest["shards"].items()]
    total = sum(file_size(p.directory / n) for p, n, _ in jobs)
    done = 0
    identities: dict[Path, tuple[int, int]] = {}

    def digest_of(job) -> tuple[str | None, os.stat_result | None]:
        path = job[0].directory / job[1]
        if not os.path.lexists(path):
            return None, None
        try:
            return hashed_file(path, CHECKSUM, follow=False)
        except NotRegularFileError as exc:
            raise PartError(f"{exc.message} in {job[0].label}", "a part's shards are the regular files convert wrote") from None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        with threads_started(workers_option=False):  # map submits every job at once, starting the pool's threads
            digests = pool.map(digest_of, jobs)
        for checked, ((part, name, want), (got, status)) in enumerate(zip(jobs, digests), 1):
            if got != want:
                state = (
                    f"is not in {part.directory}, though {part.label}'s manifest lists it"
                    if got is None
                    else f"has {CHECKSUM} {got[:16]}..., not the {want[:16]}... recorded in {part.label}'s manifest"
                )
                raise ShardChecksumError(f"{part.directory / name}: {state}")
            identities[part.directory / name] = (status.st_dev, status.st_ino)
            done += status.st_size
            if progress:
                progress(done, total)
            if on_shard:
                on_shard(checked, len(jobs))
    for part in parts:
        for name, want in part.manifest["files"].items():
            path = part.directory / name
            if not os.path.lexists(path):
                raise ShardChecksumError(f"{path}: is not in {part.directory}, though {part.label}'s manifest lists it")
            # a directory or FIFO in its place: the part was changed since, like a file that differs
            if copy_regular(path, None, ShardChecksumError) != want:
                raise ShardChecksumError(f"{path}: differs from what {part.label}'s manifest records")
    return identities


def link_or_copy(source: Path, target: Path, identity: tuple[int, int], mode: int) -> bool:
    """Hard-link `source` as `target` (True), or copy it (False) when a link is impossible or could not
    have `mode`, the mode of every other file of the package; either way the file linked or copied
    must be the one checked (`identity`: its device and inode), not one put in its place since."""
    if _linked(source, target, identity, mode):
        return True
    fd, _ = open_regular(source, follow=False)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != identity:
            raise ShardChecksumError(f"{source}: was replaced after its checksum was checked")
        with os.fdopen(create_new(target), "wb") as out, os.fdopen(fd, "rb", closefd=False) as inp:
            shutil.copyfileobj(inp, out, COPY_CHUNK)
    finally:
        os.close(fd)
    return False


def _linked(source: Path, target: Path, identity: tuple[int, int], mode: int) -> bool:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
            raise
        return False
    st = os.lstat(target)
    if (st.st_dev, st.st_ino) != identity:
        raise ShardChecksumError(f"{source}: was replaced after its checksum was checked")
    if stat.S_IMODE(st.st_mode) == mode:
        return True
    # A link is the part's file itself, whose mode its job's umask gave it. Setting the package's mode
    # sets it on the part's shard too: our own output, which nothing reads by its mode (the part's
    # directory keeps its own). An inode with a third name (these parts assembled into another package
    # before) keeps the mode that package has, and this package gets a copy, as it does where the file
    # is not ours to change (a part another user wrote).
    if st.st_nlink == 2:
        try:
            os.chmod(target, mode)
            return True
        except PermissionError:
            pass
    os.unlink(target)
    return False


def assemble_into(staging: Path, parts: list[Part], identities: dict[Path, tuple[int, int]]) -> tuple[int, int]:
    """Write the package from checked parts into `staging`; return (bytes of shards, shards linked)."""
    digests: dict[str, str] = {}
    reads: dict[str, str] = {}
    linked = 0
    mode = created_mode()
    for part in parts:
        for name, digest in part.manifest["shards"].items():
            source = part.directory / name
            linked += link_or_copy(source, staging / name, identities[source], mode)
            digests[name] = digest
            reads[name] = part.manifest["reads"][name]
    for name, want in parts[0].manifest["files"].items():
        path = parts[0].directory / name
        if copy_regular(path, staging / name, PartError) != want:
            raise ShardChecksumError(f"{path}: changed after it was checked against {parts[0].label}'s manifest")
    base = parts[0].manifest["identity"]["provenance"]
    sizes = shard_sizes(staging, digests)
    provenance = provenance_document(base, digests, sizes, parts[0].manifest["files"], package_date(), reads)
    dump_json(staging / PROVENANCE_NAME, provenance)
    return sum((staging / name).stat().st_size for name in digests), linked


@dataclass
class CheckedParts:
    parts: list[Part]  # by part number
    identities: dict[Path, tuple[int, int]]  # each shard's (device, inode) as checked


def checked_parts(
    directories: list[Path],
    workers: int = 0,
    progress: Progress | None = None,
    on_shard: Callable[[int, int], None] | None = None,
) -> CheckedParts:
    if not directories:
        raise MissingPartError("no part directory given")
    parts = [read_part(Path(d)) for d in directories]
    check_parts(parts)
    identities = check_files(parts, workers or os.cpu_count() or 1, progress, on_shard)
    return CheckedParts(sorted(parts, key=lambda p: p.manifest["part"]), identities)


def space_to_assemble(out: Path, parts: list[Part]) -> int:
    """Bytes assembling adds at OUT at most: the shards it copies (those of parts on another file system
    than OUT, and those of another mode already linked elsewhere: see `link_or_copy`; the others are
    hard-linked and take no space), the small files, and a margin."""
    device = os.stat(existing_ancestor(out.parent)).st_dev
    mode = created_mode()

    def copied(path: Path) -> bool:
        st = os.stat(path)
        return st.st_dev != device or (stat.S_IMODE(st.st_mode) != mode and st.st_nlink > 1)

    copied_bytes = sum(
        file_size(part.directory / name) for part in parts for name in part.manifest["shards"]
        if copied(part.directory / name)
    )
    small = sum(file_size(parts[0].directory / name) for name in parts[0].manifest["files"])
    return space_needed([], copied_bytes, small)


def _nested(a: Path, b: Path) -> bool:
    return is_within(a, b) or is_within(b, a)


def assemble(
    out: str | os.PathLike,
    directories: list[str | os.PathLike],
    overwrite: bool = False,
    workers: int = 0,
    progress: Progress | None = None,
    on_shard: Callable[[int, int], None] | None = None,
) -> AssembleResult:
    started = time.perf_counter()
    out = Path(out)
    package_date()  # a malformed SOURCE_DATE_EPOCH is refused before the parts are read
    with interruptible(out):
        parts_given = [Path(d).expanduser() for d in directories]  # each part's directory, as read_part finds it

        def check() -> None:
            # a part that is OUT, holds it or lies in it first: its refusal is the one that applies, where
            # another part's check would stop at "exists and is not empty" and suggest --overwrite
            real_out = Path(os.path.realpath(out))
            for directory in sorted(parts_given, key=lambda d: not _nested(real_out, Path(os.path.realpath(d)))):
                check_output(out, directory, overwrite, DESCRIPTION_NAME, "part")

        check_output_early(out, check)  # before a part is read (let alone its shards hashed), as convert's
        checked = checked_parts([Path(d) for d in directories], workers, progress, on_shard)
        parts = checked.parts
        check_free_space(out, space_to_assemble(out, parts))
        with output_errors(out, shard_size_option=False), StagedOutput(out, check) as staged:
            bytes_written, linked = assemble_into(staged.staging, parts, checked.identities)
            staged.publish()
    shards = sum(len(p.manifest["shards"]) for p in parts)
    return AssembleResult(out, len(parts), shards, linked, bytes_written, time.perf_counter() - started)
