"""Reading files that anyone may have written: regular files only, sizes checked, JSON bounded.

A FIFO, a device (a symlink to /dev/zero) or a socket where a shard or a JSON file should be would
block a reader or feed it without end; each is refused with a named error before a byte is read.
JSON files are read whole, so their size is capped, and JSON that parses but is hostile (integers
of thousands of digits, nesting thousands deep) ends in a named error instead of a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import Iterator

from ascendconv.errors import AscendconvError, NotRegularFileError, SourceChangedError, clip

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
    (stat.S_ISLNK, "a symbolic link"),  # seen only where links are not followed
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def is_text(name: str) -> bool:
    """Whether a string read from JSON is text: a lone surrogate (the escape \\ud800) is not, and no
    file name, header or message can encode it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_within(path: Path, root: Path) -> bool:
    """Whether `path` is `root` or lies below it (both already resolved)."""
    return path == root or root in path.parents


def require_regular(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{path}: is {_kind(st.st_mode)}, not a regular file")


def is_regular(path: Path) -> bool:
    """A regular file (symlinks followed); False for anything else, missing or unreadable."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def irregular_kind(path: Path) -> str | None:
    """What is at `path` when it is there but no regular file ('a FIFO', 'a directory', 'a symbolic link
    to nothing'); None for a regular file (symlinks followed) or nothing at all."""
    try:
        mode = os.stat(path).st_mode
        return None if stat.S_ISREG(mode) else _kind(mode)
    except (OSError, ValueError):
        return "a symbolic link to nothing" if os.path.islink(path) else None


def identity(path: Path, follow: bool = True) -> tuple[int, int] | None:
    """(device, inode) of what `path` names now, or None where there is nothing to stat: the same
    answer before and after a reading says that it read one file or directory throughout."""
    try:
        st = os.stat(path, follow_symlinks=follow)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def file_size(path: Path) -> int:
    """Size of a regular file; 0 for anything else (a FIFO, a device, a dangling symlink)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def open_regular(path: Path, follow: bool = True) -> tuple[int, int]:
    """(descriptor, size) of `path` opened read-only, after checking that it is a regular file.

    O_NONBLOCK makes the open itself return at once should the path be (or become, between the
    check and the open) a FIFO; the check is repeated on the open descriptor. With `follow=False`
    a symbolic link is refused too (a file of ours that someone else may have replaced).
    """
    require_regular(path, os.stat(path) if follow else os.lstat(path))
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRegularFileError(f"{path}: is a symbolic link, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        require_regular(path, st)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_regular_bytes(path: Path, max_bytes: int, error: type[AscendconvError], follow: bool = True) -> bytes:
    """The whole content of a regular file of at most `max_bytes` (a FIFO, a device or a larger file
    is `error`, named, before a byte is read)."""
    try:
        fd, size = open_regular(path, follow)
        try:
            if size > max_bytes:
                raise error(f"{path}: {size} bytes, more than the {_bytes(max_bytes)} such a file may hold")
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(max_bytes + 1)
        finally:
            os.close(fd)
    except NotRegularFileError as exc:
        raise error(exc.message, None if error.default_hint else exc.hint) from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from exc
    if len(data) > max_bytes:  # grew since it was checked
        raise error(f"{path}: more than the {_bytes(max_bytes)} such a file may hold")
    return data


def _bytes(count: int) -> str:
    return f"{count // 2**20} MiB" if count >= 2**20 else f"{count} bytes"


# The mode (less the umask) of every file a package holds, whichever code writes it (the shard writer,
# a JSON file, a copied file, assemble's copy of a part's shard): one package, one `ls -l`.
FILE_MODE = 0o644


def created_mode() -> int:
    """The mode `create_new` gives a file: FILE_MODE less this process's umask, which Linux reports in
    /proc. Elsewhere the umask is read by setting it and back, the one portable way (a file another
    thread creates in between would get 0o077's mode)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return FILE_MODE & ~int(line.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return FILE_MODE & ~mask


def create_new(path: Path) -> int:
    """A descriptor of a file created for writing at `path`, which must not exist yet: O_EXCL never
    opens what is there (a symlink planted under the name included), so nothing else is written."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), FILE_MODE)


def write_new(path: Path, data: bytes) -> None:
    """Write `data` as the new file `path` (see `create_new`)."""
    fd = create_new(path)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


COPY_CHUNK = 4 * 2**20
MAX_COPIED_BYTES = 2**30  # a file carried into a package: configs, tokenizer, code, docs


def copy_regular(source: Path, target: Path | None, error: type[AscendconvError], follow: bool = True) -> str:
    """The sha256 of the regular file `source` (at most MAX_COPIED_BYTES), hashed as it is read, and
    those very bytes copied to the new file `target` unless it is None: the digest is of what was
    written, whatever happens to `source` meanwhile."""
    import hashlib

    hasher = hashlib.sha256()
    try:
        fd, size = open_regular(source, follow)
    except NotRegularFileError as exc:
        raise error(exc.message, None if error.default_hint else exc.hint) from None
    except OSError as exc:
        raise error(f"{source}: cannot read ({exc.strerror})") from exc
    try:
        if size > MAX_COPIED_BYTES:
            raise error(f"{source}: {size} bytes, more than the {_bytes(MAX_COPIED_BYTES)} a copied file may hold")
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(os.fdopen(create_new(target), "wb")) if target is not None else None
            copied = 0
            while chunk := os.read(fd, COPY_CHUNK):
                copied += len(chunk)
                if copied > MAX_COPIED_BYTES:
                    raise error(f"{source}: grew past {_bytes(MAX_COPIED_BYTES)} while it was read")
                hasher.update(chunk)
                if out is not None:
                    out.write(chunk)
    finally:
        os.close(fd)
    return hasher.hexdigest()


def read_json(
    path: Path, error: type[AscendconvError], max_bytes: int = MAX_JSON_BYTES, *, follow: bool = True
) -> object:
    """The parsed JSON of a regular file of at most `max_bytes`; `error` (a named project error
    class) for anything that cannot be read or parsed (`follow`: see `open_regular`)."""
    data = read_regular_bytes(path, max_bytes, error, follow)
    value = parse_json_bytes(data, str(path), error)
    # nesting never exceeds the brackets that open it: a walk only past the limit (an index maps a
    # hundred thousand tensors in one level)
    if more_brackets_than(data, MAX_JSON_DEPTH) and json_depth(value) > MAX_JSON_DEPTH:
        raise error(f"{path}: JSON nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def more_brackets_than(data: bytes, limit: int) -> bool:
    """Whether `data` holds more than `limit` of '{' and '[' together: at most limit + 1 searches,
    each at memchr speed (bytes.count of one byte is ten times slower: 22 ms of a 20 MB index)."""
    found = 0
    for bracket in (b"{", b"["):
        at = data.find(bracket)
        while at >= 0:
            found += 1
            if found > limit:
                return True
            at = data.find(bracket, at + 1)
    return False


def parse_json_bytes(data: bytes, what: str, error: type[AscendconvError]) -> object:
    """JSON text -> object, or `error` naming `what` (a path, or a path and which part of it).
    (A shard header is not walked for depth: its validation reads only fixed-depth fields.)"""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not valid JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise error(f"{what} is not valid JSON: nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON ({clip(str(exc))})") from None
    except ValueError:  # the one other: an integer of more digits than int() converts (Python 3.11+)
        raise error(
            f"{what} holds an integer of more than {_int_digits():,} digits, longer than any value such a file holds: "
            "it is damaged or was edited",
            None if error.default_hint else "replace it with an intact copy (download it again)",
        ) from None


def _int_digits() -> int:
    """The most digits int() converts (sys.get_int_max_str_digits, Python 3.11+ and late 3.10)."""
    return getattr(sys, "get_int_max_str_digits", lambda: 4300)()


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


def read_json_object(path: Path, error: type[AscendconvError], follow: bool = True) -> dict:
    data = read_json(path, error, follow=follow)
    if not isinstance(data, dict):
        raise error(f"{path}: a JSON {type(data).__name__}, not an object")
    return data


# --- mapped reads that a writer cannot pull from under us ---------------------------------------

MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14+


def populate(mapped: mmap.mmap, start: int, count: int) -> bool:
    """Fault in `count` mapped bytes from `start` at once (MADV_POPULATE_READ) rather than page by
    page. False when some of them lie past the file's end (it was cut short: touching them would
    raise SIGBUS); True otherwise, also where the advice is unknown (older kernels, EINVAL; other
    systems): the pages then fault in on first touch."""
    if not hasattr(mapped, "madvise"):  # Windows
        return True
    try:
        mapped.madvise(MADV_POPULATE_READ, start, count)
    except OSError as exc:
        if exc.errno == errno.EFAULT:
            return False
    return True


_F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)
_F_GETLEASE = getattr(fcntl, "F_GETLEASE", 1025)
_leased: dict[int, Path] | None = None  # fd -> file, while a guard is active
_leased_lock = threading.Lock()


def lease(fd: int, path: Path) -> None:
    """Under `mapped_reads_guarded`, take a read lease on a file about to be mapped."""
    with _leased_lock:
        if _leased is None:
            return
        try:
            fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_RDLCK)
        except OSError:  # EAGAIN: open for writing elsewhere; EACCES: not ours; EINVAL: no leases here
            return
        _leased[fd] = path


def unlease(fd: int) -> None:
    """Before closing a leased descriptor: a mapping keeps the open file, and so its lease, alive
    after the descriptor is closed, so the lease is released here, explicitly."""
    with _leased_lock:
        if _leased is not None and _leased.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_UNLCK)


def _lease_breaking(fd: int) -> bool:
    """A read lease being broken reads back as F_UNLCK, the type it is being broken to."""
    try:
        return fcntl.fcntl(fd, _F_GETLEASE) == fcntl.F_UNLCK
    except OSError:
        return False


@contextlib.contextmanager
def mapped_reads_guarded() -> Iterator[None]:
    """While inside, a file mapped for reading cannot be cut short under us unnoticed.

    Touching a mapped page past a file's new end raises SIGBUS, which kills the process without a
    word. So each file opened for mapped reads (`lease`) carries a read lease: the kernel holds back
    another process's open-for-writing or truncate of it and tells us with SIGIO, whose handler
    raises SourceChangedError naming the file; the run stops, its mappings go, and only when the
    leases are released does the writer proceed. Where a lease cannot be had (the file is already
    open for writing, a network filesystem, a thread other than the main one, which alone handles
    signals) reads go unguarded, as before.
    """
    global _leased
    if threading.current_thread() is not threading.main_thread() or _leased is not None:
        yield
        return

    def changed(signum, frame) -> None:
        with _leased_lock:
            breaking = [path for fd, path in (_leased or {}).items() if _lease_breaking(fd)]
        raise SourceChangedError(
            f"{breaking[0] if breaking else 'a file being read'}: another process opened it for writing or "
            "truncated it while it was being read"
        )

    previous = signal.signal(signal.SIGIO, changed)
    _leased = {}
    try:
        yield
    finally:
        with _leased_lock:
            for fd in _leased:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_UNLCK)
            _leased = None
        signal.signal(signal.SIGIO, previous)
