"""Shard checksums: BLAKE3 for what convert writes, sha256 still read for older packages.

A shard checksum is hashed while the shard is written and again by `verify` while it reads the
shard, so it must keep up with the disk. BLAKE3 runs at several GB/s per core and spreads one
large update over every core; sha256 (the algorithm of packages written before) runs at about
1.5 GB/s on one core. Provenance names the algorithm ("checksum") and keys each shard's digest by
it, so a reader never has to guess.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
import queue
import threading
from pathlib import Path

from ascendconv.ascendv1 import Provenance

CHECKSUM = "blake3"  # what convert records
ALGORITHMS = ("blake3", "sha256")  # what verify can check


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


HASH_PIECE = 8 * 2**20  # bytes populated and hashed at a time
READ_AHEAD = 128 * 2**20  # bytes the kernel is asked to read ahead of the hash


def file_digest(path: str | os.PathLike, algorithm: str, follow: bool = True) -> str:
    """Hex digest of a whole file (see `hashed_file`)."""
    return hashed_file(path, algorithm, follow)[0]


def hashed_file(path: str | os.PathLike, algorithm: str, follow: bool = True) -> tuple[str, os.stat_result]:
    """Hex digest of a whole file, hashed straight from the page cache, with no copy.

    The file is mapped whole and hashed a piece at a time, while a second thread prepares the
    pieces ahead (`_PiecesAhead`): it asks the kernel to read READ_AHEAD bytes beyond them
    (POSIX_FADV_WILLNEED) and populates each piece's pages at once (MADV_POPULATE_READ) rather than
    page fault by page fault. So the hash never waits for the disk nor for the page tables: done in
    turn, populating and hashing a cached 2.34 GB package took 0.56 s instead of 0.46 s, and without
    the advice a file not in the page cache was read in the small synchronous steps of page faults,
    three times slower than `cat`. The same thread unmaps the hashed pieces from the process again
    (MADV_DONTNEED; the page cache keeps them), so memory stays at a few pieces whatever the size.
    A file that shrinks while it is read raises OSError. Returns the digest and the status of the
    very file hashed (its inode: a caller can tell whether a path still names it afterwards).
    `follow=False` refuses a symbolic link.
    """
    from ascendconv.io.files import lease, open_regular, unlease

    hasher = new_hasher(algorithm)
    fd, size = open_regular(Path(path), follow)  # never a FIFO or a device: no end to those
    lease(fd, Path(path))
    try:
        status = os.fstat(fd)
        if size:
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
                with _PiecesAhead(fd, mapped, size, path) as pieces:
                    for start, count in pieces:
                        with view[start : start + count] as piece:  # released even if the hash fails
                            hasher.update(piece)
    finally:
        unlease(fd)
        os.close(fd)
    return hasher.hexdigest(), status


class _PiecesAhead:
    """Iterates (start, count) over a mapped file's pieces, each one read ahead and populated by a
    thread of its own while the one before is hashed; at most two pieces wait ready. A piece counts
    as hashed once the next is asked for; the thread then unmaps it."""

    def __init__(self, fd: int, mapped: mmap.mmap, size: int, path: str | os.PathLike) -> None:
        self._fd, self._mapped, self._size, self._path = fd, mapped, size, path
        self._ready: queue.Queue = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._hashed = 0  # pieces the consumer is done with (written by it, read by the thread)
        self._thread = threading.Thread(target=self._prepare, name="ascendconv-read-ahead", daemon=True)

    def __enter__(self) -> _PiecesAhead:
        from ascendconv.io.threads import threads_started

        # hashed by verify, assemble and convert --resume's background re-read: no --workers to offer
        with threads_started(workers_option=False):
            self._thread.start()
        return self

    def __iter__(self):
        for index in range(-(-self._size // HASH_PIECE)):
            got = self._ready.get()
            if isinstance(got, BaseException):
                raise got
            yield got
            self._hashed = index + 1

    def _prepare(self) -> None:
        try:
            self._prepare_pieces()
        except BaseException as exc:  # handed to the consumer, which would otherwise wait forever
            self._ready.put(exc)

    def _prepare_pieces(self) -> None:
        from ascendconv.io.files import populate

        _advise_read(self._fd, 0, READ_AHEAD)
        unmapped = 0
        for start in range(0, self._size, HASH_PIECE):
            if self._stop.is_set():
                return
            hashed = self._hashed  # read once: the consumer may move it on meanwhile
            for done in range(unmapped * HASH_PIECE, hashed * HASH_PIECE, HASH_PIECE):
                self._mapped.madvise(mmap.MADV_DONTNEED, done, HASH_PIECE)  # the rest go with the mapping
            unmapped = hashed
            count = min(HASH_PIECE, self._size - start)
            _advise_read(self._fd, start + READ_AHEAD, HASH_PIECE)
            if not populate(self._mapped, start, count):
                raise OSError(errno.EIO, f"{self._path} shrank while it was being read")
            self._ready.put((start, count))

    def __exit__(self, *exc_info) -> None:
        # the thread touches the mapping: it must be gone before the mapping is closed
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._ready.get(timeout=0.01)  # frees a thread blocked on a full queue
        self._thread.join()


def _advise_read(fd: int, offset: int, length: int) -> None:
    advise = getattr(os, "posix_fadvise", None)  # not on macOS
    if advise is None:
        return
    try:
        advise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    except OSError:  # advice only: a file system without it is read as it comes
        pass


# The source's data in the identity of packages before tensor windows (still checked by verify):
# each source shard's data region sampled at SAMPLE_WINDOWS
# evenly spaced windows (the first and last included). A fine-tune or a re-upload of the same layout
# changes nearly every byte, so any window tells; reading 1 MiB per shard costs next to nothing
# beside converting it, where hashing all of it would re-read the whole source.
SAMPLE_WINDOWS = 16
SAMPLE_BYTES = 64 * 2**10


def shard_windows(start: int, end: int) -> list[tuple[int, int]]:
    """The [first, last) byte ranges `sampled_digest` reads of the span [start, end)."""
    span = max(end - start, 0)
    if span <= SAMPLE_WINDOWS * SAMPLE_BYTES:
        offsets = range(start, end, SAMPLE_BYTES)
    else:
        step = (span - SAMPLE_BYTES) // (SAMPLE_WINDOWS - 1)
        offsets = [start + i * step for i in range(SAMPLE_WINDOWS - 1)] + [end - SAMPLE_BYTES]  # the last byte too
    return [(offset, min(offset + SAMPLE_BYTES, end)) for offset in offsets]


def sampled_digest(path: str | os.PathLike, start: int, end: int) -> str:
    """BLAKE3 of bytes [start, end) of a regular file, sampled (all of them when the span is small)."""
    return _ranges_digest(path, shard_windows(start, end), max(end - start, 0))


def _ranges_digest(path: str | os.PathLike, ranges: list[tuple[int, int]], span: int) -> str:
    """BLAKE3 of the bytes of `ranges` ([first, last), in order) of a regular file, then `span`."""
    from ascendconv.io.files import open_regular

    hasher = new_hasher()
    fd, _ = open_regular(Path(path))
    try:
        for begin, stop in ranges:
            for offset in range(begin, stop, HASH_PIECE):  # merged windows of small tensors can be long
                count = min(HASH_PIECE, stop - offset)
                data = os.pread(fd, count, offset)
                if len(data) != count:
                    raise OSError(errno.EIO, f"{path} shrank while it was being read")
                hasher.update(data)
    finally:
        os.close(fd)
    hasher.update(span.to_bytes(8, "little"))
    return hasher.hexdigest()


# The source's data in a plan's identity, from this version on: a window of TENSOR_WINDOW bytes at
# the start, the middle and the end of every tensor's bytes (a tensor smaller than three windows is
# read whole), besides the shard windows above. A fine-tune that changes only some tensors (a few
# layers, a LoRA merged into attention) changes nearly every byte of each, so it meets that tensor's
# windows wherever the shard windows fall. Neighbouring windows closer than MERGE_GAP are read as
# one range (a run of small tensors is one read).
TENSOR_WINDOW = 4 * 2**10
MERGE_GAP = 16 * 2**10


def tensor_windows(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The [first, last) byte ranges `tensor_sampled_digest` reads: every span's start, middle and
    end windows and the shard windows of [start, end), sorted and merged."""
    ranges = []
    for begin, stop in spans:
        if stop - begin <= 3 * TENSOR_WINDOW:
            ranges.append((begin, stop))
            continue
        middle = begin + (stop - begin - TENSOR_WINDOW) // 2
        ranges += [(begin, begin + TENSOR_WINDOW), (middle, middle + TENSOR_WINDOW), (stop - TENSOR_WINDOW, stop)]
    ranges += shard_windows(start, end)
    merged: list[list[int]] = []
    for begin, stop in sorted(r for r in ranges if r[1] > r[0]):
        if merged and begin <= merged[-1][1] + MERGE_GAP:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([begin, stop])
    return [(begin, stop) for begin, stop in merged]


def tensor_sampled_digest(path: str | os.PathLike, spans: list[tuple[int, int]], start: int, end: int) -> str:
    """BLAKE3 of the bytes of `tensor_windows` of a regular file, in file order, then the span's size."""
    return _ranges_digest(path, tensor_windows(spans, start, end), max(end - start, 0))


# What each package shard was made from: BLAKE3 of the bytes of every source tensor it was made
# from, hashed while the pipeline reads them, folded into one digest per shard (`reads_digest`).
# Recorded in the provenance, the part manifest and the resume ledger, so that `verify --source`
# proves each shard was made from the very bytes of the source it is given.
def tensor_hasher():
    """A BLAKE3 on the calling thread only: it runs beside the conversion kernels, on cores they use."""
    import blake3

    return blake3.blake3()


def reads_digest(tensor_digests: dict[str, bytes]) -> str:
    """One digest of source tensor name -> BLAKE3 of its bytes, in name order."""
    hasher = new_hasher()
    for name in sorted(tensor_digests):
        encoded = name.encode("utf-8", "surrogatepass")
        hasher.update(len(encoded).to_bytes(8, "little") + encoded + tensor_digests[name])
    return hasher.hexdigest()
