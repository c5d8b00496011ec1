"""Reading files that anyone may have written: regular files only, sizes checked, JSON bounded.

A FIFO, a device (a symlink to /dev/zero) or a socket where a shard or a JSON file should be would
block a reader or feed it without end; each is refused with a named error before a byte is read.
JSON files are read whole, so their size is capped, and JSON that parses but is hostile (integers
of thousands of digits, nesting thousands deep) ends in a named error instead of a traceback.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ascendconv.errors import AscendconvError, NotRegularFileError, clip

MAX_JSON_BYTES = 64 * 2**20  # config, index, description, provenance: a few MB at the largest
# Real configs nest a few levels; the bound keeps every later walk of the value (repr, json.dumps,
# rendering) far from Python's recursion limit, whatever the interpreter version's parser allows.
MAX_JSON_DEPTH = 64

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def require_regular(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{path}: is {_kind(st.st_mode)}, not a regular file")


def is_regular(path: Path) -> bool:
    """A regular file (symlinks followed); False for anything else, missing or unreadable."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def file_size(path: Path) -> int:
    """Size of a regular file; 0 for anything else (a FIFO, a device, a dangling symlink)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def open_regular(path: Path) -> tuple[int, int]:
    """(descriptor, size) of `path` opened read-only, after checking that it is a regular file.

    O_NONBLOCK makes the open itself return at once should the path be (or become, between the
    check and the open) a FIFO; the check is repeated on the open descriptor.
    """
    require_regular(path, os.stat(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        require_regular(path, st)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_json(path: Path, error: type[AscendconvError], max_bytes: int = MAX_JSON_BYTES) -> object:
    """The parsed JSON of a regular file of at most `max_bytes`; `error` (a named project error
    class) for anything that cannot be read or parsed."""
    try:
        fd, size = open_regular(path)
        try:
            if size > max_bytes:
                raise error(
                    f"{path}: {size} bytes, more than the {max_bytes // 2**20} MiB a JSON file of a "
                    "checkpoint or package may hold"
                )
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(max_bytes + 1)
        finally:
            os.close(fd)
    except NotRegularFileError as exc:
        raise error(exc.message, exc.hint) from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from exc
    if len(data) > max_bytes:  # grew since it was checked
        raise error(f"{path}: more than {max_bytes // 2**20} MiB")
    value = parse_json_bytes(data, str(path), error)
    if json_depth(value) > MAX_JSON_DEPTH:
        raise error(f"{path}: JSON nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def parse_json_bytes(data: bytes, what: str, error: type[AscendconvError]) -> object:
    """JSON text -> object, or `error` naming `what` (a path, or a path and which part of it).
    (A shard header is not walked for depth: its validation reads only fixed-depth fields.)"""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not valid JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise error(f"{what} is not valid JSON: nested too deeply to read") from None
    except ValueError as exc:  # JSONDecodeError, and integers beyond Python's digit limit
        raise error(f"{what} is not valid JSON ({clip(str(exc))})") from None


def json_depth(value: object) -> int:
    """How deep lists and objects nest in a parsed JSON value (0 for a scalar), without recursion."""
    if not isinstance(value, (dict, list)):
        return 0
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:  # deep enough to refuse: no need to walk the rest
            return depth
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return deepest


def read_json_object(path: Path, error: type[AscendconvError]) -> dict:
    data = read_json(path, error)
    if not isinstance(data, dict):
        raise error(f"{path}: a JSON {type(data).__name__}, not an object")
    return data
