"""convert --ray: the parts of one plan as Ray tasks, then assemble, all inside one staged output.

The nodes must share the filesystem of SRC and OUT (the tasks read SRC and write their parts inside
OUT's staging directory by path). Each task is `convert --part I/N --resume` into a hidden part
directory of the staging; a task that fails is retried by Ray (`max_retries`) and its retry reuses the
shards the failed attempt finished. When every part is done, the parts are checked and linked into
the package exactly as `assemble` does, the part directories removed and the package published. A
part that keeps failing fails the run with its error, and nothing is left at OUT. Ray is imported
only here, and only when asked for.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import replace
from pathlib import Path

from ascendconv.assemble import assemble_into, checked_parts
from ascendconv.convert import ConvertOptions, ConvertResult, convert, plan_for, space_to_write
from ascendconv.pipeline import Kernel, Progress
from ascendconv.errors import AscendconvError, PartFailedError, RayCapacityError, RayMissingError, RayUnreachableError, plural
from ascendconv.io.outdir import StagedOutput, as_interrupt, check_output, check_output_early, interruptible, signals_kept
from ascendconv.io.output import check_free_space, output_errors
from ascendconv.options import RayOptions
from ascendconv.parts import check_part_count
from ascendconv.ascendv1 import DESCRIPTION_NAME
from ascendconv.plan import OutputKind, Plan
from ascendconv.sources import Source, open_source

PROGRESS_EVERY = 0.25  # seconds between a task's progress reports


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise RayMissingError("--ray needs Ray, which is not installed in this environment") from exc
    return ray


def source_bytes(source: Source, plan: Plan) -> int:
    """The source bytes a whole conversion reads (what the progress bar counts)."""
    return sum(source.tensors[t.source].nbytes for t in plan.tensors if t.kind is not OutputKind.MX_SCALE)


CONNECT_SECONDS = 10.0  # to reach the head node named by --ray-address before Ray is asked to


def part_count(ray, plan: Plan, options: RayOptions) -> int:
    if options.parts:
        check_part_count(options.parts, len(plan.shards), f"--ray-parts {options.parts}")
        return options.parts
    slots = int(ray.cluster_resources().get("CPU", 1) // max(options.cpus_per_task, 1))
    return max(1, min(len(plan.shards), slots))


def check_reachable(options: RayOptions) -> None:
    """A head node named by HOST:PORT must answer within CONNECT_SECONDS: Ray itself retries an
    unreachable address for minutes, deaf to SIGTERM."""
    endpoint = options.endpoint
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise RayUnreachableError(
            f"--ray-address {options.address}: cannot reach {endpoint[0]} port {endpoint[1]} ({reason} within "
            f"{CONNECT_SECONDS:g} s)"
        ) from None


def start_ray(ray, options: RayOptions) -> None:
    check_reachable(options)
    try:
        with signals_kept():  # Ray's driver installs a SIGTERM handler of its own; ours stay
            ray.init(address=options.address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, TimeoutError, RuntimeError) as exc:
        raise RayUnreachableError(f"Ray at {options.address or 'a new local instance'}: {exc}") from None


def check_placeable(ray, options: RayOptions) -> None:
    """A task asks for cpus_per_task CPUs of one node: if no node has that many, Ray would wait for
    one for ever, in silence."""
    largest = max((node.get("Resources", {}).get("CPU", 0) for node in ray.nodes() if node.get("Alive")), default=0)
    if largest < options.cpus_per_task:
        raise RayCapacityError(
            f"--ray-cpus {options.cpus_per_task}: no node of the Ray cluster has that many CPUs (the largest has "
            f"{largest:g}), so no task could ever start"
        )


class ProgressBoard:
    """A Ray actor: the latest (done, total) of each part, summed for the driver's one progress bar."""

    def __init__(self):
        self.parts: dict[int, int] = {}

    def update(self, number: int, done: int) -> None:
        self.parts[number] = done

    def done(self) -> int:
        return sum(self.parts.values())


def convert_part(
    src: str, directory: str, options: ConvertOptions, board, number: int, staging: tuple[int, int]
) -> list[str]:
    """One Ray task: convert one part into the run's staging directory, whose identity is `staging`
    (a task starting once that run has ended writes nothing); report progress to `board` at most
    every PROGRESS_EVERY s. Returns the shards it reused from a failed attempt of the same part."""
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if board is not None and (now - last[0] >= PROGRESS_EVERY or done == total):
            last[0] = now
            board.update.remote(number, done)

    return convert(src, directory, options, report, inside=staging).reused_shards


def convert_on_ray(
    src: str | os.PathLike, out: str | os.PathLike, options: ConvertOptions, ray_options: RayOptions,
    progress: Progress | None = None,
) -> ConvertResult:
    ray = import_ray()
    started = time.perf_counter()
    out = Path(out).absolute()
    root = Path(src).absolute()
    check = lambda: check_output(out, root, options.overwrite, DESCRIPTION_NAME)  # noqa: E731
    check_output_early(out, check)  # before a header is read and Ray is started, as convert's
    source = open_source(src)
    try:
        plan = plan_for(source, options)
        Kernel(options.kernel)  # an unknown kernel fails here, not in every task
        total = source_bytes(source, plan)
        check_free_space(out, space_to_write(source, plan, list(range(len(plan.shards))), out, False))
    finally:
        source.close()
    started_ray = not ray.is_initialized()
    # our SIGTERM / SIGINT handling from the start: Ray's own would exit 1 (or 134) with its dump
    with interruptible(out):
        if started_ray:
            start_ray(ray, ray_options)
        try:
            check_placeable(ray, ray_options)
            count = part_count(ray, plan, ray_options)
            with output_errors(out), StagedOutput(out, check) as staged:
                directories = [staged.staging / f".part-{i}-of-{count}" for i in range(1, count + 1)]
                reused = run_parts(
                    ray, root, staged.staging_identity, directories, options, ray_options, total, progress, not started_ray
                )
                checked = checked_parts(directories, options.workers)
                parts = checked.parts
                bytes_written, _ = assemble_into(staged.staging, parts, checked.identities)
                for leftover in staged.staging.glob(".*"):  # the parts (their shards are linked) and their locks
                    shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
                staged.publish()
        finally:
            if started_ray:
                ray.shutdown()
    digests = {name: digest for part in parts for name, digest in part.manifest["shards"].items()}
    seconds = time.perf_counter() - started
    return ConvertResult(out, plan, options.kernel, seconds, False, digests, bytes_written, sorted(reused))


def run_parts(
    ray, root: Path, staging: tuple[int, int], directories: list[Path], options: ConvertOptions,
    ray_options: RayOptions, total: int, progress: Progress | None, cancel_on_failure: bool = True,
) -> list[str]:
    """Run part 1..N as Ray tasks, into `directories` in the staging whose identity is `staging`;
    when all succeeded, return the shards retries reused; raise the
    first failure's error. On a failure the tasks still pending are cancelled where they outlive
    us (`cancel_on_failure`: a cluster we joined); a Ray we started stops them as it shuts down,
    and cancelling them first races that shutdown (Ray's core worker then aborts the process)."""
    count = len(directories)
    board = ray.remote(num_cpus=0)(ProgressBoard).remote() if progress else None
    task = ray.remote(convert_part).options(
        num_cpus=ray_options.cpus_per_task, max_retries=ray_options.max_retries, retry_exceptions=True
    )
    part_options = [
        replace(options, part=(i, count), resume=True, overwrite=False, workers=ray_options.cpus_per_task)
        for i in range(1, count + 1)
    ]
    refs = {
        task.remote(str(root), str(d), o, board, i, staging): i for i, (d, o) in enumerate(zip(directories, part_options), 1)
    }
    pending = list(refs)
    reused: list[str] = []
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=PROGRESS_EVERY)
            for ref in ready:
                reused += _result_of(ray, ref, refs[ref], count, ray_options.max_retries)
            if progress:
                progress(min(ray.get(board.done.remote()), total), total)
    except BaseException as exc:
        for ref in pending if cancel_on_failure else ():
            ray.cancel(ref, force=True)
        if isinstance(exc, KeyboardInterrupt):
            raise as_interrupt(exc) from None
        raise
    if progress:
        progress(total, total)
    return reused


def _result_of(ray, ref, number: int, count: int, retries: int) -> list[str]:
    failed = f"part {number}/{count} failed {plural(retries + 1, 'time')}"
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, AscendconvError):
            raise cause from None
        raise PartFailedError(f"{failed}; last: {cause or exc}") from None
    except ray.exceptions.RayError as exc:
        raise PartFailedError(f"{failed}; last: {exc}") from None
