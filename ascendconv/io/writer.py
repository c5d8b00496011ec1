"""Shards written by hand (contract section 2): the header fixed before the first data byte, then
each tensor's bytes in order, hashed as they are written (`ShardWriter`), through the page cache or,
for large shards, with O_DIRECT."""

from __future__ import annotations

import errno
import json
import os
import queue
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ascendconv.errors import shown
from ascendconv.io.checksum import new_hasher
from ascendconv.io.files import FILE_MODE
from ascendconv.io.safetensors import HEADER_ALIGNMENT, tensor_nbytes
from ascendconv.io.threads import threads_started

if TYPE_CHECKING:
    import numpy as np


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
        self._file = open(path, "wb", opener=lambda name, flags: os.open(name, flags, FILE_MODE))
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
            self._fd = os.open(path, flags | os.O_DIRECT, FILE_MODE)
        except OSError:
            self._fd = os.open(path, flags, FILE_MODE)
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
        try:
            with threads_started():
                for thread in self._threads:
                    thread.start()
        except BaseException:
            self._threads = [thread for thread in self._threads if thread.ident is not None]
            self.abort()  # the file closed and the thread started stopped: no one holds this sink
            raise

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
