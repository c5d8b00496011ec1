"""Shared libraries and this process's address space: whether `ulimit -v` is why one did not load.

glibc's dlopen says "failed to map segment from shared object" when it cannot map a library and
drops the errno: the same words for an address space too small (RLIMIT_AS) and for a library on a
noexec mount. What proves the limit is the cause: an address-space limit is in effect, and the span
of the library's loadable segments, the one mapping dlopen reserves first, cannot be mapped now
(an anonymous mapping of that size fails with ENOMEM).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct

from ascendconv.errors import OutOfMemoryError, clip

PT_LOAD = 1


def address_space_too_small(exc: BaseException, needed_by: str) -> OutOfMemoryError | None:
    """OutOfMemoryError when a shared library that failed to load in `exc`'s chain (an extension
    module's ImportError, ctypes' OSError from dlopen) does not fit in what this process's
    address-space limit leaves; else None, the failure not proven to be the limit's."""
    limit = address_space_limit()
    if limit is None:
        return None
    while exc is not None:
        path = library_path(exc)
        span = loaded_span(path) if path is not None else None
        if span is not None and not mappable(span):
            return OutOfMemoryError(
                f"{address_space_words(limit)} is too small "
                f"for {needed_by}: {clip(path)} did not load, and the {span / 2**20:.1f} MiB it maps do not fit in what is left",
                "raise the limit (ulimit -v unlimited, or higher) and run the command again",
            )
        exc = exc.__cause__ or exc.__context__
    return None


def address_space_limit() -> int | None:
    """This process's address-space limit (RLIMIT_AS, ulimit -v) in bytes; None where none is set
    (or the system is not POSIX)."""
    try:
        import resource
    except ImportError:
        return None
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def address_space_words(limit: int) -> str:
    """The address-space limit as messages name it, in ulimit's KiB and in MiB."""
    return f"this process's address-space limit (ulimit -v {limit // 1024}: {limit / 2**20:.1f} MiB)"


def library_path(exc: BaseException) -> str | None:
    """The shared library a failed load names: an extension module's ImportError carries its path,
    dlopen's message (ctypes' OSError) begins with it ('PATH: failed to map ...')."""
    if isinstance(exc, ImportError):
        path = exc.path
    elif isinstance(exc, OSError) and exc.errno is None and exc.args and isinstance(exc.args[0], str):
        path = exc.args[0].split(": ", 1)[0]
    else:
        return None
    return path if path and os.path.isfile(path) else None


def loaded_span(path: str) -> int | None:
    """Bytes of address space the loadable segments of the ELF64 little-endian shared object at
    `path` span, or None for any other file."""
    try:
        with open(path, "rb") as file:
            header = file.read(64)
            if header[:6] != b"\x7fELF\x02\x01":  # 64-bit, little-endian
                return None
            (table_at,) = struct.unpack_from("<Q", header, 0x20)
            entry_size, entries = struct.unpack_from("<HH", header, 0x36)
            file.seek(table_at)
            table = file.read(entry_size * entries)
        segments = [struct.unpack_from("<I12xQ16xQ", table, i * entry_size) for i in range(entries)]  # type, vaddr, memsz
    except (OSError, struct.error):
        return None
    extents = [(address, address + size) for kind, address, size in segments if kind == PT_LOAD]
    if not extents:
        return None
    return max(end for _, end in extents) - min(start for start, _ in extents)


def mappable(size: int) -> bool:
    """Whether `size` bytes of address space can be mapped now (read-only and never touched: no
    memory is used); only ENOMEM says they cannot (a size past what a mapping can be, from a
    damaged header, proves nothing of the limit)."""
    try:
        mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ).close()
    except OSError as exc:
        return exc.errno != errno.ENOMEM
    except OverflowError:
        return True
    return True
