"""Execute a Plan: stream the source tensor by tensor, re-quantize, write the package.

The door of a conversion: plan, check the output, then let the pipeline (`pipeline.py`) write the
shards and `package_files.py` the files around them. The package is built in a hidden sibling
directory and renamed into place only when complete. Nothing here prints.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ascendconv.ascendv1 import DESCRIPTION_NAME, package_date
from ascendconv.errors import BadOptionError, CopiedFileError, InputError, UnrecognizedCheckpointError, shown
from ascendconv.io.files import file_size, is_text, mapped_reads_guarded
from ascendconv.io.package import refuse_package_as_source
from ascendconv.io.outdir import STAGING_TAG, StagedOutput, check_output, check_output_early, interruptible, stale_siblings
from ascendconv.io.output import check_free_space, output_errors, space_needed
from ascendconv.options import KERNELS, ConvertOptions
from ascendconv.package_files import copied_file_digests, provenance_record, write_package_files, write_plan_files
from ascendconv.parts import PART_MANIFEST_NAME, part_shards, write_part_manifest
from ascendconv.pipeline import Kernel, Notice, Progress, write_shards
from ascendconv.models import heads_problem
from ascendconv.plan import Plan, Planner
from ascendconv.resume import (
    LEDGER_NAME,
    Ledger,
    adopter,
    plan_identity,
    recorded_shards,
    unchanged_shards,
    verify_in_background,
)
from ascendconv.sources import Source, open_source


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


def plan_for(source: Source, options: ConvertOptions) -> Plan:
    plan = Planner.for_source(source, options.deployment).plan(
        scheme=options.scheme,
        scale_rule=options.scale_rule,
        resolve_dtype=options.resolve_dtype,
        overrides=options.overrides,
        max_shard_size=options.max_shard_size,
    )
    package_date()  # a malformed SOURCE_DATE_EPOCH is refused now, not once the shards are written
    check_overrides(plan, options)
    check_deployment(source, plan)
    check_config_carried(source, plan)
    check_shard_names(source)
    return plan


def check_shard_names(source: Source) -> None:
    """The provenance (JSON, UTF-8) records each source shard by name, and verify --source finds the
    shard by it: a name that is not UTF-8 (bytes of another encoding) is refused before anything is written."""
    for header in source.headers:
        if not is_text(header.path.name):
            raise UnrecognizedCheckpointError(
                f"{source.root}: shard {shown(header.path.name)} has a name that is not UTF-8, which the package's "
                "provenance cannot record",
                "rename the shard to a UTF-8 name (and its entries in model.safetensors.index.json, if any)",
            )


def check_config_carried(source: Source, plan: Plan) -> None:
    """config.json the package must carry (vLLM builds the model from it; verify refuses a package
    without it), but one that links out of the source is never carried (it may be any file): refused
    before anything is written."""
    why = plan.skipped_files.get(source.config_path.name)
    if why is not None:
        link = shlex.quote(str(source.config_path))
        raise CopiedFileError(
            f"{source.config_path}: the package needs it (vLLM builds the model from it) but cannot carry it: {why}",
            f"copy the file into the source directory (cp --remove-destination \"$(realpath {link})\" {link}), or "
            "pass the directory that holds the checkpoint's files",
        )


def check_overrides(plan: Plan, options: ConvertOptions) -> None:
    """An --override glob that matches no linear is a typo (model.layer.0.* for model.layers.0.*)
    until the user says it is not."""
    if plan.unmatched_overrides and not options.allow_unmatched_overrides:
        raise BadOptionError(
            f"--override {', '.join(plan.unmatched_overrides)}: matches no linear of the source",
            "check the glob against `ascendconv inspect SRC` (module names such as model.layers.0.mlp.down_proj), or "
            "pass --allow-unmatched-override",
        )


def check_deployment(source: Source, plan: Plan) -> None:
    """A --tp the package could not be served under is refused before anything is written, naming
    the layers (the same rule as verify's `tp` check, which would reject the package)."""
    deployment = plan.deployment
    if deployment.tp == 1:
        return
    # first: heads that do not divide refuse the deployment whatever the weights, and no --override
    # or other type (the split check's hint) would make vLLM serve it
    heads = heads_problem(source.config, deployment.tp)
    if heads:
        why, fix = heads
        raise BadOptionError(f"--tp {deployment.tp}: {why}", fix)
    from ascendconv.verify.checks import CHECKS  # only here: a dry run imports nothing of verify
    from ascendconv.verify.structure import kv_head_count, split_problem

    kv_heads = kv_head_count(source.config)
    problems = []
    for prefix, decision in sorted(plan.decisions.items()):
        if plan.rules.tp_role(prefix) in (None, "replicated"):
            continue
        n, k = decision.shape
        problem = split_problem(prefix, decision.written, n, k, plan.facts[prefix].routed, deployment, kv_heads, plan.rules)
        if problem:
            problems.append(problem)
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise BadOptionError(f"--tp {deployment.tp}: the package could not be served: {shown}", CHECKS["tp"].hint)


def convert(
    src: str | os.PathLike,
    out: str | os.PathLike,
    options: ConvertOptions,
    progress: Progress | None = None,
    dry_run: bool = False,
    notice: Notice | None = None,
    on_shard: Callable[[int, int], None] | None = None,
    inside: tuple[int, int] | None = None,
) -> ConvertResult:
    """`on_shard(closed, count)` is told as each of the run's shards is finished (a CI heartbeat).
    `inside`: the identity OUT's directory must have, which is never made (a --ray task's: its run's
    staging; see StagedOutput)."""
    started = time.perf_counter()
    out = Path(out)
    with interruptible(out):
        marker = PART_MANIFEST_NAME if options.part else DESCRIPTION_NAME
        check = lambda: check_output(out, Path(src), options.overwrite, marker)  # noqa: E731
        check_output_early(out, check)  # before a header is read: a dry run's too (it says what the run would refuse)
        try:
            source = open_source(src)
        except InputError:
            # a package's own files in a source that opens are stray copies (left out, see plan.py), but
            # a package given as SRC fails to open as a source: say what it is instead
            refuse_package_as_source(Path(src))
            raise
        try:
            plan = plan_for(source, options)
            wanted = part_shards(plan, options.part)
            if options.kernel not in KERNELS:
                raise BadOptionError(f"unknown kernel {options.kernel!r}", f"choose one of {', '.join(KERNELS)}")
            if dry_run:  # no kernel: importing (let alone compiling) one is most of a dry run's time
                return ConvertResult(out, plan, options.kernel, time.perf_counter() - started, True, {}, 0, part=options.part)
            kernel = Kernel(options.kernel)
            with mapped_reads_guarded():  # the provenance counts NaN/Inf in copied tensors, read mapped
                provenance = provenance_record(source, plan, kernel.name, options)
            identity = plan_identity(provenance.base(), plan, options, copied_file_digests(source, plan))
            check_free_space(out, space_to_write(source, plan, wanted, out, options.resume))
            kernel.prepare(plan, source, notice)
            adopt = adopter(identity, out, options.overwrite) if options.resume else None
            workers = worker_count(options.workers)
            closed = shard_counter(len(wanted), on_shard)
            staged_output = StagedOutput(out, check, adopt, LEDGER_NAME, notice, inside)
            # output_errors twice: outside for the staging's own set-up, inside so that a write error is
            # named before the staging's clean-up adds where kept work is (--resume)
            with output_errors(out), mapped_reads_guarded(), staged_output as staged, output_errors(out), closed_on_failure(source):
                if options.resume:
                    digests, reads, reused = resume_shards(
                        source, plan, kernel, staged, workers, progress, wanted, identity, closed
                    )
                else:
                    reused = {}
                    digests, reads = write_shards(source, plan, kernel, staged.staging, workers, progress, wanted, closed)
                if options.part:
                    small_files = write_plan_files(source, plan, staged.staging, provenance)
                    write_part_manifest(staged.staging, identity, options.part, digests, small_files, reads)
                else:
                    write_package_files(source, plan, staged.staging, provenance, digests, reads)
                bytes_written = sum((staged.staging / name).stat().st_size for name in digests)
                staged.publish()
            seconds = time.perf_counter() - started
            return ConvertResult(out, plan, kernel.name, seconds, False, digests, bytes_written, sorted(reused), options.part)
        finally:
            source.close()


@contextlib.contextmanager
def closed_on_failure(source: Source) -> Iterator[None]:
    """Close the source's files as soon as the block fails, before the staging is removed: out of
    descriptors (ulimit -n), removing it needs the ones the source holds, and it was left behind."""
    try:
        yield
    except BaseException:
        source.close()
        raise


def shard_counter(count: int, on_shard: Callable[[int, int], None] | None) -> Callable[[str, str, str], None]:
    """An `on_closed(file, checksum, reads)` for the pipeline that tells `on_shard` how many are finished."""
    closed = 0

    def on_closed(file: str, checksum: str, reads: str) -> None:
        nonlocal closed
        closed += 1
        if on_shard:
            on_shard(closed, count)

    return on_closed


def worker_count(requested: int) -> int:
    """Conversion threads: the cores this process may use, or fewer if asked. More threads than
    cores add no speed, only chunks in flight (the pipeline holds a few per worker)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(requested, cores) if requested > 0 else cores


def space_to_write(source: Source, plan: Plan, wanted: list[int], out: Path, resume: bool) -> int:
    """Bytes the run will add at most (see io.output.space_needed): the wanted shards (all, or a
    part's) and the small files, less what kept work of an earlier --resume run already holds."""
    copied = sum(file_size(source.root / name) for name in plan.copied_files)
    tensors = [t for i in wanted for t in plan.shards[i].tensors]
    needed = space_needed([t.name for t in tensors], sum(t.nbytes for t in tensors), copied)
    if resume:
        needed -= sum(kept_bytes(staging) for staging in stale_siblings(out) if STAGING_TAG in staging.name)
    return max(needed, 0)


def kept_bytes(staging: Path) -> int:
    """Bytes of the regular files in a staging directory, read before OUT's lock is taken: another
    run may be writing it, or rename it into place or remove it meanwhile (then what is gone counts 0)."""
    total = 0
    try:
        entries = list(staging.iterdir())
    except OSError:
        return 0
    for path in entries:
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def resume_shards(
    source: Source,
    plan: Plan,
    kernel: Kernel,
    staged: StagedOutput,
    workers: int,
    progress: Progress | None,
    wanted: list[int],
    identity: dict,
    on_closed: Callable[[str, str, str], None],
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Write the wanted shards that an adopted staging does not record as finished, recording each
    as it closes, while the recorded ones are re-read in the background; a recorded shard whose
    checksum no longer matches is written after. Returns (every wanted shard's checksum, the
    digest of the source bytes each was made from (the ledger's, for a kept one), reused)."""
    staging = staged.staging
    recorded = recorded_shards(staging, [plan.shards[i].file for i in wanted]) if staged.resumed else {}
    ledger = Ledger(staging, identity, recorded)
    trusted = unchanged_shards(staging, recorded)
    verified = verify_in_background(staging, {n: e["digest"] for n, e in recorded.items() if n not in trusted})
    todo = [i for i in wanted if plan.shards[i].file not in recorded]

    def record(file: str, checksum: str, reads: str) -> None:
        ledger.record(file, checksum, reads)
        on_closed(file, checksum, reads)

    digests, reads = write_shards(source, plan, kernel, staging, workers, progress, todo, record)
    reused = {**trusted, **verified()}
    again = [i for i in wanted if plan.shards[i].file in recorded and plan.shards[i].file not in reused]
    for i in again:
        ledger.forget(plan.shards[i].file)
        (staging / plan.shards[i].file).unlink(missing_ok=True)
    if again:
        digests_again, reads_again = write_shards(source, plan, kernel, staging, workers, progress, again, record)
        digests.update(digests_again)
        reads.update(reads_again)
    kept_reads = {name: recorded[name]["reads"] for name in reused}
    return {**reused, **digests}, {**kept_reads, **reads}, reused

