"""Resume: the identity of a plan, and the ledger of finished shards kept in staging.

A run with --resume records, in a small JSON file inside its staging directory, the plan's identity
(source files, every option that changes a byte of the package, the tool version) and the checksum
of each shard, with its file's status and the digest of the source bytes it was made from, as soon
as that shard is closed. A later run of the same
identity adopts the staging and converts only the shards not recorded there or whose bytes no longer
match their checksum; a kept shard whose size, inode, mtime and ctime are still the recorded ones is
trusted without being read again, the others are re-hashed. Work of another identity is refused,
never mixed. The identity is also what makes parts of one plan
recognisable to `assemble`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Callable

from ascendconv.errors import AscendconvError, ResumeLedgerError, ResumeMismatchError, UnsafeOutputError, clip, shown
from ascendconv.io.checksum import CHECKSUM, file_digest
from ascendconv.io.files import read_json_object, write_new
from ascendconv.io.threads import threads_started
from ascendconv.plan import Plan

LEDGER_NAME = ".ascendconv-resume.json"  # hidden: a source file of that name is never copied
# Options that change no byte of the package: they are left out of the identity.
RUN_ONLY_OPTIONS = ("workers", "overwrite", "resume", "part", "allow_unmatched_overrides")


def canonical_json(value) -> bytes:
    # surrogatepass: a manifest is anyone's JSON, and "\ud800" in it must give a fingerprint, not a crash
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _plain(value):
    """An option value as JSON: dataclasses (overrides) as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def option_values(options) -> dict:
    """Every field of ConvertOptions that can change the package's bytes (new options included)."""
    return {f.name: _plain(getattr(options, f.name)) for f in dataclasses.fields(options) if f.name not in RUN_ONLY_OPTIONS}


def plan_identity(provenance: dict, plan: Plan, options, copied_files: dict[str, str]) -> dict:
    """What the package's bytes depend on. `provenance` is the package's provenance without shard
    checksums (tool, version, source files with sizes and header fingerprints, scheme, rule, ...);
    `copied_files` maps each copied source file to the sha256 of its content."""
    return {
        "provenance": provenance,
        "options": option_values(options),
        # the split is part of a part's identity: a manifest's part count cannot be edited unseen
        "parts": options.part[1] if options.part else None,
        "copied_files": copied_files,
        "plan": {
            "shards": [[shard.file, shard.nbytes] for shard in plan.shards],
            "description": sha256_hex(canonical_json(plan.description())),
            "index": sha256_hex(canonical_json(plan.index())),
        },
    }


def fingerprint(identity: dict) -> str:
    return sha256_hex(canonical_json(identity))


def _flatten(value, prefix: str, into: dict) -> dict:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else key, into)
    elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        for item in value:  # source files: by name, not by position
            _flatten({k: v for k, v in item.items() if k != "name"}, f"{prefix}[{item['name']}]", into)
    else:
        into[prefix] = value
    return into


def differences(ours: dict, theirs: dict, limit: int = 4) -> list[str]:
    """What differs between two identities, in words: 'options.scheme: 'a' now, 'b' there'."""
    a, b = _flatten(ours, "", {}), _flatten(theirs, "", {})
    keys = list(dict.fromkeys([*a, *b]))
    changed = [k for k in keys if a.get(k, "(absent)") != b.get(k, "(absent)")]
    # keys and values come from a file anyone can write: each is clipped, not the whole message
    said = [f"{clip(k)}: {shown(a.get(k, '(absent)'))} now, {shown(b.get(k, '(absent)'))} there" for k in changed[:limit]]
    if len(changed) > limit:
        said.append(f"and {len(changed) - limit} more")
    return said


def read_ledger(staging: Path) -> dict | None:
    """The ledger of a kept staging directory, or None if it has none. It is read like any file
    someone else may have put there: never through a symlink, never a FIFO or a device, bounded in
    size and depth; anything else is ResumeLedgerError, named."""
    path = staging / LEDGER_NAME
    if not os.path.lexists(path):
        return None
    return read_json_object(path, ResumeLedgerError, follow=False)


def write_json_atomic(path: Path, value: dict) -> None:
    """Replace `path` with `value` as JSON, whole. The temporary file is created anew (O_EXCL,
    O_NOFOLLOW): a symlink planted under its name is removed, never written through."""
    temporary = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)  # unlink never follows a link: a planted one goes, its target stays
    write_new(temporary, (json.dumps(value, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    os.replace(temporary, path)


# What the ledger keeps of a closed shard, besides its checksum: a kept shard whose status still
# has these values is the file the run closed, untouched since (git's index trusts files the same
# way); ctime changes with any write, rename or chmod, and no user can set it back.
STATUS_FIELDS = ("st_size", "st_ino", "st_dev", "st_mtime_ns", "st_ctime_ns")


def shard_status(st: os.stat_result) -> list[int]:
    return [getattr(st, name) for name in STATUS_FIELDS]


class Ledger:
    """The finished shards of one staging directory, saved each time a shard is closed: for each,
    its checksum and the status of its file when closed (`STATUS_FIELDS`)."""

    def __init__(self, staging: Path, identity: dict, shards: dict[str, dict]):
        self.path = staging / LEDGER_NAME
        self.staging = staging
        self.identity = identity
        self.shards = dict(shards)
        self._lock = threading.Lock()
        self._save()

    def record(self, name: str, digest: str, reads: str) -> None:
        status = shard_status(os.lstat(self.staging / name))
        with self._lock:
            self.shards[name] = {"digest": digest, "status": status, "reads": reads}
            self._save()

    def forget(self, name: str) -> None:
        with self._lock:
            self.shards.pop(name, None)
            self._save()

    def _save(self) -> None:
        write_json_atomic(self.path, {"identity": self.identity, "checksum": CHECKSUM, "shards": self.shards})


def adopter(identity: dict, out: Path, overwrite: bool) -> Callable[[Path], bool]:
    """StagedOutput's `resume`: adopt a kept staging of the same identity; refuse one of another
    identity unless `overwrite` (then it is removed like any stale staging)."""
    ours = fingerprint(identity)

    def adopt(staging: Path) -> bool:
        owner = os.lstat(staging).st_uid
        if owner != os.geteuid():
            raise UnsafeOutputError(
                f"{staging}: kept work for {out} that belongs to user {owner}, not to this run's user: a run "
                "adopts only work its own user wrote",
                f"remove {staging} (as its owner), or choose another OUT",
            )
        try:
            ledger = read_ledger(staging)
        except ResumeLedgerError:
            if overwrite:
                return False
            raise
        if ledger is None or not isinstance(ledger.get("identity"), dict):
            return False  # not a resumable staging (a plain run killed with SIGKILL): removed
        if fingerprint(ledger["identity"]) == ours:
            return True
        if overwrite:
            return False
        raise ResumeMismatchError(
            f"{staging}: holds unfinished work for {out} from another plan, which this run will not mix with "
            f"its own ({'; '.join(differences(identity, ledger['identity']))})"
        )

    return adopt


def _entry(value) -> dict | None:
    """A ledger entry {"digest": hex, "status": [...], "reads": hex} as written, or None (a shard
    without the digest of the source bytes it was made from is converted again)."""
    if not isinstance(value, dict) or not isinstance(value.get("digest"), str) or not isinstance(value.get("reads"), str):
        return None
    status = value.get("status")
    well_formed = isinstance(status, list) and len(status) == len(STATUS_FIELDS) and all(type(v) is int for v in status)
    return {"digest": value["digest"], "status": status if well_formed else None, "reads": value["reads"]}


def _kept_regular(path: Path) -> os.stat_result | None:
    """The status of a kept shard that is a regular file with one link (never a symlink, which
    would be published as one, nor a hard link whose other name someone else may write), or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else None


def recorded_shards(staging: Path, wanted: list[str]) -> dict[str, dict]:
    """The shards of an adopted staging that this run wants and that the ledger records as finished
    (name -> ledger entry), not yet re-read. Every other file in the staging (a shard cut short, a
    shard this run does not want, a symlink or hard link, the files written at the end) is removed."""
    ledger = read_ledger(staging) or {}
    recorded = ledger.get("shards") if ledger.get("checksum") == CHECKSUM else None
    recorded = recorded if isinstance(recorded, dict) else {}
    kept = {}
    for name in wanted:
        entry = _entry(recorded.get(name))
        if entry is not None and _kept_regular(staging / name) is not None:
            kept[name] = entry
    for path in staging.iterdir():
        if path.name in kept or path.name == LEDGER_NAME:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return kept


def unchanged_shards(staging: Path, recorded: dict[str, dict]) -> dict[str, str]:
    """The recorded shards whose file still has the status the ledger recorded when it was closed
    (name -> checksum): trusted without being read again."""
    trusted = {}
    for name, entry in recorded.items():
        st = _kept_regular(staging / name)
        if st is not None and entry["status"] is not None and shard_status(st) == entry["status"]:
            trusted[name] = entry["digest"]
    return trusted


def verify_in_background(staging: Path, recorded: dict[str, str]) -> Callable[[], dict[str, str]]:
    """Start re-reading the recorded shards (name -> checksum) in a thread (it overlaps the
    conversion of the others); the returned call waits for it and gives the shards whose bytes
    still have their checksum."""
    matching: dict[str, str] = {}

    def run() -> None:
        for name, digest in recorded.items():
            try:
                if file_digest(staging / name, CHECKSUM, follow=False) == digest:
                    matching[name] = digest
            except (OSError, AscendconvError):
                pass  # gone, unreadable or no longer a regular file: converted again

    # a daemon: an interrupted run must not wait for the re-reading to end before it exits
    thread = threading.Thread(target=run, daemon=True)
    with threads_started():
        thread.start()

    def result() -> dict[str, str]:
        thread.join()
        return dict(matching)

    return result
