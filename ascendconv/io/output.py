"""Where a package may be written, whether it fits, and what a failed write is called.

`check_output_path` (before the source is read) and `check_free_space` run before anything is
written, so an unusable OUT (`.`/`..`, a name the file system cannot hold, a read-only or unwritable
parent, an OUT or parent that no package can be renamed into, too little space) is a named error and
not a traceback halfway through; what would lose data (the source, a symbolic
link, a mount point, a non-package under --overwrite) is `outdir.check_output`'s.
`output_errors` turns the OSError of a write that fails anyway (the disk filled meanwhile, a
file-size limit, an I/O error) into a named error, in one place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import struct
from pathlib import Path
from typing import Iterator

from ascendconv.errors import (
    OPEN_FILES_EXHAUSTED,
    NoSpaceError,
    OutputPathError,
    OutputWriteError,
    TooManyOpenFilesError,
    shown,
    too_many_open_files,
)

# Bytes the staging and lock names add to OUT's name ('.NAME.ascendconv-partial-<unique>').
NAME_DECORATION_BYTES = 64
# Bytes per tensor a shard header may take besides the tensor's name: its dtype, shape and offsets.
HEADER_BYTES_PER_TENSOR = 128
SPACE_MARGIN_BYTES = 16 * 2**20  # file system metadata, the JSON files, rounding


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def _lexists(path: Path) -> bool:
    try:
        os.lstat(path)
    except OSError:  # missing, or a name too long to exist
        return False
    return True


def existing_ancestor(path: Path) -> Path:
    """The nearest directory at or above `path` that exists (where new directories would go)."""
    path = Path(os.path.abspath(path))
    while not _lexists(path) and path != path.parent:
        path = path.parent
    return path


# linux/fs.h: FS_IOC_GETFLAGS, _IOR('f', 1, long) as x86 and Arm number it (elsewhere the ioctl fails,
# and nothing is known), and the two attributes that keep a directory from being removed or replaced.
FS_IOC_GETFLAGS = (2 << 30) | (ctypes.sizeof(ctypes.c_long) << 16) | (ord("f") << 8) | 1
_UNCHANGEABLE = ((0x10, "immutable", "i"), (0x20, "append-only", "a"))  # FS_IMMUTABLE_FL, FS_APPEND_FL


def unchangeable_attribute(directory: Path) -> tuple[str, str] | None:
    """('immutable', 'i') or ('append-only', 'a') for a directory with that attribute (chattr), which
    then can be neither removed nor replaced, not even by root; None without, or where the file
    system or the system does not say."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        (flags,) = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, bytes(4)))  # the kernel's is an int
    except OSError:
        return None
    finally:
        os.close(fd)
    return next(((name, letter) for bit, name, letter in _UNCHANGEABLE if flags & bit), None)


def check_output_path(out: Path) -> None:
    """Refuse an OUT that cannot be created and filled, naming why (see also outdir.check_output)."""
    if out.name == ".." or out == Path("."):  # pathlib drops inner '.'; '/' is check_output's
        raise OutputPathError(f"{shown(str(out))}: names no new directory (OUT must end in a directory name)")
    parent = existing_ancestor(out.parent)
    _check_name_lengths(out, parent)
    if not parent.is_dir():
        raise OutputPathError(f"{out}: {parent} is not a directory")
    attribute = unchangeable_attribute(parent)
    if attribute is not None and (attribute[0] == "immutable" or parent == Path(os.path.abspath(out.parent))):
        # nothing can be created in an immutable directory; in an append-only one the staging
        # directory and the lock could be, but never renamed to OUT or removed again
        name, letter = attribute
        raise OutputPathError(
            f"{out}: cannot create the package there: {parent} has the {name} attribute (chattr +{letter})"
            + ("" if name == "immutable" else ", so the finished package could not be renamed into place nor its staging removed"),
            f"remove the {name} attribute: chattr -{letter} {parent}, or choose another OUT",
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        try:
            read_only = os.statvfs(parent).f_flag & os.ST_RDONLY
        except OSError:
            read_only = False
        why = "is on a read-only file system" if read_only else "is not writable"
        raise OutputPathError(f"{out}: cannot create the package there: {parent} {why}")
    check_replaceable(out)


def check_replaceable(out: Path) -> None:
    """Refuse an existing OUT that the finished package could not be renamed into the place of."""
    attribute = unchangeable_attribute(out)
    if attribute is not None:
        name, letter = attribute
        raise OutputPathError(
            f"{out}: has the {name} attribute (chattr +{letter}), so no package can be renamed into its place, not even by root",
            f"remove the {name} attribute: chattr -{letter} {out}, or choose another OUT",
        )


def _check_name_lengths(out: Path, parent: Path) -> None:
    """Each directory convert creates must fit the file system's name limit, OUT's name with room
    for the staging directory's decoration."""
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    created = Path(os.path.abspath(out)).relative_to(parent).parts or (out.name,)
    for i, part in enumerate(created):
        last = i == len(created) - 1
        room = name_max - (NAME_DECORATION_BYTES if last else 0)
        if len(os.fsencode(part)) > room:
            raise OutputPathError(
                f"{shown(str(out))}: a name of {len(os.fsencode(part))} bytes; this file system allows "
                f"{name_max}" + (f", and convert needs {NAME_DECORATION_BYTES} for its staging directory" if last else ""),
                "choose a shorter name",
            )


def space_needed(tensor_names: list[str], tensor_bytes: int, other_bytes: int) -> int:
    """Bytes a package takes at most: tensor data, shard headers (bounded per tensor), the other
    files, and a margin."""
    headers = sum(len(name.encode("utf-8", "surrogatepass")) + HEADER_BYTES_PER_TENSOR for name in tensor_names)
    return tensor_bytes + headers + other_bytes + SPACE_MARGIN_BYTES


def _is_root() -> bool:
    """Root may also use the blocks and inodes a file system reserves."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _free_bytes(st: os.statvfs_result) -> int:
    """Bytes this process may still write."""
    return (st.f_bfree if _is_root() else st.f_bavail) * st.f_frsize


def _free_inodes(st: os.statvfs_result) -> int:
    """Files this process may still create."""
    return st.f_ffree if _is_root() else st.f_favail


def check_free_space(out: Path, needed: int) -> None:
    """NoSpaceError unless the file system OUT goes to has `needed` bytes free (for this user)."""
    parent = existing_ancestor(out.parent)
    try:
        st = os.statvfs(parent)
    except OSError:
        return  # unknown: the write itself will tell
    free = _free_bytes(st)
    if free < needed:
        raise NoSpaceError(
            f"{out}: the package needs {_human(needed)} ({needed} bytes) but {parent} has {_human(free)} "
            f"({free} bytes) free"
        )


_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_REFUSED = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR, errno.EEXIST}


def output_error(
    exc: OSError, out: Path, shard_size_option: bool = True
) -> OutputWriteError | OutputPathError | TooManyOpenFilesError:
    """The named error for an OSError raised while the package at `out` was being written (by a
    command with --max-shard-size, or without: assemble)."""
    where = exc.filename or out
    if exc.errno in OPEN_FILES_EXHAUSTED:  # a source file as likely as one of the package's
        return too_many_open_files(exc, where)
    if exc.errno in _NO_SPACE:
        st = None
        with contextlib.suppress(OSError):
            st = os.statvfs(existing_ancestor(out.parent))
        if st is None:
            return NoSpaceError(f"{where}: the file system is full; the package was not written")
        free = _human(_free_bytes(st))
        if st.f_files and not _free_inodes(st):  # f_files 0: no inode table to run out of
            return NoSpaceError(
                f"{where}: the file system has no free inodes left: it can hold no more files, though {free} are free; "
                "the package was not written",
                "delete files there (df -i shows the inodes), or choose an OUT on another file system",
            )
        return NoSpaceError(f"{where}: the file system is full ({free} free now); the package was not written")
    if exc.errno == errno.EFBIG:
        return OutputWriteError(
            f"{where}: a file grew past the file-size limit of this process or file system (ulimit -f); "
            "the package was not written",
            "raise the limit (ulimit -f unlimited)" + (", or pass a smaller --max-shard-size" if shard_size_option else ""),
        )
    if exc.errno in _REFUSED:
        return OutputPathError(f"{where}: {exc.strerror}; the package was not written")
    if exc.errno == errno.ENOENT and not os.path.isdir(os.path.dirname(os.path.abspath(where))):
        return directory_gone(where, exc)
    return OutputWriteError(f"{where}: {exc.strerror or exc}; the package was not written")


LEAVE_IN_PLACE = "leave OUT's directory in place until convert ends, then run it again"


def directory_gone(where: str | os.PathLike, exc: OSError) -> OutputWriteError:
    """The error of a write to `where` that failed (ENOENT) because the directory it went to, the
    staging or OUT's directory, was removed or renamed during the run."""
    return OutputWriteError(
        f"{where}: {exc.strerror}: the directory it was written in was removed or renamed during the run; "
        "the package was not written",
        LEAVE_IN_PLACE,
    )


@contextlib.contextmanager
def output_errors(out: Path, shard_size_option: bool = True) -> Iterator[None]:
    """Raise the named error (see `output_error`) instead of an OSError from the block inside."""
    try:
        yield
    except OSError as exc:
        raise output_error(exc, out, shard_size_option) from exc
