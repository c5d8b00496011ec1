"""Execute a Plan: stream the source tensor by tensor, re-quantize, write the package.

Three stages overlap with bounded memory: a reader thread prefetches source chunks, a pool of
`workers` threads converts them (numpy and the numba kernels release the GIL), and a writer thread
appends the results to the shard being written. Chunks are consumed in plan order whatever the
number of workers, so the output bytes never depend on it. The package is built in a hidden
sibling directory and renamed into place only when complete. Nothing here prints.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import queue
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from ascendconv import __version__
from ascendconv.errors import BadOptionError, NaNCodeError, NonFiniteValueError
from ascendconv.formats.constants import E2M1, E4M3, W4A8_MXFP
from ascendconv.io.checksum import CHECKSUM
from ascendconv.io.files import mapped_reads_guarded
from ascendconv.io.outdir import STAGING_TAG, StagedOutput, check_output, signals_interrupt, stale_siblings
from ascendconv.io.files import file_size
from ascendconv.io.output import check_free_space, check_output_path, output_errors, space_needed
from ascendconv.io.safetensors import ShardWriter, TensorEntry, nonfinite_count
from ascendconv.io.source import Fp8Linear, SourceCheckpoint, find_quantization_config
from ascendconv.options import KERNELS, ConvertOptions
from ascendconv.parts import PART_MANIFEST_NAME, part_shards, write_part_manifest
from ascendconv.ascendv1 import DESCRIPTION_NAME, INDEX_NAME, PROVENANCE_NAME
from ascendconv.decide import Deployment
from ascendconv.plan import OutputKind, OutputTensor, Plan, Planner
from ascendconv.resume import (
    LEDGER_NAME,
    Ledger,
    adopter,
    plan_identity,
    recorded_shards,
    sha256_hex,
    verify_in_background,
)

if TYPE_CHECKING:
    import numpy as np

CHUNK_ELEMENTS = {"numba": 16 * 2**20, "reference": 4 * 2**20}  # source elements per work item
COPY_CHUNK_BYTES = 16 * 2**20  # bytes per work item of a tensor copied as it is
PREFETCH_ITEMS = 3  # chunks the reader may hold ahead of the workers
SHARD_METADATA = {"format": "pt"}  # what torch-saved safetensors carry; loaders accept it

Progress = Callable[[int, int], None]  # (source bytes done, source bytes total)
Notice = Callable[[str], None]  # a one-line message for the user (the CLI prints it on stderr)


@dataclass
class ConvertResult:
    output: Path
    plan: Plan
    kernel: str
    seconds: float
    dry_run: bool
    shard_checksums: dict[str, str]  # shard file -> hex digest (io.checksum.CHECKSUM)
    bytes_written: int
    reused_shards: list[str] = field(default_factory=list)  # kept from an interrupted run (--resume)
    part: tuple[int, int] | None = None

    def to_dict(self) -> dict:
        return {
            "output": str(self.output),
            "dry_run": self.dry_run,
            "kernel": self.kernel,
            **self.plan.to_dict(),
            "bytes_out": self.bytes_written if not self.dry_run else self.plan.bytes_out,
            "seconds": round(self.seconds, 3),
            "part": list(self.part) if self.part else None,
            "written_shards": sorted(self.shard_checksums.keys() - set(self.reused_shards)),
            "reused_shards": self.reused_shards,
            # what a dry run would write as quant_model_description.json, for review before the run
            **({"description": self.plan.description()} if self.dry_run else {}),
        }


class Kernel:
    """The three operations convert needs on source rows, from one implementation."""

    def __init__(self, name: str):
        if name == "reference":
            from ascendconv.formats import requantize as impl
        elif name == "numba":
            from ascendconv import kernels as impl
        else:
            raise BadOptionError(f"unknown kernel {name!r}", f"choose one of {', '.join(KERNELS)}")
        self.name = name
        self.requantize_rows = impl.requantize_rows
        self.resolve_rows_bf16 = impl.resolve_rows_bf16
        self.first_nan_code = impl.first_nan_code

    def prepare(self, plan: Plan, block: tuple[int, int], notice: Notice | None) -> None:
        """Compile (first run on a machine) or load the numba kernels the plan needs, before any
        thread starts; the first time, say so through `notice`, then say how long it took."""
        if self.name != "numba":
            return
        from ascendconv.kernels import compile_entry_points, entry_points_for

        kinds = {t.kind for t in plan.tensors}
        compile_entry_points(entry_points_for(OutputKind.MX_WEIGHT in kinds, OutputKind.RESOLVE in kinds, block), notice)


def planner_for(source: SourceCheckpoint, deployment: Deployment) -> Planner:
    companions, unsafe = source.companion_files()
    return Planner(
        source.tensors, source.linears, companions, source.total_bytes, source.config, deployment, unsafe_files=unsafe
    )


def plan_for(source: SourceCheckpoint, options: ConvertOptions) -> Plan:
    return planner_for(source, options.deployment).plan(
        scheme=options.scheme,
        scale_rule=options.scale_rule,
        resolve_dtype=options.resolve_dtype,
        overrides=options.overrides,
        max_shard_size=options.max_shard_size,
    )


def convert(
    src: str | os.PathLike,
    out: str | os.PathLike,
    options: ConvertOptions,
    progress: Progress | None = None,
    dry_run: bool = False,
    notice: Notice | None = None,
) -> ConvertResult:
    started = time.perf_counter()
    out = Path(out)
    source = SourceCheckpoint.open(src)
    try:
        plan = plan_for(source, options)
        wanted = part_shards(plan, options.part)
        if options.kernel not in KERNELS:
            raise BadOptionError(f"unknown kernel {options.kernel!r}", f"choose one of {', '.join(KERNELS)}")
        if dry_run:  # no kernel: importing (let alone compiling) one is most of a dry run's time
            return ConvertResult(out, plan, options.kernel, time.perf_counter() - started, True, {}, 0, part=options.part)
        kernel = Kernel(options.kernel)
        with mapped_reads_guarded():  # the provenance counts NaN/Inf in copied tensors, read mapped
            provenance = provenance_base(source, plan, kernel.name)
        identity = plan_identity(provenance, plan, options, copied_file_digests(source, plan))
        marker = PART_MANIFEST_NAME if options.part else DESCRIPTION_NAME
        check = lambda: check_output(out, source.root, options.overwrite, marker)  # noqa: E731
        check_output_path(out)  # first: names too long for the file system make stat() itself fail
        check()  # before anything is created; again under the lock
        check_free_space(out, space_to_write(source, plan, wanted, out, options.resume))
        kernel.prepare(plan, source.quant.block, notice)
        adopt = adopter(identity, out, options.overwrite) if options.resume else None
        workers = worker_count(options.workers)
        with output_errors(out), signals_interrupt(), mapped_reads_guarded(), StagedOutput(out, check, adopt) as staged:
            if options.resume:
                digests, reused = resume_shards(source, plan, kernel, staged, workers, progress, wanted, identity)
            else:
                digests, reused = write_shards(source, plan, kernel, staged.staging, workers, progress, wanted), {}
            if options.part:
                small_files = write_plan_files(source, plan, staged.staging)
                write_part_manifest(staged.staging, identity, options.part, digests, small_files)
            else:
                write_package_files(source, plan, staged.staging, provenance, digests)
            bytes_written = sum((staged.staging / name).stat().st_size for name in digests)
            staged.publish(private=(LEDGER_NAME,))
        seconds = time.perf_counter() - started
        return ConvertResult(out, plan, kernel.name, seconds, False, digests, bytes_written, sorted(reused), options.part)
    finally:
        source.close()


def worker_count(requested: int) -> int:
    """Conversion threads: the cores this process may use, or fewer if asked. More threads than
    cores add no speed, only chunks in flight (the pipeline holds a few per worker)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(requested, cores) if requested > 0 else cores


def space_to_write(source: SourceCheckpoint, plan: Plan, wanted: list[int], out: Path, resume: bool) -> int:
    """Bytes the run will add at most (see io.output.space_needed): the wanted shards (all, or a
    part's) and the small files, less what kept work of an earlier --resume run already holds."""
    copied = sum(file_size(source.root / name) for name in plan.copied_files)
    tensors = [t for i in wanted for t in plan.shards[i].tensors]
    needed = space_needed([t.name for t in tensors], sum(t.nbytes for t in tensors), copied)
    if resume:
        kept = [p for staging in stale_siblings(out) if STAGING_TAG in staging.name for p in staging.iterdir()]
        needed -= sum(p.stat().st_size for p in kept if p.is_file() and not p.is_symlink())
    return max(needed, 0)


def resume_shards(
    source: SourceCheckpoint,
    plan: Plan,
    kernel: Kernel,
    staged: StagedOutput,
    workers: int,
    progress: Progress | None,
    wanted: list[int],
    identity: dict,
) -> tuple[dict[str, str], dict[str, str]]:
    """Write the wanted shards that an adopted staging does not record as finished, recording each
    as it closes, while the recorded ones are re-read in the background; a recorded shard whose
    checksum no longer matches is written after. Returns (every wanted shard's checksum, reused)."""
    staging = staged.staging
    recorded = recorded_shards(staging, [plan.shards[i].file for i in wanted]) if staged.resumed else {}
    ledger = Ledger(staging, identity, recorded)
    verified = verify_in_background(staging, recorded)
    todo = [i for i in wanted if plan.shards[i].file not in recorded]
    digests = write_shards(source, plan, kernel, staging, workers, progress, todo, ledger.record)
    reused = verified()
    again = [i for i in wanted if plan.shards[i].file in recorded and plan.shards[i].file not in reused]
    for i in again:
        ledger.forget(plan.shards[i].file)
        (staging / plan.shards[i].file).unlink(missing_ok=True)
    if again:
        digests.update(write_shards(source, plan, kernel, staging, workers, progress, again, ledger.record))
    return {**reused, **digests}, reused


# --- the streaming pipeline -------------------------------------------------------------------


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
    source: SourceCheckpoint,
    plan: Plan,
    kernel: Kernel,
    staging: Path,
    workers: int,
    progress: Progress | None,
    shards: list[int] | None = None,
    on_closed: Callable[[str, str], None] | None = None,
) -> dict[str, str]:
    """Write the plan's shards (or only the numbers in `shards`) into `staging`; return each file's
    checksum. `on_closed(file, checksum)` is called as each shard is finished."""
    pools = {"out": BufferPool(2 * CHUNK_ELEMENTS[kernel.name])}
    items = list(work_items(source, plan, kernel, pools, shards))
    total = sum(item.count for item in items)
    done = 0
    prefetched: queue.Queue = queue.Queue(maxsize=PREFETCH_ITEMS)
    to_write: queue.Queue = queue.Queue(maxsize=workers + 1)
    stop = threading.Event()

    def read_ahead() -> None:
        try:
            for item in items:
                # mapped, not copied: populating a mapping of page-cache pages costs a third of
                # copying them (0.06 against 0.19 s/GB here), and the mapping goes away with the
                # last reference to it (once the chunk is written)
                data = source.reader.map_range(item.entry, item.start, item.count)
                while not stop.is_set():
                    try:
                        prefetched.put(data, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as exc:  # handed to the main thread
            prefetched.put(exc)

    writer = PackageShardWriter(plan, staging, shards, on_closed)
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
    reader_thread.start()
    writer_thread.start()
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: collections.deque = collections.deque()
            for item in items:
                data = prefetched.get()
                if isinstance(data, BaseException):
                    raise data
                pending.append((item, data, pool.submit(item.compute, data)))
                while len(pending) > workers:
                    done = _hand_over(pending.popleft(), to_write, writer_error, done, total, progress)
            while pending:
                done = _hand_over(pending.popleft(), to_write, writer_error, done, total, progress)
        to_write.put(None)
        writer_thread.join()
        if writer_error:
            raise writer_error[0]
        return writer.finish()
    except BaseException:
        stop.set()
        to_write.put(None)
        writer_thread.join()  # the shard writer is the writer thread's until it stops
        writer.abort()
        raise


def _hand_over(job, to_write: queue.Queue, writer_error: list, done: int, total: int, progress: Progress | None) -> int:
    item, data, future = job
    ops = future.result()
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
        shards: list[int] | None = None,
        on_closed: Callable[[str, str], None] | None = None,
    ):
        self.plan = plan
        self.staging = staging
        self.order = list(range(len(plan.shards))) if shards is None else sorted(shards)
        self.on_closed = on_closed
        self.shard_of = {t.name: t.shard for t in plan.tensors}
        self.current: ShardWriter | None = None
        self.position = -1  # in `order`
        self.digests: dict[str, str] = {}
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
            if self.on_closed is not None:
                self.on_closed(name, digest)

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


def work_items(
    source: SourceCheckpoint,
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
        if tensor.kind is OutputKind.COPY:
            step = COPY_CHUNK_BYTES
            for start in range(0, entry.nbytes, step):
                yield WorkItem(entry, start, min(step, entry.nbytes - start), _copy_op(tensor.name))
        elif tensor.kind is OutputKind.BIAS_F32:
            yield WorkItem(entry, 0, entry.nbytes, _bias_op(tensor.name, entry.dtype))
        else:
            yield from _linear_items(source, plan, kernel, tensor, linears[tensor.source], chunk_elements, pools)


def _copy_op(name: str):
    return lambda data: [WriteTensor(name, data)]


def _bias_op(name: str, dtype: str):
    import numpy as np

    from ascendconv.io.safetensors import NUMPY_DTYPES

    return lambda data: [WriteTensor(name, np.frombuffer(data, NUMPY_DTYPES[dtype]).astype(np.float32))]


def _linear_items(
    source: SourceCheckpoint,
    plan: Plan,
    kernel: Kernel,
    tensor: OutputTensor,
    linear: Fp8Linear,
    chunk_elements: int,
    pools: dict[str, BufferPool] | None = None,
) -> Iterator[WorkItem]:
    import numpy as np

    n, k = linear.shape
    scale = source.read_scale(linear)
    block = source.quant.block
    rows_per_chunk = max(1, chunk_elements // max(k, 1))
    fmt = E2M1 if tensor.quant_type == W4A8_MXFP else E4M3
    # output bytes per row: BF16 (resolve), E4M3 codes or packed E2M1
    out_row_bytes = 2 * k if tensor.kind is OutputKind.RESOLVE else k if fmt is E4M3 else k // 2
    scale_name = linear.prefix + ".weight_scale"

    def check_nan(codes: np.ndarray, row_start: int) -> None:
        nan_at = kernel.first_nan_code(codes)
        if nan_at is not None:
            raise NaNCodeError(
                f"{linear.weight.path.name}: {linear.weight.name!r} holds a NaN code "
                f"(0x{codes[nan_at]:02X}) at row {row_start + nan_at[0]}, column {nan_at[1]}"
            )

    for row_start in range(0, n, rows_per_chunk):
        rows = min(rows_per_chunk, n - row_start)

        def compute(data, row_start=row_start, rows=rows) -> list[tuple]:
            codes = np.frombuffer(data, np.uint8).reshape(rows, k)
            # the numba kernels write into recycled buffers (`out`); the reference allocates
            out = {} if pools is None or kernel.name != "numba" else {"out": pools["out"].take(rows * out_row_bytes)}
            if tensor.kind is OutputKind.RESOLVE:
                check_nan(codes, row_start)
                if out:
                    out["out"] = out["out"].view(np.uint16).reshape(rows, k)
                return [WriteTensor(tensor.name, kernel.resolve_rows_bf16(codes, scale, block, row_start, **out))]
            if out:
                out["out"] = out["out"].reshape(rows, -1)
            try:
                payload, scales = kernel.requantize_rows(
                    codes, scale, block, row_start, plan.resolve_dtype, fmt, plan.scale_rule, **out
                )
            except ValueError as exc:
                # Both kernels refuse non-finite input, NaN codes included, so the codes need no
                # scan of their own on the way in: name the first NaN code if that was the cause,
                # else the overflow of code x tile scale.
                check_nan(codes, row_start)
                raise NonFiniteValueError(
                    f"{linear.weight.path.name}: {linear.weight.name!r} rows {row_start}..{row_start + rows - 1} "
                    f"resolve to NaN/Inf with their tile scales from {linear.scale.name!r} ({exc})"
                ) from exc
            return [WriteTensor(tensor.name, payload), CollectScales(scale_name, scales, row_start + rows == n)]

        yield WorkItem(linear.weight, row_start * k, rows * k, compute)


# --- the files around the shards --------------------------------------------------------------


def strip_quantization_config(config: dict) -> dict:
    """config.json for the package: vLLM must not see the FP8 quantization_config (contract section 3)."""
    config = {k: v for k, v in config.items() if k != "quantization_config"}
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = {k: v for k, v in config["text_config"].items() if k != "quantization_config"}
    return config


def dump_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def source_fingerprint(header_bytes: bytes, size: int) -> str:
    """Cheap identity of a source shard: its header and its size (the data is not re-read)."""
    return hashlib.sha256(header_bytes + size.to_bytes(8, "little")).hexdigest()


def nonfinite_copies(source: SourceCheckpoint, plan: Plan) -> dict[str, int]:
    """FLOAT tensors carried from the source that hold NaN or Inf -> how many, for the provenance.

    Convert copies such values as they are (it does not judge values it does not transform, and a
    real checkpoint may hold them, e.g. in rows of an embedding no token uses); recorded here, they
    let `verify` tell them from damage done to the package afterwards.
    """
    import numpy as np

    from ascendconv.io.safetensors import NUMPY_DTYPES

    counts = {}
    for tensor in plan.tensors:
        entry = source.tensors[tensor.source]
        if tensor.kind not in (OutputKind.COPY, OutputKind.BIAS_F32) or entry.nbytes == 0:
            continue
        count = 0
        for start in range(0, entry.nbytes, COPY_CHUNK_BYTES):
            data = source.reader.map_range(entry, start, min(COPY_CHUNK_BYTES, entry.nbytes - start))
            if tensor.kind is OutputKind.BIAS_F32:  # counted as written: a cast to F32 can overflow to Inf
                data = np.frombuffer(data, NUMPY_DTYPES[entry.dtype]).astype(np.float32)
            count += nonfinite_count(data, tensor.dtype)
        if count:
            counts[tensor.name] = count
    return counts


def copied_file_digests(source: SourceCheckpoint, plan: Plan) -> dict[str, str]:
    """sha256 of each source file the package copies (configs, tokenizer: small files)."""
    return {name: sha256_hex(Path(os.path.realpath(source.root / name)).read_bytes()) for name in plan.copied_files}


def write_plan_files(source: SourceCheckpoint, plan: Plan, staging: Path) -> list[str]:
    """The package's files other than shards and provenance; returns their names."""
    written = [DESCRIPTION_NAME]
    dump_json(staging / DESCRIPTION_NAME, plan.description())
    index = plan.index()
    if index is not None:
        dump_json(staging / INDEX_NAME, index)
        written.append(INDEX_NAME)
    for name in plan.copied_files:
        if name == "config.json":
            dump_json(staging / name, strip_quantization_config(source.config))
        else:
            # the real path was checked to stay inside the source; copy that, not the link
            shutil.copyfile(os.path.realpath(source.root / name), staging / name)
        written.append(name)
    return written


def write_package_files(source: SourceCheckpoint, plan: Plan, staging: Path, provenance: dict, digests: dict) -> None:
    write_plan_files(source, plan, staging)
    dump_json(staging / PROVENANCE_NAME, provenance_document(provenance, digests))


def provenance_document(base: dict, digests: dict[str, str]) -> dict:
    """The provenance file: what `provenance_base` says, and every shard's checksum."""
    return {**base, "shards": {name: {CHECKSUM: digest} for name, digest in sorted(digests.items())}}


def provenance_base(source: SourceCheckpoint, plan: Plan, kernel: str) -> dict:
    """Provenance without the shard checksums: nothing in it depends on the run (time, host, part),
    so a package assembled from parts carries the same file as a one-process conversion."""
    _, location = find_quantization_config(source.config)
    return {
        "tool": "ascendconv",
        "version": __version__,
        "source": {
            "name": source.root.name,
            "quantization_config": location,
            "weight_block_size": list(source.quant.block),
            "files": [
                {"name": h.path.name, "size": h.file_size, "fingerprint": source_fingerprint(h.header_bytes, h.file_size)}
                for h in source.headers
            ],
        },
        "scheme": plan.scheme,
        "scale_rule": plan.scale_rule,
        "resolve_dtype": plan.resolve_dtype,
        "kernel": kernel,
        "fallbacks": [d.to_dict() for d in plan.fallbacks],
        "source_nonfinite": nonfinite_copies(source, plan),
        "checksum": CHECKSUM,
    }
