"""Resolve a Hugging Face repo id to its snapshot in the local cache, without any download."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

from ascendconv.errors import NotCachedError, NotFoundError, UnrecognizedCheckpointError, clip
from ascendconv.io.files import read_regular_bytes
from ascendconv.io.output import existing_ancestor

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
# A revision is a branch or tag (which may hold '/') or a commit; never a path that climbs out.
REVISION = re.compile(r"^(?!.*(^|/)\.\.?(/|$))[\w.-]+(/[\w.-]+)*$")
COMMIT = re.compile(r"^(?!\.\.?$)[\w.-]+$")  # one path component: what a refs/ file names
# An owner or a repository name as the Hub spells them (ASCII letters, digits, '_', '.', '-'): a cache
# directory's name is text from disk, and the repo id it gives goes into the card's YAML front matter.
HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
MAX_REF_BYTES = 4096  # a commit hash and a newline; a ref file of more is not one


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps models: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _too_long(path: Path) -> str | None:
    """Why `path` cannot exist when its name, or the whole path, is longer than the file system
    allows (stat() then fails with ENAMETOOLONG rather than ENOENT), else None."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            return None
    else:
        return None
    longest = max(path.parts, key=lambda part: len(os.fsencode(part)), default="")
    name_max = 255
    with contextlib.suppress(OSError, ValueError):
        name_max = os.pathconf(existing_ancestor(path), "PC_NAME_MAX")
    if len(os.fsencode(longest)) > name_max:
        return f"a name of {len(os.fsencode(longest))} bytes; this file system allows {name_max}"
    return f"a path of {len(os.fsencode(os.path.abspath(path)))} bytes, longer than the system allows"


def _nearby(path: Path) -> str:
    """A hint naming the directory beside `path` whose name is closest to its name."""
    import difflib

    too_long = _too_long(path)
    if too_long:
        return f"{too_long}: no such directory can exist; check the path"
    if os.path.islink(path):  # dangling, or a loop: "no directory of that name" would be untrue
        with contextlib.suppress(OSError):
            return f"{path} is a symbolic link to {os.readlink(path)}, which leads to no directory; fix the link"
    if not os.path.isdir(path.parent):
        return f"{path.parent} is no directory either; pass a checkpoint directory or a cached repo id"
    try:
        names = sorted(p.name for p in path.parent.iterdir() if p.is_dir())
    except OSError:
        names = []
    close = difflib.get_close_matches(path.name, names, n=1)
    if close:
        return f"did you mean {path.parent / close[0]}?"
    return f"{path.parent} holds no directory of that name; pass a checkpoint directory or a cached repo id"


def local_directory(text: str | os.PathLike, command: str) -> Path:
    """A directory given on the command line: a file is refused naming `command`, a missing path
    with the closest directory beside it (the one every command's mistyped path gets)."""
    path = Path(text).expanduser()
    if os.path.isdir(path):  # not Path.is_dir: it raises for a name too long to exist
        return path
    if os.path.exists(path) or (os.path.lexists(path) and not os.path.islink(path)):  # a dangling link: not found
        what = "is a file" if path.is_file() else "is not a directory"
        raise UnrecognizedCheckpointError(f"{text}: {what}; {command} takes a directory", f"did you mean {path.parent}?")
    raise NotFoundError(f"{text}: no such directory", _nearby(path))


def resolve_source(text: str) -> Path:
    """A local directory as it is; otherwise `org/name[@revision]` looked up in the HF cache."""
    path = Path(text).expanduser()
    if os.path.exists(path):  # not Path.exists: it raises for a name too long to exist
        return path
    if not REPO_ID.match(text) or text.startswith((".", "/", "~")):
        raise NotFoundError(f"{text}: no such directory", _nearby(path))
    repo, _, revision = text.partition("@")
    if revision and not REVISION.match(revision):
        raise NotFoundError(f"{text}: {revision!r} is not a revision name", "name a branch, a tag or a commit hash")
    cache = hub_cache_dir()
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    if not os.path.isdir(snapshots):
        if os.path.isdir(path.parent):  # a local path mistyped, most likely
            raise NotFoundError(f"{text}: no such directory (nor a repo id in the Hugging Face cache)", _nearby(path))
        raise NotCachedError(f"{text}: not a local directory and not in the Hugging Face cache at {cache}")
    revision = revision or "main"
    ref = repo_dir / "refs" / revision
    has_ref = os.path.lexists(ref)
    # a refs/ file holds a commit hash: read at most a few bytes of it, never a FIFO or a device
    try:
        commit = read_regular_bytes(ref, MAX_REF_BYTES, NotCachedError).decode(errors="replace").strip() if has_ref else revision
    except NotCachedError as exc:  # a directory, a FIFO, a dangling link: a download would not replace it
        raise NotCachedError(f"{text}: {exc.message}", f"the cache is damaged: remove {ref}, then download again") from None
    if has_ref and not COMMIT.match(commit):
        raise NotCachedError(f"{text}: {ref} does not hold a commit hash", "the cache is damaged; download again")
    snapshot = snapshots / commit
    # a snapshot links its files into the cache's blobs, but is itself a directory of the cache
    if os.path.islink(snapshot) or Path(os.path.realpath(snapshot)).parent != Path(os.path.realpath(snapshots)):
        raise NotCachedError(f"{text}: {snapshot} is not a snapshot directory of the cache")
    if not os.path.isdir(snapshot):
        available = sorted(p.name for p in snapshots.iterdir())
        raise NotCachedError(
            f"{text}: revision {revision!r} is not in the cache at {repo_dir}"
            + (f": {ref} names {clip(commit)}, which has no snapshot" if has_ref else "")  # a download cut short
            + (f" (cached: {', '.join(available)})" if available else "")
        )
    return snapshot


def cached_repo(path: Path) -> tuple[str, str] | None:
    """(repo id, commit) when `path` is a snapshot of the Hugging Face cache
    (`.../models--org--name/snapshots/<commit>`) whose names are the Hub's, else None. The real path
    is judged: a snapshot given as `.` or through a symbolic link to it is the same snapshot."""
    path = Path(os.path.realpath(path))
    repo_dir = path.parent.parent
    commit = path.name
    if path.parent.name != "snapshots" or not repo_dir.name.startswith("models--") or not (
            commit.isascii() and COMMIT.fullmatch(commit)):
        return None
    org, sep, name = repo_dir.name.removeprefix("models--").partition("--")
    # a name the Hub could not have (a line break, ': ', '#', ...) makes no repo id: the directory is
    # then a local one, as any other
    return (f"{org}/{name}", commit) if sep and HUB_NAME.fullmatch(org) and HUB_NAME.fullmatch(name) else None
