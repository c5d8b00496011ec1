"""Resume: the identity of a plan, and the ledger of finished shards kept in staging.

A run with --resume records, in a small JSON file inside its staging directory, the plan's identity
(source files, every option that changes a byte of the package, the tool version) and the checksum
of each shard as soon as that shard is closed. A later run of the same identity adopts the staging
and converts only the shards not recorded there or whose bytes no longer match their checksum. Work
of another identity is refused, never mixed. The identity is also what makes parts of one plan
recognisable to `assemble`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Callable

from ascendconv.errors import AscendconvError, ResumeMismatchError
from ascendconv.io.checksum import CHECKSUM, file_digest
from ascendconv.plan import Plan

LEDGER_NAME = ".ascendconv-resume.json"  # hidden: a source file of that name is never copied
# Options that change no byte of the package: they are left out of the identity.
RUN_ONLY_OPTIONS = ("workers", "overwrite", "resume", "part")


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


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
    shown = [f"{k}: {a.get(k, '(absent)')!r} now, {b.get(k, '(absent)')!r} there" for k in changed[:limit]]
    if len(changed) > limit:
        shown.append(f"and {len(changed) - limit} more")
    return shown


def read_json(path: Path) -> dict | None:
    """A small JSON object written by ascendconv, or None if it is absent or not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json_atomic(path: Path, value: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)


class Ledger:
    """The finished shards of one staging directory, saved each time a shard is closed."""

    def __init__(self, staging: Path, identity: dict, shards: dict[str, str]):
        self.path = staging / LEDGER_NAME
        self.identity = identity
        self.shards = dict(shards)
        self._lock = threading.Lock()
        self._save()

    def record(self, name: str, digest: str) -> None:
        with self._lock:
            self.shards[name] = digest
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
        ledger = read_json(staging / LEDGER_NAME)
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


def recorded_shards(staging: Path, wanted: list[str]) -> dict[str, str]:
    """The shards of an adopted staging that this run wants and that the ledger records as finished
    (name -> checksum), not yet re-read. Every other file in the staging (a shard cut short, a shard
    this run does not want, the files written at the end) is removed."""
    ledger = read_json(staging / LEDGER_NAME) or {}
    recorded = ledger.get("shards") if ledger.get("checksum") == CHECKSUM else None
    recorded = recorded if isinstance(recorded, dict) else {}
    kept = {name: recorded[name] for name in wanted if isinstance(recorded.get(name), str) and (staging / name).is_file()}
    for path in staging.iterdir():
        if path.name in kept or path.name == LEDGER_NAME:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return kept


def verify_in_background(staging: Path, recorded: dict[str, str]) -> Callable[[], dict[str, str]]:
    """Start re-reading the recorded shards in a thread (it overlaps the conversion of the others);
    the returned call waits for it and gives the shards whose bytes still have their checksum."""
    matching: dict[str, str] = {}

    def run() -> None:
        for name, digest in recorded.items():
            try:
                if file_digest(staging / name, CHECKSUM) == digest:
                    matching[name] = digest
            except (OSError, AscendconvError):
                pass  # gone, unreadable or no longer a regular file: converted again

    # a daemon: an interrupted run must not wait for the re-reading to end before it exits
    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result() -> dict[str, str]:
        thread.join()
        return dict(matching)

    return result
