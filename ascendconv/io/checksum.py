"""Shard checksums: BLAKE3 for what convert writes, sha256 still read for older packages.

A shard checksum is hashed while the shard is written and again by `verify` while it reads the
shard, so it must keep up with the disk. BLAKE3 runs at several GB/s per core and spreads one
large update over every core; sha256 (the algorithm of packages written before) runs at about
1.5 GB/s on one core. Provenance names the algorithm ("checksum") and keys each shard's digest by
it, so a reader never has to guess.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
from pathlib import Path

from ascendconv.ascendv1 import Provenance

CHECKSUM = "blake3"  # what convert records
ALGORITHMS = ("blake3", "sha256")  # what verify can check
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14+


def new_hasher(algorithm: str = CHECKSUM):
    """A hashlib-style object (`update`, `hexdigest`) for `algorithm`; BLAKE3 uses every core
    for large updates (it releases the GIL while hashing)."""
    if algorithm == "blake3":
        import blake3

        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown checksum algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")


def recorded_checksum(provenance: dict, shard: str) -> tuple[str, str] | None:
    """(algorithm, hex digest) recorded for `shard`, or None. The algorithm is provenance's
    "checksum" field; packages written before it existed recorded {"sha256": hex} per shard."""
    record = Provenance(provenance)
    digest = record.digest(shard)
    if digest is None or record.checksum not in ALGORITHMS:
        return None
    return record.checksum, digest


MAP_WINDOW = 64 * 2**20  # bytes mapped at a time
HASH_PIECE = 8 * 2**20  # bytes populated and hashed at a time
READ_AHEAD = 128 * 2**20  # bytes the kernel is asked to read ahead of the hash


def file_digest(path: str | os.PathLike, algorithm: str) -> str:
    """Hex digest of a whole file, hashed straight from the page cache, with no copy.

    The file is mapped a window at a time and hashed a piece at a time. A piece is populated at
    once (MADV_POPULATE_READ) rather than faulted page by page, and the kernel is asked
    (POSIX_FADV_WILLNEED) to read READ_AHEAD bytes beyond it while it is hashed. Without that advice
    a file not in the page cache is read in the small synchronous steps of page faults, and hashing
    took three times as long as `cat`; with it, the disk never waits for the hash. On a cached file
    the advice costs nothing and BLAKE3 hashes on every core faster than `cat` copies.
    A file that shrinks while it is read raises OSError.
    """
    from ascendconv.io.files import lease, open_regular, unlease

    hasher = new_hasher(algorithm)
    fd, size = open_regular(path)  # never a FIFO or a device: no end to those
    lease(fd, Path(path))
    try:
        _advise_read(fd, 0, READ_AHEAD)
        for offset in range(0, size, MAP_WINDOW):
            length = min(MAP_WINDOW, size - offset)
            with mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=offset) as mapped, memoryview(mapped) as view:
                for start in range(0, length, HASH_PIECE):
                    count = min(HASH_PIECE, length - start)
                    _advise_read(fd, offset + start + READ_AHEAD, HASH_PIECE)
                    _populate(mapped, start, count, path)
                    hasher.update(view[start : start + count])
    finally:
        unlease(fd)
        os.close(fd)
    return hasher.hexdigest()


def _advise_read(fd: int, offset: int, length: int) -> None:
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    except OSError:  # advice only: a file system without it is read as it comes
        pass


def _populate(mapped: mmap.mmap, start: int, count: int, path: str | os.PathLike) -> None:
    try:
        mapped.madvise(_MADV_POPULATE_READ, start, count)
    except OSError as exc:  # EFAULT: pages past the end (the file shrank); EINVAL: an old kernel
        if exc.errno == errno.EFAULT:
            raise OSError(errno.EIO, f"{path} shrank while it was being read") from exc
