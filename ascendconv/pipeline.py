"""The threaded pipeline that turns a Plan into shards, with bounded memory.

Three stages overlap: a reader thread prefetches source chunks, a pool of `workers` threads converts
them (numpy and the numba kernels release the GIL), and a writer thread appends the results to the
shard being written. Chunks are consumed in plan order whatever the number of workers, so the output
bytes never depend on it. Nothing here prints.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from ascendconv.ascendv1 import QUANT_TYPES
from ascendconv.errors import BadOptionError, out_of_memory, shown
from ascendconv.io.checksum import reads_digest, tensor_hasher
from ascendconv.io.safetensors import TensorEntry
from ascendconv.io.threads import threads_started
from ascendconv.io.writer import ShardWriter
from ascendconv.sources import Source, SourceLinear
from ascendconv.sources.rows import entry_points, linear_rows
from ascendconv.options import KERNELS, Notice
from ascendconv.plan import OutputKind, OutputTensor, Plan

if TYPE_CHECKING:
    import numpy as np

CHUNK_ELEMENTS = {"numba": 16 * 2**20, "reference": 4 * 2**20}  # source elements per work item
COPY_CHUNK_BYTES = 16 * 2**20  # bytes per work item of a tensor copied as it is
PREFETCH_ITEMS = 3  # chunks the reader may hold ahead of the workers
SHARD_METADATA = {"format": "pt"}  # what torch-saved safetensors carry; loaders accept it

Progress = Callable[[int, int], None]  # (source bytes done, source bytes total)


class Kernel:
    """One implementation of the row operations (numba, or the numpy reference: same bytes)."""

    def __init__(self, name: str):
        if name == "reference":
            from ascendconv.formats import requantize as impl
        elif name == "numba":
            from ascendconv import kernels as impl
        else:
            raise BadOptionError(f"unknown kernel {name!r}", f"choose one of {', '.join(KERNELS)}")
        self.name = name
        self.impl = impl

    def rows(self, source: Source, linear: SourceLinear):
        """The row operations of one source linear, whatever its format (sources/rows.py)."""
        return linear_rows(self.impl, source, linear)

    def prepare(self, plan: Plan, source: Source, notice: Notice | None) -> None:
        """Compile (first run on a machine) or load the numba kernels the plan needs, before any
        thread starts; the first time, say so through `notice`, then say how long it took."""
        if self.name != "numba":
            return
        from ascendconv.kernels import compile_entry_points

        kinds = {t.kind for t in plan.tensors}
        needed = entry_points(source.linears.values(), OutputKind.MX_WEIGHT in kinds, OutputKind.RESOLVE in kinds)
        compile_entry_points(needed, notice)


@dataclass(frozen=True, slots=True)
class WriteTensor:
    """Bytes of one tensor, the next in its shard's order."""

    name: str
    data: "np.ndarray"


@dataclass(frozen=True, slots=True)
class CollectScales:
    """Scale rows of an MX weight: gathered until its last rows are done, then written at once."""

    name: str
    rows: "np.ndarray"
    last: bool


@dataclass
class WorkItem:
    """A source byte range to read and what to make of it once read."""

    entry: TensorEntry
    start: int
    count: int
    compute: Callable[["np.ndarray"], list[WriteTensor | CollectScales]]  # the bytes read (uint8) -> what to write
    reads: tuple[TensorEntry, ...] = ()  # the tensor's other sources (a linear's scale): hashed with its first item
    shard: int = 0  # the package shard the tensor made of these bytes goes to


class BufferPool:
    """Recycled uint8 buffers of one size for the chunks in flight.

    Streaming a checkpoint through fresh buffers would touch (fault in and zero) as much new memory
    as the checkpoint is large; recycling keeps the conversion on the same few pages. `take` never
    waits: it hands out a free buffer or makes one, so the number of buffers is the most ever in
    flight at once, which the pipeline's bounded queues limit. Requests larger than the pool's size
    get a buffer of their own, never recycled.
    """

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._free: list[np.ndarray] = []
        self._owned: dict[int, np.ndarray] = {}  # every buffer made, by id (held, so ids stay unique)
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        import numpy as np  # here and below, not at import: a dry run never needs numpy

        if nbytes > self.nbytes:
            return np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            if self._free:
                return self._free.pop()[:nbytes]
            buffer = np.empty(self.nbytes, dtype=np.uint8)
            self._owned[id(buffer)] = buffer
        return buffer[:nbytes]

    def give(self, given: set[int], array) -> None:
        """Take back the pool buffer that `array` views, if it views one (once per buffer: `given`
        holds the ids already taken back for one work item)."""
        import numpy as np

        base = array
        while isinstance(base, np.ndarray) and self._owned.get(id(base)) is not base:
            base = base.base
        if not isinstance(base, np.ndarray) or id(base) in given:
            return
        given.add(id(base))
        with self._lock:
            self._free.append(base)


def write_shards(
    source: Source,
    plan: Plan,
    kernel: Kernel,
    staging: Path,
    workers: int,
    progress: Progress | None,
    shards: list[int] | None = None,
    on_closed: Callable[[str, str, str], None] | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Write the plan's shards (or only the numbers in `shards`) into `staging`; return each file's
    checksum and the digest of the source bytes it was made from (io.checksum.reads_digest, hashed
    as the reader reads them). `on_closed(file, checksum, reads)` is called as each shard is finished."""
    pools = {"out": BufferPool(2 * CHUNK_ELEMENTS[kernel.name])}
    items = list(work_items(source, plan, kernel, pools, shards))
    # every file the run reads, scales included (they are read as their linear's rows come up)
    scales = [linear.scale.path for linear in source.linears.values() if linear.scale is not None]
    source.reader.hold([item.entry.path for item in items] + scales)
    total = sum(item.count for item in items)
    done = 0
    prefetched: queue.Queue = queue.Queue(maxsize=PREFETCH_ITEMS)
    to_write: queue.Queue = queue.Queue(maxsize=workers + 1)
    stop = threading.Event()
    hashed = SourceDigests(source, items, stop)

    def read_ahead() -> None:
        try:
            for item in items:
                # mapped, not copied: populating a mapping of page-cache pages costs a third of
                # copying them (0.06 against 0.19 s/GB here), and the mapping goes away with the
                # last reference to it (once the chunk is written and hashed)
                data = source.reader.map_range(item.entry, item.start, item.count)
                if not (_put(prefetched, data, stop) and hashed.put(item, data)):
                    return
        except BaseException as exc:  # handed to the main thread
            prefetched.put(exc)

    writer = PackageShardWriter(plan, staging, shards, on_closed, shard_sources(source, plan), hashed)
    writer_error: list[BaseException] = []

    def write_behind() -> None:
        try:
            while True:
                job = to_write.get()
                if job is None:
                    return
                data, ops = job
                if stop.is_set():
                    continue  # failing: drain without writing
                writer.apply(ops)
                # the bytes are in the shard writer's hands now: recycle the item's buffers
                given: set[int] = set()
                for pool in pools.values():
                    pool.give(given, data)
                    for op in ops:
                        if isinstance(op, WriteTensor):
                            pool.give(given, op.data)
        except BaseException as exc:
            writer_error.append(exc)
            while to_write.get() is not None:  # drain so the producer never blocks
                pass

    reader_thread = threading.Thread(target=read_ahead, daemon=True)
    writer_thread = threading.Thread(target=write_behind, daemon=True)
    try:
        with threads_started():
            reader_thread.start()
            writer_thread.start()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: collections.deque = collections.deque()
            for item in items:
                data = prefetched.get()
                if isinstance(data, BaseException):
                    raise data
                with threads_started():  # the pool starts its threads as work is submitted
                    future = pool.submit(item.compute, data)
                pending.append((item, data, future))
                while len(pending) > workers:
                    done = _hand_over(pending.popleft(), to_write, writer_error, done, total, progress)
            while pending:
                done = _hand_over(pending.popleft(), to_write, writer_error, done, total, progress)
        to_write.put(None)
        writer_thread.join()
        if writer_error:
            raise writer_error[0]
        checksums = writer.finish()
        hashed.close()
        return checksums, writer.reads
    except BaseException:
        stop.set()
        to_write.put(None)
        if writer_thread.ident is not None:  # None: it could not be started
            writer_thread.join()  # the shard writer is the writer thread's until it stops
        writer.abort()
        hashed.close()
        raise


def _put(into: queue.Queue, value, stop: threading.Event) -> bool:
    """Put `value` into a bounded queue, unless the run stops first (False)."""
    while not stop.is_set():
        try:
            into.put(value, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


HASH_AHEAD = 4  # chunks read and waiting for the source hasher (each keeps its mapping until hashed)


class SourceDigests:
    """BLAKE3 of every source tensor the pipeline reads (and of a linear's scale, with its first
    rows), hashed from the very chunks the workers convert, by a thread of its own: the reader hands
    a chunk to the workers first and to this thread next, so hashing runs beside the conversion,
    never before it (hashed first, by the reader, it cost 14 % of a convert's time here). The shard
    writer waits, before it closes a shard, until the chunks of its tensors are hashed."""

    def __init__(self, source: Source, items: list[WorkItem], stop: threading.Event):
        self.source, self.stop = source, stop
        self.digests: dict[str, bytes] = {}  # source tensor -> BLAKE3 of its bytes
        self._last = {item.shard: index for index, item in enumerate(items)}  # shard -> its last item
        self._queue: queue.Queue = queue.Queue(maxsize=HASH_AHEAD)
        self._done = threading.Condition()
        self._hashed = 0  # items hashed, in order
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ascendconv-source-hash", daemon=True)
        with threads_started():
            self._thread.start()

    def put(self, item: WorkItem, data) -> bool:
        if self._error is not None:
            raise self._error
        return _put(self._queue, (item, data), self.stop)

    def _run(self) -> None:
        hasher = tensor_hasher()
        try:
            while (job := self._queue.get()) is not None:
                item, data = job
                if item.start == 0:
                    for entry in item.reads:
                        self.digests[entry.name] = entry_digest(self.source, entry)
                    hasher = tensor_hasher()
                hasher.update(data)
                del job, data  # the chunk's mapping goes with its last reference
                if item.start + item.count == item.entry.nbytes:
                    self.digests[item.entry.name] = hasher.digest()
                with self._done:
                    self._hashed += 1
                    self._done.notify_all()
        except BaseException as exc:  # handed to whoever waits, and to the reader
            with self._done:
                self._error = exc
                self._done.notify_all()

    def wait_for(self, shard: int) -> None:
        """Return once every chunk of the shard's tensors is hashed (or raise, if the run fails
        meanwhile: chunks it will never read would be waited for forever)."""
        last = self._last.get(shard)
        with self._done:
            while last is not None and self._hashed <= last and self._error is None and not self.stop.is_set():
                self._done.wait(timeout=0.1)
        if self._error is not None:
            raise self._error
        if last is not None and self._hashed <= last:
            raise RuntimeError("the run stopped before the shard's source bytes were hashed")

    def close(self) -> None:
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.1)
                break
            except queue.Full:  # the thread failed and no longer takes chunks: drop them
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()
        self._thread.join()


def _hand_over(job, to_write: queue.Queue, writer_error: list, done: int, total: int, progress: Progress | None) -> int:
    item, data, future = job
    try:
        ops = future.result()
    except MemoryError as exc:  # the one place a worker's allocation fails: name the tensor it was making
        raise out_of_memory(exc, f"to convert tensor {shown(item.entry.name)} of {item.entry.path}") from exc
    if writer_error:
        raise writer_error[0]
    to_write.put((data, ops))
    done += item.count
    if progress:
        progress(done, total)
    return done


class PackageShardWriter:
    """Routes write operations to the shard each tensor was planned into, opening shards in turn
    (all of the plan's, or the numbers in `shards`)."""

    def __init__(
        self,
        plan: Plan,
        staging: Path,
        shards: list[int] | None,
        on_closed: Callable[[str, str, str], None] | None,
        sources: dict[int, list[TensorEntry]],
        hashed: SourceDigests,
    ):
        self.plan = plan
        self.staging = staging
        self.order = list(range(len(plan.shards))) if shards is None else sorted(shards)
        self.on_closed = on_closed
        self.shard_of = {t.name: t.shard for t in plan.tensors}
        self.current: ShardWriter | None = None
        self.position = -1  # in `order`
        self.digests: dict[str, str] = {}
        self.sources = sources  # shard number -> the source tensors it is made from
        self.hashed = hashed
        self.reads: dict[str, str] = {}  # shard file -> io.checksum.reads_digest of its sources
        self.collected: dict[str, list[np.ndarray]] = {}

    def _writer_for(self, name: str) -> ShardWriter:
        while self.position < 0 or self.order[self.position] < self.shard_of[name]:
            self._open_next()
        return self.current  # type: ignore[return-value]

    def _open_next(self) -> None:
        self._close_current()
        self.position += 1
        shard = self.plan.shards[self.order[self.position]]
        self.current = ShardWriter(self.staging / shard.file, [t.spec for t in shard.tensors], SHARD_METADATA)

    def _close_current(self) -> None:
        if self.current is not None:
            name, digest = self.current.path.name, self.current.close()
            self.digests[name] = digest
            self.current = None
            shard = self.order[self.position]
            self.hashed.wait_for(shard)
            self.reads[name] = reads_digest({e.name: self.hashed.digests[e.name] for e in self.sources.get(shard, [])})
            if self.on_closed is not None:
                self.on_closed(name, digest, self.reads[name])

    def apply(self, ops: list[WriteTensor | CollectScales]) -> None:
        import numpy as np

        for op in ops:
            if isinstance(op, WriteTensor):
                self._writer_for(op.name).write(op.name, op.data)
                continue
            self.collected.setdefault(op.name, []).append(op.rows)
            if op.last:
                parts = self.collected.pop(op.name)
                self._writer_for(op.name).write(op.name, np.concatenate(parts) if len(parts) > 1 else parts[0])

    def finish(self) -> dict[str, str]:
        # Shards holding only empty tensors got no write; open them too so numbering has no holes.
        while self.position < len(self.order) - 1:
            self._open_next()
        self._close_current()
        return self.digests

    def abort(self) -> None:
        if self.current is not None:
            self.current.abort()


def made_from(source: Source, by_weight: dict[str, SourceLinear], name: str) -> list[TensorEntry]:
    """The source tensors a package tensor made from source tensor `name` is made of: that tensor,
    and for a linear's weight its scale (read with its rows; the package's scale is made with its
    weight, from nothing else); none for an empty tensor, of which nothing is read."""
    entry, linear = source.tensors[name], by_weight.get(name)
    if entry.nbytes == 0:
        return []
    return [entry] + ([linear.scale] if linear is not None and linear.scale is not None else [])


def shard_sources(source: Source, plan: Plan) -> dict[int, list[TensorEntry]]:
    """Shard number -> the source tensors its tensors are made from (`made_from`)."""
    by_weight = {linear.weight.name: linear for linear in source.linears.values()}
    sources: dict[int, list[TensorEntry]] = {}
    for tensor in plan.tensors:
        if tensor.kind is not OutputKind.MX_SCALE:
            sources.setdefault(tensor.shard, []).extend(made_from(source, by_weight, tensor.source))
    return sources


def entry_digest(source: Source, entry: TensorEntry) -> bytes:
    """BLAKE3 of a source tensor's bytes, read a chunk at a time."""
    hasher = tensor_hasher()
    for start in range(0, entry.nbytes, COPY_CHUNK_BYTES):
        hasher.update(source.reader.map_range(entry, start, min(COPY_CHUNK_BYTES, entry.nbytes - start)))
    return hasher.digest()


def work_items(
    source: Source,
    plan: Plan,
    kernel: Kernel,
    pools: dict[str, BufferPool] | None = None,
    shards: list[int] | None = None,
) -> Iterator[WorkItem]:
    linears = {linear.weight.name: linear for linear in source.linears.values()}
    chunk_elements = CHUNK_ELEMENTS[kernel.name]
    wanted = None if shards is None else set(shards)
    for tensor in plan.tensors:
        entry = source.tensors[tensor.source]
        if wanted is not None and tensor.shard not in wanted:
            continue
        if tensor.kind is OutputKind.MX_SCALE:
            continue  # produced with its weight
        if entry.nbytes == 0:
            continue
        others = tuple(made_from(source, linears, tensor.source)[1:])  # a FLOAT linear's scale, if it has one
        if tensor.kind is OutputKind.COPY:
            step = COPY_CHUNK_BYTES
            for start in range(0, entry.nbytes, step):
                count = min(step, entry.nbytes - start)
                yield WorkItem(entry, start, count, _copy_op(tensor.name), others * (start == 0), tensor.shard)
        elif tensor.kind is OutputKind.BIAS_F32:
            yield WorkItem(entry, 0, entry.nbytes, _bias_op(tensor.name, entry.dtype), others, tensor.shard)
        else:
            yield from _linear_items(source, plan, kernel, tensor, linears[tensor.source], chunk_elements, pools)


def _copy_op(name: str):
    return lambda data: [WriteTensor(name, data)]


def _bias_op(name: str, dtype: str):
    import numpy as np

    from ascendconv.io.safetensors import NUMPY_DTYPES

    return lambda data: [WriteTensor(name, np.frombuffer(data, NUMPY_DTYPES[dtype]).astype(np.float32))]


def _linear_items(
    source: Source,
    plan: Plan,
    kernel: Kernel,
    tensor: OutputTensor,
    linear: SourceLinear,
    chunk_elements: int,
    pools: dict[str, BufferPool] | None = None,
) -> Iterator[WorkItem]:
    import numpy as np

    n, k = linear.shape
    rows_of = kernel.rows(source, linear)
    rows_per_chunk = max(1, chunk_elements // max(k, 1))
    quant_type = QUANT_TYPES[tensor.quant_type]
    fmt = quant_type.element  # None for a weight resolved to BF16 (FLOAT)
    # output bytes per row: BF16 (resolve), or the type's payload (E4M3 codes, packed E2M1)
    out_row_bytes = 2 * k if tensor.kind is OutputKind.RESOLVE else k // quant_type.k_per_byte
    scale_name = linear.prefix + ".weight_scale"

    for row_start in range(0, n, rows_per_chunk):
        rows = min(rows_per_chunk, n - row_start)

        def compute(data, row_start=row_start, rows=rows) -> list[tuple]:
            # the numba kernels write into recycled buffers (`out`); the reference allocates
            buffered = pools is not None and kernel.name == "numba" and tensor.kind is not OutputKind.MX_RELAID
            out = {"out": pools["out"].take(rows * out_row_bytes)} if buffered else {}
            if tensor.kind is OutputKind.MX_RELAID:  # no output buffer: the source bytes, or a table lookup
                payload, scales = rows_of.relaid(data, row_start, rows, tensor.transform)
                return [WriteTensor(tensor.name, payload), CollectScales(scale_name, scales, row_start + rows == n)]
            if tensor.kind is OutputKind.RESOLVE:
                if out:
                    out["out"] = out["out"].view(np.uint16).reshape(rows, k)
                return [WriteTensor(tensor.name, rows_of.to_bf16(data, row_start, rows, **out))]
            if out:
                out["out"] = out["out"].reshape(rows, -1)
            payload, scales = rows_of.quantize(data, row_start, rows, fmt, plan.scale_rule, plan.resolve_dtype, **out)
            return [WriteTensor(tensor.name, payload), CollectScales(scale_name, scales, row_start + rows == n)]

        reads = (linear.scale,) if linear.scale is not None and row_start == 0 else ()
        yield WorkItem(linear.weight, row_start * rows_of.row_bytes, rows * rows_of.row_bytes, compute, reads, tensor.shard)
