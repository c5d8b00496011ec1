"""The safetensors container, read and written by hand (contract section 2).

`u64 little-endian header length | UTF-8 JSON header | data`. The `safetensors` package cannot hand
F8 tensors to numpy and cannot write a file tensor by tensor, so this module parses and validates
headers itself and reads tensor bytes with positioned reads (never the whole file). Shards are
written by `io.writer.ShardWriter`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import mmap
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NamedTuple

from ascendconv.errors import (
    OPEN_FILES_EXHAUSTED,
    HeaderError,
    OutOfMemoryError,
    SourceChangedError,
    TruncatedFileError,
    shown,
    too_many_open_files,
)
from ascendconv.io.files import is_text, lease, open_regular, parse_json_bytes, populate, unlease

if TYPE_CHECKING:
    import numpy as np

# dtype code -> bytes per element. Headers are parsed without numpy: commands that read only
# headers (inspect, convert --dry-run) never import it (100 ms of their start-up).
ITEMSIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8,
    "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit
U64_MAX = 2**64 - 1
HEADER_ALIGNMENT = 8  # the reference writer pads the JSON header with spaces to 8 bytes


# The exponent field of each float dtype: all ones means Inf or NaN.
_EXPONENT_MASKS = {
    "F16": ("uint16", 0x7C00),
    "BF16": ("uint16", 0x7F80),
    "F32": ("uint32", 0x7F800000),
    "F64": ("uint64", 0x7FF0000000000000),
}


def nonfinite_count(data, dtype: str) -> int:
    """How many of the values of a float dtype in raw bytes `data` are NaN or Inf (0 for other
    dtypes), from their bits: no float conversion."""
    if dtype not in _EXPONENT_MASKS:
        return 0
    import numpy as np

    name, mask = _EXPONENT_MASKS[dtype]
    view = np.dtype(name).type
    bits = np.frombuffer(data, view)
    return int(np.count_nonzero((bits & view(mask)) == view(mask)))


@functools.cache
def _numpy_dtypes() -> dict[str, "np.dtype"]:
    """dtype code -> numpy dtype used to view the bytes. F8_E4M3 is viewed as raw uint8 codes: the
    numerics work on bits, and ml_dtypes' float8 views are made where values are needed."""
    import ml_dtypes
    import numpy as np

    return {
        "BOOL": np.dtype(np.bool_),
        "U8": np.dtype(np.uint8),
        "I8": np.dtype(np.int8),
        "U16": np.dtype(np.uint16),
        "I16": np.dtype(np.int16),
        "U32": np.dtype(np.uint32),
        "I32": np.dtype(np.int32),
        "U64": np.dtype(np.uint64),
        "I64": np.dtype(np.int64),
        "F16": np.dtype(np.float16),
        "BF16": np.dtype(ml_dtypes.bfloat16),
        "F32": np.dtype(np.float32),
        "F64": np.dtype(np.float64),
        "F8_E4M3": np.dtype(np.uint8),
        "F8_E5M2": np.dtype(np.uint8),
        "F8_E8M0": np.dtype(np.uint8),
    }


def __getattr__(name: str):
    if name == "NUMPY_DTYPES":  # made on first use, with numpy
        return _numpy_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def itemsize(dtype: str) -> int:
    return ITEMSIZES[dtype]


def tensor_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * itemsize(dtype)


class TensorEntry(NamedTuple):
    """One tensor of one file: where its bytes are and what they mean.

    A named tuple, not a frozen dataclass: a full-scale checkpoint has a few hundred thousand, and
    `tuple.__new__(TensorEntry, fields)` (_plain_entries) makes one in a third of the time that
    setting a dataclass's slots takes. Its repr and hash are the dataclass's and it is as immutable
    (setting a field raises AttributeError); unlike it, it equals the plain tuple of its fields and
    iterates over them, which nothing does with an entry. A field is read about 20 ns slower than a
    slot, so a record read many times per source tensor (SourceLinear) stays a dataclass."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class SafetensorsHeader:
    path: Path
    file_size: int
    data_start: int
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    header_bytes: bytes = field(repr=False)
    stamp: FileStamp | None = None  # the file the header was read from (file_stamp)

    @property
    def data_size(self) -> int:
        return self.file_size - self.data_start


FileStamp = tuple[int, int, int, int]


def file_stamp(st: os.stat_result) -> FileStamp:
    """(device, inode, size, mtime) of a file: another file renamed into its place, or the same
    file rewritten, has another."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Parse and fully validate the header of a safetensors file.

    Offsets must be contiguous from 0, in bounds, end exactly at the end of the file, and each
    tensor's byte count must equal prod(shape) * itemsize.
    """
    path = Path(path)
    try:
        fd, file_size = open_regular(path)
        try:
            stamp = file_stamp(os.fstat(fd))
            prefix = os.pread(fd, 8, 0)
            if len(prefix) < 8:
                raise TruncatedFileError(f"{path}: {file_size} bytes, too short to hold a safetensors header")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > file_size:
                raise TruncatedFileError(
                    f"{path}: header length {header_len} does not fit in a file of {file_size} bytes"
                    + (f" (at most {MAX_HEADER_BYTES} are allowed)" if header_len > MAX_HEADER_BYTES else "")
                )
            header_bytes = _pread_exactly(fd, header_len, 8, path)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in OPEN_FILES_EXHAUSTED:
            raise too_many_open_files(exc, path) from exc
        raise HeaderError(f"{path}: cannot read: {exc.strerror}") from exc
    header = parse_json_bytes(header_bytes, f"{path}: the header", HeaderError)
    if not isinstance(header, dict):
        raise HeaderError(f"{path}: the header is a JSON {type(header).__name__}, not an object")

    metadata = header.pop("__metadata__", None)  # null is what the safetensors library reads as none
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HeaderError(f"{path}: __metadata__ is {shown(metadata)}; it must map strings to strings")
    if b"\\u" in header_bytes:  # a lone surrogate comes only from a \u escape: most headers have none
        for name in header:
            if not is_text(name):
                raise HeaderError(
                    f"{path}: tensor name {shown(name)} holds a lone surrogate (an escape such as \\ud800), which is not "
                    "text: no file or header could carry it"
                )

    data_start = 8 + header_len
    data_size = file_size - data_start
    plain = _plain_entries(path, header, data_start)
    if plain is None:
        tensors = {name: _parse_entry(path, name, info, data_start) for name, info in header.items()}
        position = -1
    else:
        tensors, position = plain
    if position < 0:  # listed in another order (the safetensors library sorts names): check the sorted spans
        position = _contiguous_end(path, tensors, data_start)
    if position > data_size:
        last = max(tensors.values(), key=lambda e: (e.offset, e.offset + e.nbytes, e.name)).name
        raise TruncatedFileError(
            f"{path}: tensor {shown(last)} ends at data offset {position} but the file holds only "
            f"{data_size} data bytes (truncated file)"
        )
    if position < data_size:
        raise HeaderError(f"{path}: {data_size - position} bytes after the last tensor")
    return SafetensorsHeader(path, file_size, data_start, tensors, dict(metadata), header_bytes, stamp)


def _contiguous_end(path: Path, tensors: dict[str, TensorEntry], data_start: int) -> int:
    """Where the last tensor ends, the tensors sorted by their data offsets; a HeaderError if they
    leave a gap or overlap."""
    spans = sorted((e.offset - data_start, e.offset - data_start + e.nbytes, name) for name, e in tensors.items())
    position = 0
    for begin, end, name in spans:
        if begin != position:
            raise HeaderError(
                f"{path}: tensor {shown(name)} starts at data offset {begin}, expected {position} "
                "(offsets must be contiguous)"
            )
        position = end
    return position


def _pread_exactly(fd: int, count: int, offset: int, path: Path) -> bytes:
    parts, done = [], 0
    while done < count:
        part = os.pread(fd, count - done, offset + done)
        if not part:
            raise TruncatedFileError(f"{path}: cut short while its header was read (truncated file)")
        parts.append(part)
        done += len(part)
    return b"".join(parts)


def _is_u64(value: object) -> bool:
    """An integer the safetensors library accepts (a JSON unsigned 64-bit one, never a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


def shape_problem(dtype: str, shape: object) -> str | None:
    """Why the safetensors library would refuse `shape`, or None: each dimension an unsigned 64-bit
    integer, and the element count, multiplied in order, and the bit count within 64 bits."""
    if not isinstance(shape, list) or not all(_is_u64(d) for d in shape):
        return "dimensions must be integers from 0 to 2**64-1"
    count = 1
    for dim in shape:
        count *= dim
        if count > U64_MAX:
            return "its element count overflows 64 bits"
    if count * itemsize(dtype) * 8 > U64_MAX:
        return "its size in bits overflows 64 bits"
    return None


_PLAIN_LIMIT = 2**60  # bytes; a tensor this large takes the full checks of _parse_entry


def _plain_entries(path: Path, header: dict, data_start: int) -> tuple[dict[str, TensorEntry], int] | None:
    """Every entry of a well-formed header in the usual form, in one tight loop (a full-scale
    checkpoint has a few hundred thousand), and where the last one ends while they are listed in
    file order (-1 when they are not); None as soon as one is in any other form, and `_parse_entry`
    then accepts or names each. It only accepts what `_parse_entry` accepts, and makes the same
    entries."""
    tensors: dict[str, TensorEntry] = {}
    new, itemsizes, limit = tuple.__new__, ITEMSIZES, _PLAIN_LIMIT
    position = 0  # where the next tensor starts while they are in file order; -1 after
    try:
        for name, info in header.items():
            if type(info) is not dict:
                return None
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            if type(dtype) is not str or type(shape) is not list:
                return None
            nbytes = itemsizes[dtype]
            for dim in shape:
                # each dimension bounded too: beside a 0, a huge one leaves nbytes small
                if type(dim) is not int or not 0 <= dim <= limit:
                    return None
                nbytes *= dim
                if nbytes > limit:
                    return None
            if type(begin) is not int or type(end) is not int or begin < 0 or end - begin != nbytes or end > limit:
                return None
            tensors[name] = new(TensorEntry, (name, dtype, tuple(shape), path, data_start + begin, nbytes))
            position = end if begin == position else -1
    except (KeyError, TypeError, ValueError):  # a field missing, unhashable, or offsets not two values
        return None
    return tensors, position


def _parse_entry(path: Path, name: str, info: object, data_start: int) -> TensorEntry:
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise HeaderError(f"{path}: tensor {shown(name)} lacks dtype, shape or data_offsets")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in ITEMSIZES:
        raise HeaderError(f"{path}: tensor {shown(name)} has unknown dtype {shown(dtype)}")
    problem = shape_problem(dtype, shape)
    if problem:
        raise HeaderError(f"{path}: tensor {shown(name)} has invalid shape {shown(shape)}: {problem}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_u64(o) for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise HeaderError(f"{path}: tensor {shown(name)} has invalid data_offsets {shown(offsets)}")
    nbytes = tensor_nbytes(dtype, tuple(shape))
    if offsets[1] - offsets[0] != nbytes:
        raise HeaderError(
            f"{path}: tensor {shown(name)} ({dtype} {shape}) needs {nbytes} bytes but its offsets span "
            f"{offsets[1] - offsets[0]}"
        )
    return TensorEntry(name, dtype, tuple(shape), path, data_start + offsets[0], nbytes)


def open_file_budget() -> int:
    """How many source files a reader keeps open at once: a quarter of this process's descriptor
    limit (ulimit -n), at most 512, at least 1. A checkpoint of 1,000+ shards would otherwise exhaust
    a limit of 1024 and fail as if its files were unreadable; a floor above a quarter took the whole
    of a small limit (16 of `ulimit -n 16`), leaving no descriptor to write the package or remove
    its staging with."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = 2048 if soft == resource.RLIM_INFINITY else soft
    except (ImportError, OSError, ValueError):  # not POSIX
        soft = 1024
    return max(1, min(512, soft // 4))


class TensorReader:
    """Positioned reads of tensor bytes; at most `open_file_budget()` descriptors open at once.

    Reads go through `os.pread` into fresh buffers; `map_range` maps one range for as long as its
    array lives. Either way resident memory is bounded by what the caller holds, not by how much
    of the file has been touched (as it would be with a mapping of whole files). Past the budget
    the least recently used descriptor no read is using is closed (a mapping keeps its file alive
    without it); a file is opened again when it is next read.

    `stamps` (path -> file_stamp of the file its header was read from) are checked at every open:
    tensors are read at the offsets that header gave, so bytes read from a file put in its place
    since (a download renaming a new copy over it) would be misread, or read from the wrong place.
    """

    def __init__(self, stamps: dict[Path, FileStamp] | None = None) -> None:
        self._stamps = stamps or {}
        self._fds: OrderedDict[Path, int] = OrderedDict()  # least recently used first
        self._using: dict[Path, int] = {}  # reads in flight per file: their descriptor stays open
        self._budget = open_file_budget()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _open(self, path: Path) -> Iterator[int]:
        """The file's descriptor, kept open while the block inside runs (other threads may read)."""
        with self._lock:  # verify's threads share one reader
            fd = self._fds.get(path)
            if fd is None:
                self._evict()
                fd, _ = open_regular(path)  # O_NONBLOCK: never waits on a FIFO put in the file's place
                self._check_stamp(fd, path)
                if hasattr(os, "posix_fadvise"):  # tensors are read front to back: read ahead generously
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                lease(fd, path)  # mapped reads: see files.mapped_reads_guarded
                self._fds[path] = fd
            self._fds.move_to_end(path)
            self._using[path] = self._using.get(path, 0) + 1
        try:
            yield fd
        finally:
            with self._lock:
                self._using[path] -= 1

    def _check_stamp(self, fd: int, path: Path) -> None:
        expected = self._stamps.get(path)
        if expected is None or file_stamp(os.fstat(fd)) == expected:
            return
        os.close(fd)
        raise SourceChangedError(
            f"{path}: replaced or rewritten since its header was read (another file, size or modification time), "
            "so its tensors are no longer where that header put them"
        )

    def _evict(self) -> None:
        """Close least recently used descriptors no read is using until one more fits the budget."""
        idle = [p for p in self._fds if not self._using.get(p)]
        while len(self._fds) >= self._budget and idle:
            path = idle.pop(0)
            fd = self._fds.pop(path)
            unlease(fd)
            os.close(fd)

    def hold(self, paths) -> None:
        """Open (and, under `mapped_reads_guarded`, lease) these files now, before anything is read
        from them: a writer or truncation that comes later is then held back and reported, instead of
        cutting a file short before its first read."""
        for path in sorted(set(paths))[: self._budget]:  # past the budget, a file is leased when it is read
            with self._open(path):
                pass

    def read_bytes(self, entry: TensorEntry, start: int = 0, count: int | None = None) -> bytearray:
        """`count` bytes of the tensor's data starting `start` bytes into it."""
        count = entry.nbytes - start if count is None else count
        if start < 0 or count < 0 or start + count > entry.nbytes:
            raise ValueError(f"byte range [{start}, {start + count}) outside tensor {shown(entry.name)}")
        buffer = bytearray(count)
        view = memoryview(buffer)
        done = 0
        with self._open(entry.path) as fd:
            while done < count:
                n = os.preadv(fd, [view[done:]], entry.offset + start + done)
                if n == 0:
                    raise TruncatedFileError(f"{entry.path}: tensor {shown(entry.name)} is cut short (truncated file)")
                done += n
        return buffer

    def map_range(self, entry: TensorEntry, start: int, count: int) -> np.ndarray:
        """`count` bytes of the tensor's data from `start` as a read-only uint8 array mapped from
        the file: no copy, and no memory of its own beyond the page cache. The mapping is
        populated at once (MADV_POPULATE_READ, Linux 5.14+) so that a file cut short raises
        TruncatedFileError here rather than a bus error later; it lasts as long as the array."""
        if start < 0 or count <= 0 or start + count > entry.nbytes:
            raise ValueError(f"byte range [{start}, {start + count}) outside tensor {shown(entry.name)}")
        begin = entry.offset + start
        aligned = begin - begin % mmap.ALLOCATIONGRANULARITY
        length = begin + count - aligned
        try:
            with self._open(entry.path) as fd:
                mapped = mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=aligned)
        except (OSError, ValueError) as exc:  # e.g. the file shrank below the range
            if getattr(exc, "errno", None) == errno.ENOMEM:  # this machine's memory, not the file, is short
                raise OutOfMemoryError(f"{entry.path}: no memory left to map tensor {shown(entry.name)}") from exc
            if getattr(exc, "errno", None) in OPEN_FILES_EXHAUSTED:  # mmap holds a duplicate of the descriptor
                raise too_many_open_files(exc, entry.path) from exc
            raise TruncatedFileError(f"{entry.path}: tensor {shown(entry.name)} is cut short ({exc})") from exc
        if not populate(mapped, 0, length):
            mapped.close()
            raise TruncatedFileError(f"{entry.path}: tensor {shown(entry.name)} is cut short (truncated file)")
        import numpy as np

        return np.frombuffer(mapped, dtype=np.uint8, count=count, offset=begin - aligned)

    def read_rows(self, entry: TensorEntry, row_start: int = 0, row_stop: int | None = None) -> np.ndarray:
        """Rows [row_start, row_stop) along the first axis, viewed with the tensor's numpy dtype."""
        rows = entry.shape[0] if entry.shape else 1
        row_stop = rows if row_stop is None else row_stop
        row_bytes = entry.nbytes // rows if rows else 0
        data = self.read_bytes(entry, row_start * row_bytes, (row_stop - row_start) * row_bytes)
        import numpy as np

        array = np.frombuffer(data, dtype=_numpy_dtypes()[entry.dtype])
        if not entry.shape:
            return array.reshape(())
        return array.reshape((row_stop - row_start, *entry.shape[1:]))

    def read(self, entry: TensorEntry) -> np.ndarray:
        return self.read_rows(entry)

    def close(self) -> None:
        for fd in self._fds.values():
            unlease(fd)
            os.close(fd)
        self._fds.clear()
        self._using.clear()

    def __enter__(self) -> "TensorReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
