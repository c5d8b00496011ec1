"""The safetensors container, read and written by hand (contract section 2).

`u64 little-endian header length | UTF-8 JSON header | data`. The `safetensors` package cannot hand
F8 tensors to numpy and cannot write a file tensor by tensor, so this module parses and validates
headers itself, reads tensor bytes with positioned reads (never the whole file), and writes shards
through `ShardWriter`, whose header is fixed before the first data byte.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import mmap
import os
import queue
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ascendconv.errors import HeaderError, TruncatedFileError, shown
from ascendconv.io.checksum import new_hasher
from ascendconv.io.files import lease, open_regular, parse_json_bytes, unlease

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
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14+
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


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of one file: where its bytes are and what they mean."""

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

    @property
    def data_size(self) -> int:
        return self.file_size - self.data_start


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Parse and fully validate the header of a safetensors file.

    Offsets must be contiguous from 0, in bounds, end exactly at the end of the file, and each
    tensor's byte count must equal prod(shape) * itemsize.
    """
    path = Path(path)
    try:
        fd, file_size = open_regular(path)
        try:
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
        raise HeaderError(f"{path}: cannot read: {exc.strerror}") from exc
    header = parse_json_bytes(header_bytes, f"{path}: the header", HeaderError)
    if not isinstance(header, dict):
        raise HeaderError(f"{path}: the header is a JSON {type(header).__name__}, not an object")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HeaderError(f"{path}: __metadata__ must map strings to strings")

    data_start = 8 + header_len
    data_size = file_size - data_start
    tensors: dict[str, TensorEntry] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        entry = _plain_entry(path, name, info, data_start) or _parse_entry(path, name, info, data_start)
        tensors[name] = entry
        spans.append((entry.offset - data_start, entry.offset - data_start + entry.nbytes, name))

    spans.sort()
    position = 0
    for begin, end, name in spans:
        if begin != position:
            raise HeaderError(
                f"{path}: tensor {shown(name)} starts at data offset {begin}, expected {position} "
                "(offsets must be contiguous)"
            )
        position = end
    if position > data_size:
        last = spans[-1][2]
        raise TruncatedFileError(
            f"{path}: tensor {shown(last)} ends at data offset {position} but the file holds only "
            f"{data_size} data bytes (truncated file)"
        )
    if position < data_size:
        raise HeaderError(f"{path}: {data_size - position} bytes after the last tensor")
    return SafetensorsHeader(path, file_size, data_start, tensors, dict(metadata), header_bytes)


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


def _plain_entry(path: Path, name: str, info: object, data_start: int) -> TensorEntry | None:
    """The entry of a well-formed header in the usual form, in fewer steps (a full-scale checkpoint
    has about 100,000); None for anything else, which `_parse_entry` then accepts or names. It only
    accepts what `_parse_entry` accepts, and makes the same entry."""
    if type(info) is not dict:
        return None
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    nbytes = ITEMSIZES.get(dtype) if type(dtype) is str else None
    if nbytes is None or type(shape) is not list or type(offsets) is not list or len(offsets) != 2:
        return None
    for dim in shape:
        if type(dim) is not int or dim < 0:
            return None
        nbytes *= dim
        if nbytes > _PLAIN_LIMIT:
            return None
    begin, end = offsets
    if type(begin) is not int or type(end) is not int or begin < 0 or end - begin != nbytes or end > _PLAIN_LIMIT:
        return None
    return TensorEntry(name, dtype, tuple(shape), path, data_start + begin, nbytes)


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


class TensorReader:
    """Positioned reads of tensor bytes; one open descriptor per file.

    Reads go through `os.pread` into fresh buffers; `map_range` maps one range for as long as its
    array lives. Either way resident memory is bounded by what the caller holds, not by how much
    of the file has been touched (as it would be with a mapping of whole files).
    """

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()

    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            with self._lock:  # verify's threads share one reader
                fd = self._fds.get(path)
                if fd is None:
                    fd, _ = open_regular(path)  # O_NONBLOCK: never waits on a FIFO put in the file's place
                    if hasattr(os, "posix_fadvise"):  # tensors are read front to back: read ahead generously
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                    lease(fd, path)  # mapped reads: see files.mapped_reads_guarded
                    self._fds[path] = fd
        return fd

    def read_bytes(self, entry: TensorEntry, start: int = 0, count: int | None = None) -> bytearray:
        """`count` bytes of the tensor's data starting `start` bytes into it."""
        count = entry.nbytes - start if count is None else count
        if start < 0 or count < 0 or start + count > entry.nbytes:
            raise ValueError(f"byte range [{start}, {start + count}) outside tensor {shown(entry.name)}")
        buffer = bytearray(count)
        view = memoryview(buffer)
        fd = self._fd(entry.path)
        done = 0
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
            mapped = mmap.mmap(self._fd(entry.path), length, access=mmap.ACCESS_READ, offset=aligned)
        except (OSError, ValueError) as exc:  # e.g. the file shrank below the range
            raise TruncatedFileError(f"{entry.path}: tensor {shown(entry.name)} is cut short ({exc})") from exc
        try:
            if hasattr(mapped, "madvise"):  # not on Windows
                mapped.madvise(_MADV_POPULATE_READ)
        except OSError as exc:
            if exc.errno == errno.EFAULT:  # pages past the end of the file
                mapped.close()
                raise TruncatedFileError(f"{entry.path}: tensor {shown(entry.name)} is cut short (truncated file)") from exc
            # older kernels (EINVAL): pages fault in on first touch instead
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

    def __enter__(self) -> "TensorReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class TensorSpec:
    """What a writer will put in a shard: known in full before any byte is written."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


def encode_header(specs: list[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The length prefix plus the space-padded JSON header for tensors laid out in `specs` order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    position = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [position, position + spec.nbytes],
        }
        position += spec.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-(8 + len(text)) % HEADER_ALIGNMENT)
    return struct.pack("<Q", len(text)) + text


# Shards at least this large are written with O_DIRECT (see _DirectSink); smaller ones through the
# page cache.
DIRECT_IO_MIN_BYTES = 64 * 2**20
_DIRECT_ALIGNMENT = 4096  # file offsets, lengths and buffer addresses of O_DIRECT writes
_DIRECT_BUFFER_BYTES = 8 * 2**20
_DIRECT_BUFFERS = 6


def _aligned_buffer(nbytes: int) -> np.ndarray:
    """A uint8 array of `nbytes` starting on an _DIRECT_ALIGNMENT boundary (ordinary private
    memory, which O_DIRECT pins on its fast path, unlike shared anonymous mappings)."""
    import numpy as np

    raw = np.empty(nbytes + _DIRECT_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % _DIRECT_ALIGNMENT
    return raw[start : start + nbytes]


class _BufferedSink:
    """Plain writes through the page cache; the checksum in the caller's thread."""

    def __init__(self, path: Path):
        self._file = open(path, "wb")
        self._hasher = new_hasher()

    def write(self, view: memoryview) -> None:
        self._hasher.update(view)
        self._file.write(view)

    def close(self) -> str:
        self._file.close()
        return self._hasher.hexdigest()

    def abort(self) -> None:
        self._file.close()


class _DirectSink:
    """Sequential writes that bypass the page cache (O_DIRECT), hashed and written in the background.

    `write` copies the bytes into one of a few aligned staging buffers and returns (the caller may
    reuse its buffer at once). Each full buffer goes to two threads: one adds it to the checksum,
    the other writes it at its aligned offset; it is free again once both are done. So the disk
    works while the caller computes, nothing waits in the page cache for a final `sync`, hashing
    never holds up the caller, and memory holds only the staging buffers. `close` writes the last partial block zero-padded to the alignment, truncates the file
    to its exact size and returns the digest. Where the file system refuses O_DIRECT (tmpfs, some
    network file systems), the same writes go through the page cache.
    """

    def __init__(self, path: Path):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        try:
            self._fd = os.open(path, flags | os.O_DIRECT, 0o666)
        except OSError:
            self._fd = os.open(path, flags, 0o666)
        self._hasher = new_hasher()
        self._free: queue.Queue = queue.Queue()
        for _ in range(_DIRECT_BUFFERS):
            self._free.put(_aligned_buffer(_DIRECT_BUFFER_BYTES))
        self._to_hash: queue.Queue = queue.Queue()
        self._to_write: queue.Queue = queue.Queue()
        self._pending: dict[int, int] = {}  # id(buffer) -> threads still using it
        self._lock = threading.Lock()
        self._current = self._free.get()
        self._fill = 0
        self._offset = 0  # file offset of the current buffer
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._drain, args=(jobs, work), name=f"{what} {path.name}", daemon=True)
            for jobs, work, what in ((self._to_hash, self._hash, "checksum"), (self._to_write, self._pwrite, "write"))
        ]
        for thread in self._threads:
            thread.start()

    def _hash(self, buffer: np.ndarray, length: int, padded: int, offset: int) -> None:
        self._hasher.update(buffer[:length])

    def _pwrite(self, buffer: np.ndarray, length: int, padded: int, offset: int) -> None:
        data = memoryview(buffer)[:padded]
        done = 0
        while done < padded:
            try:
                done += os.pwrite(self._fd, data[done:], offset + done)
            except OSError as exc:
                import fcntl  # Unix only, like O_DIRECT itself

                flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
                if exc.errno != errno.EINVAL or not flags & os.O_DIRECT:
                    raise
                fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)  # not supported here after all

    def _drain(self, jobs: queue.Queue, work) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            try:
                if self._error is None:
                    work(*job)
            except BaseException as exc:
                self._error = exc
            with self._lock:
                self._pending[id(job[0])] -= 1
                done = self._pending[id(job[0])] == 0
            if done:
                self._free.put(job[0])

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _submit(self, length: int, padded: int) -> None:
        job = (self._current, length, padded, self._offset)
        with self._lock:
            self._pending[id(self._current)] = 2
        self._to_hash.put(job)
        self._to_write.put(job)
        self._offset += padded

    def write(self, view: memoryview) -> None:
        self._check()
        import numpy as np

        data = np.frombuffer(view, dtype=np.uint8)
        done = 0
        while done < data.size:
            n = min(data.size - done, _DIRECT_BUFFER_BYTES - self._fill)
            self._current[self._fill : self._fill + n] = data[done : done + n]
            self._fill += n
            done += n
            if self._fill == _DIRECT_BUFFER_BYTES:
                self._submit(self._fill, self._fill)
                self._current = self._free.get()
                self._fill = 0
                self._check()

    def close(self) -> str:
        size = self._offset + self._fill
        try:
            if self._fill:
                padded = -(-self._fill // _DIRECT_ALIGNMENT) * _DIRECT_ALIGNMENT
                self._current[self._fill : padded] = 0
                self._submit(self._fill, padded)
            self._stop()
            self._check()
            os.ftruncate(self._fd, size)
            return self._hasher.hexdigest()
        finally:
            self._release()

    def abort(self) -> None:
        self._stop()
        self._release()

    def _stop(self) -> None:
        self._to_hash.put(None)
        self._to_write.put(None)
        for thread in self._threads:
            thread.join()

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._current = None
        while not self._free.empty():
            self._free.get()


class ShardWriter:
    """Writes one safetensors shard as a state machine: header, then each tensor's bytes in order.

    Every size is known before the first byte; `write` accepts a tensor's bytes in any number of
    chunks but only for the tensor whose turn it is, and `close` refuses a shard that is not full.
    The checksum (io.checksum.CHECKSUM) of the whole file is computed as it is written. Shards of DIRECT_IO_MIN_BYTES or
    more go to the disk with O_DIRECT, hashed and written in the background (_DirectSink); `close`
    returns once every byte is hashed and written.
    """

    def __init__(self, path: str | os.PathLike, specs: list[TensorSpec], metadata: dict[str, str] | None = None):
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"{path}: a tensor name is repeated in the shard plan")
        self.path = Path(path)
        self._specs = specs
        self._index = 0  # which tensor is being written
        self._written = 0  # bytes of that tensor written so far
        header = encode_header(specs, metadata)
        direct = len(header) + sum(s.nbytes for s in specs) >= DIRECT_IO_MIN_BYTES and hasattr(os, "O_DIRECT")
        self._file = _DirectSink(self.path) if direct else _BufferedSink(self.path)
        self._put(header)
        self._skip_empty()

    def _put(self, data) -> None:
        self._file.write(memoryview(data).cast("B"))  # the sink keeps the checksum

    def _skip_empty(self) -> None:
        while self._index < len(self._specs) and self._specs[self._index].nbytes == 0:
            self._index += 1

    @property
    def current(self) -> TensorSpec | None:
        return self._specs[self._index] if self._index < len(self._specs) else None

    def write(self, name: str, data) -> None:
        """Append bytes (bytes-like or a C-contiguous numpy array) of tensor `name`."""
        spec = self.current
        if spec is None or spec.name != name:
            expected = spec.name if spec else "nothing (the shard is full)"
            raise RuntimeError(f"{self.path}: write of {shown(name)} out of order, expected {expected}")
        import numpy as np

        if isinstance(data, np.ndarray):  # as raw bytes: memoryview cannot export ml_dtypes (bfloat16)
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        view = memoryview(data).cast("B")
        if self._written + view.nbytes > spec.nbytes:
            raise RuntimeError(f"{self.path}: {shown(name)} overflows its {spec.nbytes} planned bytes")
        self._put(view)
        self._written += view.nbytes
        if self._written == spec.nbytes:
            self._index += 1
            self._written = 0
            self._skip_empty()

    def close(self) -> str:
        """Finish the shard and return its checksum's hex digest."""
        if self.current is not None:
            raise RuntimeError(f"{self.path}: closed before {shown(self.current.name)} was written")
        return self._file.close()

    def abort(self) -> None:
        self._file.abort()

